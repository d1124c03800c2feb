"""MPI reduction operations over colls' `Op`: the built-ins, MAXLOC/MINLOC, and `Op.Create`.

colls combines `left ∘ right` with the lower-ranked operand on the left; MPI's user functions
compute `inoutbuf = inbuf ∘ inoutbuf` with the lower-ranked data in `inbuf`, so a user function is
called with `left` as `inbuf` and a copy of `right` as `inoutbuf` (MPI-4.1 §6.9.5).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from algorithms import ops as colls_ops

from . import buffers
from .datatypes import Datatype


class Op:
    """An MPI reduction operation; `for_datatype` gives the colls `Op` that runs it."""

    def __init__(self, name: str, colls_op: colls_ops.Op | None = None, function: Callable | None = None,
                 commute: bool = True) -> None:
        self.name = name
        self._colls_op = colls_op
        self._function = function
        self._commute = commute
        self._per_datatype: dict[int, colls_ops.Op] = {}

    def __repr__(self) -> str:
        return f"<colls.compat.MPI.Op {self.name}>"

    def __bool__(self) -> bool:
        return self._colls_op is not None or self._function is not None

    @classmethod
    def Create(cls, function: Callable, commute: bool = False) -> Op:
        """A user operation: `function(inbuf, inoutbuf, datatype)` stores `inbuf ∘ inoutbuf` in `inoutbuf`."""
        return cls(getattr(function, "__name__", "user_op"), function=function, commute=bool(commute))

    def Free(self) -> None:
        """Release a user operation (nothing is held)."""
        self._function = None if self._colls_op is None else self._function

    def Is_commutative(self) -> bool:
        """Whether operands may be combined in any order."""
        return self._commute

    @property
    def is_commutative(self) -> bool:
        """Whether operands may be combined in any order."""
        return self._commute

    def Is_predefined(self) -> bool:
        """Whether this is one of MPI's built-in operations."""
        return self._function is None

    @property
    def is_predefined(self) -> bool:
        """Whether this is one of MPI's built-in operations."""
        return self._function is None

    def for_datatype(self, datatype: Datatype) -> colls_ops.Op:
        """The colls operator for elements of `datatype`."""
        if self._colls_op is not None:
            return self._colls_op
        if self._function is None:
            raise ValueError(f"{self.name}: the operation is MPI.OP_NULL or was freed")
        key = id(datatype)
        if key not in self._per_datatype:
            function = self._function

            def combine(left: np.ndarray, right: np.ndarray) -> np.ndarray:
                result = np.array(right, copy=True)
                inbuf = memoryview(np.ascontiguousarray(left).reshape(-1).view(np.uint8)).toreadonly()
                function(inbuf, memoryview(result.reshape(-1).view(np.uint8)), datatype)
                return result

            self._per_datatype[key] = colls_ops.Op(combine, self._commute, self.name)
        return self._per_datatype[key]

    def Reduce_local(self, inbuf: object, inoutbuf: object) -> None:
        """`inoutbuf = inbuf ∘ inoutbuf` on this rank, element by element."""
        source = buffers.simple(inbuf, writable=False)
        target = buffers.simple(inoutbuf, writable=True)
        buffers.same_shape(source, target, "Reduce_local")
        op = self.for_datatype(target.datatype)
        op.check(target.datatype.dtype)
        accumulator = target.typed()
        op.into_right(accumulator, source.typed())

    def __call__(self, x: object, y: object) -> object:
        """`x ∘ y` on numpy arrays or scalars (mpi4py applies built-in ops to Python objects too)."""
        if self._function is not None:
            raise NotImplementedError("calling a user Op on Python objects is not supported")
        left, right = np.asarray(x), np.asarray(y)
        out = np.empty(np.broadcast_shapes(left.shape, right.shape), np.result_type(left, right))
        self._colls_op.combine(left, right, out)   # type: ignore[union-attr]
        return out if out.ndim else out[()]


def _logical(ufunc: np.ufunc) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def combine(left: np.ndarray, right: np.ndarray) -> np.ndarray:
        return ufunc(left, right).astype(left.dtype)
    combine.__name__ = ufunc.__name__
    return combine


def _location(better: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    """MAXLOC/MINLOC on (value, index) pairs: the better value, the smaller index on ties."""
    def combine(left: np.ndarray, right: np.ndarray) -> np.ndarray:
        if left.dtype.names != ("value", "index"):
            raise TypeError("MAXLOC/MINLOC need a pair datatype (MPI.DOUBLE_INT, MPI.TWOINT, ...)")
        lv, rv = left["value"], right["value"]
        take_right = better(rv, lv) | ((rv == lv) & (right["index"] < left["index"]))
        return np.where(take_right, right, left)
    return combine


NUMERIC, BITWISE = colls_ops.NUMERIC, colls_ops.BITWISE

SUM = Op("SUM", colls_ops.SUM)
PROD = Op("PROD", colls_ops.PROD)
MAX = Op("MAX", colls_ops.MAX)
MIN = Op("MIN", colls_ops.MIN)
BAND = Op("BAND", colls_ops.BAND)
BOR = Op("BOR", colls_ops.BOR)
BXOR = Op("BXOR", colls_ops.BXOR)
LAND = Op("LAND", colls_ops.Op(_logical(np.logical_and), True, "LAND", NUMERIC))
LOR = Op("LOR", colls_ops.Op(_logical(np.logical_or), True, "LOR", NUMERIC))
LXOR = Op("LXOR", colls_ops.Op(_logical(np.logical_xor), True, "LXOR", NUMERIC))
MAXLOC = Op("MAXLOC", colls_ops.Op(_location(np.greater), True, "MAXLOC"))
MINLOC = Op("MINLOC", colls_ops.Op(_location(np.less), True, "MINLOC"))
REPLACE = Op("REPLACE", colls_ops.Op(lambda left, right: right.copy(), False, "REPLACE"))
NO_OP = Op("NO_OP", colls_ops.Op(lambda left, right: left.copy(), False, "NO_OP"))
OP_NULL = Op("OP_NULL")
