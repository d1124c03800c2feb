"""MPI reduction operations over colls' `Op`: the built-ins, MAXLOC/MINLOC, and `Op.Create`.

colls combines `left ∘ right` with the lower-ranked operand on the left; MPI's user functions
compute `inoutbuf = inbuf ∘ inoutbuf` with the lower-ranked data in `inbuf`, so a user function is
called with `left` as `inbuf` and a copy of `right` as `inoutbuf` (MPI-4.1 §6.9.5).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from algorithms import ops as colls_ops

from . import buffers
from .datatypes import Datatype
from .handles import StateHandle

_MAX_USER_OPS = 32   # MPI implementations (and mpi4py's registry) hold 32 user operations per process
_registry = threading.local()   # per thread: ranks may be threads of one process (colls.compat.spawn)


def _slots() -> list[object | None]:
    if not hasattr(_registry, "slots"):
        _registry.slots = [None] * (1 + _MAX_USER_OPS)
    return _registry.slots


class _Bytes(np.ndarray):
    """The bytes a user operation gets (mpi4py's MPI.buffer): assigning a buffer to a slice copies
    its bytes, whatever its element type (`inoutbuf[:] = array.array("i", ...)`)."""

    def __setitem__(self, key: object, value: object) -> None:
        if not isinstance(value, (int, np.integer)):
            try:
                value = np.frombuffer(memoryview(value), np.uint8)   # type: ignore[arg-type]
            except (TypeError, ValueError):
                pass
        super().__setitem__(key, value)


class _State:
    """What an operation handle refers to."""

    def __init__(self, name: str, handle: int, colls_op: colls_ops.Op | None = None,
                 function: Callable | None = None, commute: bool = True,
                 python: Callable[[Any, Any], Any] | None = None) -> None:
        self.name, self.handle = name, handle
        self.colls_op, self.function, self.commute, self.python = colls_op, function, commute, python
        self.per_datatype: dict[int, colls_ops.Op] = {}


_NULL = _State("OP_NULL", 0)


class Op(StateHandle):
    """An MPI reduction operation handle; `for_datatype` gives the colls `Op` that runs it.

    Args:
        op: another handle to copy (None: MPI.OP_NULL).

    Raises:
        TypeError: `op` is not an Op.
    """

    def __init__(self, op: Op | None = None) -> None:
        if op is not None and not isinstance(op, Op):
            raise TypeError(f"Op(): expecting an Op, got {type(op).__name__}")
        self._s: _State = _NULL if op is None else op._s
        self._user = op is not None and op._user   # whether this handle may pickle/call its function

    @classmethod
    def _of(cls, state: _State, user: bool = False) -> Op:
        handle = cls.__new__(cls)
        handle._s, handle._user = state, user
        return handle

    def __repr__(self) -> str:
        return f"<colls.compat.MPI.Op {self._s.name}>"

    def __bool__(self) -> bool:
        return self._s is not _NULL

    def __reduce__(self) -> tuple:
        if self.is_predefined:
            named = _NAMED[self._s.name]
            return (_named, (self._s.name,)) if self is named else (Op, (named,))
        if not self._user or self._s.function is None:
            raise ValueError("cannot pickle user-defined reduction operation")
        return (type(self).Create, (self._s.function, self._s.commute))

    @classmethod
    def fromint(cls, arg: int) -> Op:
        """The operation of an integer handle (a user operation's copy cannot be pickled).

        Raises:
            ValueError: no operation has that handle.
        """
        for named in _NAMED.values():
            if named._s.handle == arg:
                return named
        for state in _slots():
            if isinstance(state, _State) and state.handle == arg:
                return cls._of(state)
        raise ValueError(f"Op.fromint: no operation has handle {arg}")

    fromhandle = f2py = fromint

    @classmethod
    def Create(cls, function: Callable, commute: bool = False) -> Op:
        """A user operation: `function(inbuf, inoutbuf, datatype)` stores `inbuf ∘ inoutbuf` in `inoutbuf`.

        Raises:
            TypeError: `function` is not callable.
            RuntimeError: 32 user operations exist already (Free some).
        """
        if not callable(function):
            raise TypeError(f"Op.Create: expecting a callable, got {type(function).__name__}")
        slots = _slots()
        try:
            slot = slots.index(None, 1)
        except ValueError:
            raise RuntimeError("cannot create too many user-defined reduction operations (32)") from None
        state = _State(getattr(function, "__name__", "user_op"), 1000 + slot, function=function,
                       commute=bool(commute))
        slots[slot] = state
        return cls._of(state, user=True)

    def Free(self) -> None:
        """Release a user operation (its slot among the 32); this handle becomes MPI.OP_NULL.

        Raises:
            ValueError: `self` is MPI.OP_NULL.
        """
        if self.is_predefined:
            if self._s is _NULL:
                raise ValueError("Op.Free: the operation is MPI.OP_NULL")
            return
        slots = _slots()
        if self._s in slots:
            slots[slots.index(self._s)] = None
        self._s, self._user = _NULL, False

    free = Free

    def Is_commutative(self) -> bool:
        """Whether operands may be combined in any order."""
        return self._s.commute

    @property
    def is_commutative(self) -> bool:
        """Whether operands may be combined in any order."""
        return self._s.commute

    def Is_predefined(self) -> bool:
        """Whether this is one of MPI's built-in operations (or MPI.OP_NULL)."""
        return self._s.function is None

    @property
    def is_predefined(self) -> bool:
        """Whether this is one of MPI's built-in operations (or MPI.OP_NULL)."""
        return self._s.function is None

    def for_datatype(self, datatype: Datatype) -> colls_ops.Op:
        """The colls operator for elements of `datatype`.

        Raises:
            ValueError: the operation is MPI.OP_NULL (or was freed).
        """
        state = self._s
        if state.colls_op is not None:
            return state.colls_op
        if state.function is None:
            raise ValueError(f"{state.name}: the operation is MPI.OP_NULL or was freed")
        key = id(datatype)
        if key not in state.per_datatype:
            function = state.function

            def combine(left: np.ndarray, right: np.ndarray) -> np.ndarray:
                result = np.array(right, copy=True)
                inbuf = np.ascontiguousarray(left).reshape(-1).view(np.uint8).view(_Bytes)
                inbuf.flags.writeable = False
                function(inbuf, result.reshape(-1).view(np.uint8).view(_Bytes), datatype)
                return result

            state.per_datatype[key] = colls_ops.Op(combine, state.commute, state.name)
        return state.per_datatype[key]

    def Reduce_local(self, inbuf: object, inoutbuf: object) -> None:
        """`inoutbuf = inbuf ∘ inoutbuf` on this rank, element by element."""
        source = buffers.simple(inbuf, writable=False)
        target = buffers.simple(inoutbuf, writable=True)
        buffers.same_shape(source, target, "Reduce_local")
        op = self.for_datatype(target.datatype)
        op.check(target.datatype.basic)
        accumulator = target.typed()
        op.into_right(accumulator, source.typed())
        target.received()

    def __call__(self, x: object, y: object) -> object:
        """`x ∘ y` with the meaning mpi4py gives Python objects (a user operation is called as
        `function(x, y, None)`); two numpy arrays combine element by element.

        Raises:
            ValueError: the operation is MPI.OP_NULL.
        """
        state = self._s
        if state.colls_op is not None and isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
            out = np.empty(np.broadcast_shapes(x.shape, y.shape), np.result_type(x, y))
            state.colls_op.combine(x, y, out)   # numpy arrays: element by element, as on buffers
            return out
        if state.python is not None:
            return state.python(x, y)
        if state.function is not None:
            return state.function(x, y, None)
        raise ValueError("cannot call user-defined operation")


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


def _maxloc(x: Any, y: Any) -> Any:
    (u, i), (v, j) = x, y
    return (u, i) if u > v else (v, j) if v > u or j < i else (u, i)


def _minloc(x: Any, y: Any) -> Any:
    (u, i), (v, j) = x, y
    return (u, i) if u < v else (v, j) if v < u or j < i else (u, i)


NUMERIC, BITWISE = colls_ops.NUMERIC, colls_ops.BITWISE
_BUILTIN: dict[str, tuple[colls_ops.Op, Callable[[Any, Any], Any], bool]] = {
    "MAX": (colls_ops.MAX, lambda x, y: y if y > x else x, True),
    "MIN": (colls_ops.MIN, lambda x, y: y if y < x else x, True),
    "SUM": (colls_ops.SUM, lambda x, y: x + y, True),
    "PROD": (colls_ops.PROD, lambda x, y: x * y, True),
    "LAND": (colls_ops.Op(_logical(np.logical_and), True, "LAND", NUMERIC), lambda x, y: bool(x) & bool(y),
             True),
    "BAND": (colls_ops.BAND, lambda x, y: x & y, True),
    "LOR": (colls_ops.Op(_logical(np.logical_or), True, "LOR", NUMERIC), lambda x, y: bool(x) | bool(y),
            True),
    "BOR": (colls_ops.BOR, lambda x, y: x | y, True),
    "LXOR": (colls_ops.Op(_logical(np.logical_xor), True, "LXOR", NUMERIC), lambda x, y: bool(x) ^ bool(y),
             True),
    "BXOR": (colls_ops.BXOR, lambda x, y: x ^ y, True),
    "MAXLOC": (colls_ops.Op(_location(np.greater), True, "MAXLOC"), _maxloc, True),
    "MINLOC": (colls_ops.Op(_location(np.less), True, "MINLOC"), _minloc, True),
    "REPLACE": (colls_ops.Op(lambda left, right: right.copy(), False, "REPLACE"), lambda x, y: y, False),
    "NO_OP": (colls_ops.Op(lambda left, right: left.copy(), False, "NO_OP"), lambda x, y: x, False),
}
_NAMED: dict[str, Op] = {"OP_NULL": Op._of(_NULL)}
_NAMED.update({name: Op._of(_State(name, handle, colls_op, None, commute, python))
               for handle, (name, (colls_op, python, commute)) in enumerate(_BUILTIN.items(), 1)})


def _named(name: str) -> Op:
    """The predefined operation `name` (what a pickled one loads as)."""
    return _NAMED[name]


OP_NULL, MAX, MIN, SUM, PROD = (_NAMED[n] for n in ("OP_NULL", "MAX", "MIN", "SUM", "PROD"))
LAND, BAND, LOR, BOR, LXOR, BXOR = (_NAMED[n] for n in ("LAND", "BAND", "LOR", "BOR", "LXOR", "BXOR"))
MAXLOC, MINLOC, REPLACE, NO_OP = (_NAMED[n] for n in ("MAXLOC", "MINLOC", "REPLACE", "NO_OP"))
