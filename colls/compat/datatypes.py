"""MPI datatypes: the predefined ones as numpy dtypes (`MPI.INT` is `np.intc`, `MPI.DOUBLE_INT` a C
struct) and the derived ones (contiguous, vector, indexed, struct, subarray, resized, ...) as
typemaps (`typemap.Typemap`), with MPI's envelope/contents, `decode` and pickling as mpi4py has them.

A `Datatype` object is a handle: `Datatype(other)` is a second handle to the same type (equal, not
identical), `Free` nulls the handle it is called on. Create_darray is not offered.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

import numpy as np

from . import typemap
from .handles import StateHandle
from .typeinfo import Described

UNDEFINED = -32766   # MPICH's value, so scripts that print it see the familiar number
ORDER_C, ORDER_FORTRAN = 56, 57
ORDER_F = ORDER_FORTRAN
DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_NONE, DISTRIBUTE_DFLT_DARG = 121, 122, 123, -49767
TYPECLASS_REAL, TYPECLASS_INTEGER, TYPECLASS_COMPLEX, TYPECLASS_LOGICAL = 1, 2, 3, 4
COMBINERS = {"NAMED": 1, "DUP": 2, "CONTIGUOUS": 3, "VECTOR": 4, "HVECTOR": 6, "INDEXED": 7,
             "HINDEXED": 9, "INDEXED_BLOCK": 10, "STRUCT": 12, "SUBARRAY": 13, "DARRAY": 14,
             "F90_REAL": 15, "F90_COMPLEX": 16, "F90_INTEGER": 17, "RESIZED": 18,
             "HINDEXED_BLOCK": 19, "VALUE_INDEX": 20}   # MPICH's values
CONSTANTS = {**{f"COMBINER_{name}": value for name, value in COMBINERS.items()},
             "ORDER_C": ORDER_C, "ORDER_FORTRAN": ORDER_FORTRAN, "ORDER_F": ORDER_F,
             "DISTRIBUTE_BLOCK": DISTRIBUTE_BLOCK, "DISTRIBUTE_CYCLIC": DISTRIBUTE_CYCLIC,
             "DISTRIBUTE_NONE": DISTRIBUTE_NONE, "DISTRIBUTE_DFLT_DARG": DISTRIBUTE_DFLT_DARG,
             "TYPECLASS_REAL": TYPECLASS_REAL, "TYPECLASS_INTEGER": TYPECLASS_INTEGER,
             "TYPECLASS_COMPLEX": TYPECLASS_COMPLEX, "TYPECLASS_LOGICAL": TYPECLASS_LOGICAL}
ERR_TYPE = 3
_handles = itertools.count(1)


class _State:
    """What a datatype handle refers to."""

    def __init__(self, name: str, tmap: typemap.Typemap | None, combiner: str = "NAMED",
                 old: Datatype | None = None, params: dict | None = None, dtype: object = None) -> None:
        self.handle = 0 if tmap is None else next(_handles)
        self.name = name                 # the MPI name (Get_name/Set_name)
        self.tmap = tmap
        self.combiner = combiner
        self.old = old                   # the one old type (DUP, CONTIGUOUS, ...), else None
        self.params = params or {}       # decode()'s parameters, `datatypes` included for STRUCT
        self.dtype = None if dtype is None else np.dtype(dtype)   # set for predefined types


_NULL = _State("MPI_DATATYPE_NULL", None)


def type_error(message: str) -> Exception:
    """An MPI.Exception of error class MPI.ERR_TYPE (invalid datatype) saying `message`."""
    from .comm import MPIException

    class DatatypeError(MPIException):
        error_class = property(lambda self: ERR_TYPE, doc="MPI.ERR_TYPE.")

        def Get_error_class(self) -> int:
            return ERR_TYPE

    return DatatypeError(message)


def _ints(values: Sequence[int]) -> list[int]:
    return [operator.index(v) for v in values]


class Datatype(StateHandle, Described):
    """An MPI datatype handle (mpi4py's `MPI.Datatype`).

    Args:
        datatype: another handle to copy (None: MPI.DATATYPE_NULL).

    Raises:
        TypeError: `datatype` is not a Datatype.
    """

    def __init__(self, datatype: Datatype | None = None) -> None:
        if datatype is not None and not isinstance(datatype, Datatype):
            raise TypeError(f"Datatype(): expecting a Datatype, got {type(datatype).__name__}")
        self._s: _State = _NULL if datatype is None else datatype._s

    @classmethod
    def _of(cls, state: _State) -> Datatype:
        handle = cls.__new__(cls)
        handle._s = state
        return handle

    # -- identity ---------------------------------------------------------------------------------

    def __bool__(self) -> bool:
        return self._s.tmap is not None

    def __repr__(self) -> str:
        return f"<colls.compat.MPI.Datatype {self._s.name or self._s.combiner}>"

    @property
    def dtype(self) -> np.dtype | None:
        """The numpy dtype of a predefined type (None for derived types and MPI.DATATYPE_NULL)."""
        return self._s.dtype

    def _map(self) -> typemap.Typemap:
        if self._s.tmap is None:
            raise ValueError("the datatype is MPI.DATATYPE_NULL")
        return self._s.tmap

    # -- size and bounds --------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes of data in one element."""
        return 0 if self._s.tmap is None else self._s.tmap.size

    @property
    def extent(self) -> int:
        """Bytes from one element to the next."""
        return 0 if self._s.tmap is None else self._s.tmap.extent

    @property
    def lb(self) -> int:
        """Lower bound in bytes."""
        return 0 if self._s.tmap is None else self._s.tmap.lb

    @property
    def ub(self) -> int:
        """Upper bound in bytes."""
        return 0 if self._s.tmap is None else self._s.tmap.ub

    @property
    def true_lb(self) -> int:
        """Offset of the first byte of data."""
        return 0 if self._s.tmap is None else self._s.tmap.true_lb

    @property
    def true_ub(self) -> int:
        """Offset just past the last byte of data."""
        return 0 if self._s.tmap is None else self._s.tmap.true_ub

    @property
    def true_extent(self) -> int:
        """true_ub - true_lb."""
        return self.true_ub - self.true_lb

    def Get_size(self) -> int:
        """Bytes of data in one element."""
        return self.size

    def Get_extent(self) -> tuple[int, int]:
        """(lower bound, extent) in bytes."""
        return (self.lb, self.extent)

    def Get_true_extent(self) -> tuple[int, int]:
        """(true lower bound, true extent) in bytes."""
        return (self.true_lb, self.true_extent)

    @property
    def basic(self) -> np.dtype:
        """The one basic element type of the typemap (what reductions operate on).

        Raises:
            ValueError: the typemap mixes basic types, or the type is MPI.DATATYPE_NULL.
        """
        basics = self._map().basics
        if len(basics) != 1:
            raise ValueError(f"{self.Get_name() or 'the derived datatype'} mixes basic types; reduction "
                             "operations need a datatype of one basic type")
        return next(iter(basics))

    def layout(self, count: int) -> typemap.Layout:
        """How `count` elements lie in memory (see `typemap.Layout`)."""
        return self._map().layout(count)

    # -- names and codes --------------------------------------------------------------------------

    def Get_name(self) -> str:
        """The type's MPI name, such as MPI_DOUBLE ('' for derived types)."""
        return self._s.name

    def Set_name(self, name: str) -> None:
        """Set the type's name."""
        self._s.name = str(name)

    name = property(Get_name, Set_name, doc="The type's name.")

    # -- lifetime ---------------------------------------------------------------------------------

    def Commit(self) -> Datatype:
        """Nothing to do (typemaps are ready when built); returns the type, as mpi4py does."""
        return self

    def Free(self) -> None:
        """Null this handle (predefined types stay as they are)."""
        if not self.is_predefined:
            self._s = _NULL

    free = Free

    # -- constructors -----------------------------------------------------------------------------

    def _derive(self, combiner: str, tmap: typemap.Typemap, params: dict, old: bool = True) -> Datatype:
        return type(self)._of(_State("", tmap, combiner, Datatype(self) if old else None, params))

    def Dup(self) -> Datatype:
        """A new type with the same typemap."""
        return self._derive("DUP", self._map(), {})

    Create_dup = Dup

    def Create_contiguous(self, count: int) -> Datatype:
        """`count` elements, one after another."""
        count = _count(count, "count")
        return self._derive("CONTIGUOUS", typemap.blocks([0], [count], self._map()), {"count": count})

    def Create_vector(self, count: int, blocklength: int, stride: int) -> Datatype:
        """`count` blocks of `blocklength` elements, `stride` elements apart."""
        return self._vector("VECTOR", count, blocklength, stride, self.extent)

    def Create_hvector(self, count: int, blocklength: int, stride: int) -> Datatype:
        """`count` blocks of `blocklength` elements, `stride` bytes apart."""
        return self._vector("HVECTOR", count, blocklength, stride, 1)

    def _vector(self, combiner: str, count: int, blocklength: int, stride: int, unit: int) -> Datatype:
        count, blocklength = _count(count, "count"), _count(blocklength, "blocklength")
        stride = operator.index(stride)
        starts = np.arange(count, dtype=np.int64) * (stride * unit)
        tmap = typemap.blocks(starts, np.full(count, blocklength), self._map())
        return self._derive(combiner, tmap, {"count": count, "blocklength": blocklength, "stride": stride})

    def Create_indexed(self, blocklengths: Sequence[int], displacements: Sequence[int]) -> Datatype:
        """Blocks of `blocklengths[i]` elements at `displacements[i]` elements."""
        return self._indexed("INDEXED", blocklengths, displacements, self.extent)

    def Create_hindexed(self, blocklengths: Sequence[int], displacements: Sequence[int]) -> Datatype:
        """Blocks of `blocklengths[i]` elements at `displacements[i]` bytes."""
        return self._indexed("HINDEXED", blocklengths, displacements, 1)

    def _indexed(self, combiner: str, blocklengths, displacements, unit: int) -> Datatype:
        lengths, displs = _ints(blocklengths), _ints(displacements)
        if len(lengths) != len(displs):
            raise ValueError(f"{combiner.lower()}: {len(lengths)} blocklengths but {len(displs)} "
                             "displacements")
        tmap = typemap.blocks(np.array(displs, np.int64) * unit, lengths, self._map())
        return self._derive(combiner, tmap, {"blocklengths": lengths, "displacements": displs})

    def Create_indexed_block(self, blocklength: int, displacements: Sequence[int]) -> Datatype:
        """Blocks of `blocklength` elements at `displacements[i]` elements."""
        return self._block("INDEXED_BLOCK", blocklength, displacements, self.extent)

    def Create_hindexed_block(self, blocklength: int, displacements: Sequence[int]) -> Datatype:
        """Blocks of `blocklength` elements at `displacements[i]` bytes."""
        return self._block("HINDEXED_BLOCK", blocklength, displacements, 1)

    def _block(self, combiner: str, blocklength: int, displacements, unit: int) -> Datatype:
        blocklength, displs = _count(blocklength, "blocklength"), _ints(displacements)
        tmap = typemap.blocks(np.array(displs, np.int64) * unit, [blocklength] * len(displs), self._map())
        return self._derive(combiner, tmap, {"blocklength": blocklength, "displacements": displs})

    @classmethod
    def Create_struct(cls, blocklengths: Sequence[int], displacements: Sequence[int],
                      datatypes: Sequence[Datatype]) -> Datatype:
        """Blocks of `blocklengths[i]` elements of `datatypes[i]` at `displacements[i]` bytes.

        Raises:
            ValueError: the three sequences differ in length.
        """
        lengths, displs = _ints(blocklengths), _ints(displacements)
        types = [lookup(t) for t in datatypes]
        if not len(lengths) == len(displs) == len(types):
            raise ValueError(f"Create_struct: {len(lengths)} blocklengths, {len(displs)} displacements and "
                             f"{len(types)} datatypes")
        groups = [(np.array([d], np.int64), np.array([n], np.int64), t._map())
                  for n, d, t in zip(lengths, displs, types, strict=True)]
        params = {"blocklengths": lengths, "displacements": displs, "datatypes": [Datatype(t) for t in types]}
        return cls._of(_State("", typemap.Typemap(groups, align=True), "STRUCT", None, params))

    def Create_subarray(self, sizes: Sequence[int], subsizes: Sequence[int], starts: Sequence[int],
                        order: int = ORDER_C) -> Datatype:
        """The sub-box `subsizes` at `starts` of an array of shape `sizes` (C or Fortran order).

        Raises:
            ValueError: inconsistent shapes or an unknown order.
        """
        sizes, subsizes, starts = _ints(sizes), _ints(subsizes), _ints(starts)
        if not sizes or not len(sizes) == len(subsizes) == len(starts):
            raise ValueError("Create_subarray: sizes, subsizes and starts must have the same length > 0")
        if any(not (0 <= st and 0 < sub and st + sub <= size)
               for size, sub, st in zip(sizes, subsizes, starts, strict=True)):
            raise ValueError(f"Create_subarray: the box {subsizes} at {starts} is not inside {sizes}")
        if order not in (ORDER_C, ORDER_FORTRAN):
            raise ValueError(f"Create_subarray: order={order!r} is neither MPI.ORDER_C nor MPI.ORDER_FORTRAN")
        tmap = typemap.subarray(sizes, subsizes, starts, order == ORDER_FORTRAN, self._map())
        return self._derive("SUBARRAY", tmap, {"sizes": sizes, "subsizes": subsizes, "starts": starts,
                                               "order": order})

    def Create_darray(self, *args: object, **kwargs: object) -> Datatype:
        """Not supported: distributed-array datatypes."""
        raise NotImplementedError("distributed-array datatypes (Datatype.Create_darray) are not supported "
                                  "by the colls mpi4py facade")

    def Create_resized(self, lb: int, extent: int) -> Datatype:
        """The same data with lower bound `lb` and extent `extent` (bytes)."""
        lb, extent = operator.index(lb), operator.index(extent)
        tmap = typemap.blocks([0], [1], self._map(), bounds=(lb, lb + extent))
        return self._derive("RESIZED", tmap, {"lb": lb, "extent": extent})

    Resized = Create_resized

    @classmethod
    def Get_value_index(cls, value: Datatype, index: Datatype) -> Datatype:
        """The (value, index) pair type MAXLOC/MINLOC use (MPI.DATATYPE_NULL where none is named).

        Raises:
            MPI.Exception: either type is MPI.DATATYPE_NULL (error class MPI.ERR_TYPE).
        """
        if not value or not index:
            raise type_error("Get_value_index: the value or index type is MPI.DATATYPE_NULL")
        for name, (v, i) in _PAIRS.items():
            if PREDEFINED[v] == value and PREDEFINED[i] == index:
                return PREDEFINED[name]
        return PREDEFINED["DATATYPE_NULL"]

    @classmethod
    def Match_size(cls, typeclass: int, size: int) -> Datatype:
        """The predefined Fortran type of `typeclass` (MPI.TYPECLASS_*) and `size` bytes.

        Raises:
            MPI.Exception: no such type (error class MPI.ERR_TYPE).
        """
        prefix = {TYPECLASS_INTEGER: "INTEGER", TYPECLASS_REAL: "REAL", TYPECLASS_COMPLEX: "COMPLEX",
                  TYPECLASS_LOGICAL: "LOGICAL"}.get(typeclass)
        found = PREDEFINED.get(f"{prefix}{size}")
        if found is None or not found:
            raise type_error(f"Match_size: no type of class {typeclass} with {size} bytes")
        return found

    @classmethod
    def Create_f90_integer(cls, r: int) -> Datatype:
        """An integer type with at least `r` decimal digits."""
        size = next(n for n, digits in ((1, 2), (2, 4), (4, 9), (8, 18)) if r <= digits)
        return cls._f90("F90_INTEGER", f"i{size}", {"r": r})

    @classmethod
    def Create_f90_real(cls, p: int, r: int) -> Datatype:
        """A real type with precision `p` and exponent range `r`."""
        return cls._f90("F90_REAL", f"f{_real_size(p, r)}", {"p": p, "r": r})

    @classmethod
    def Create_f90_complex(cls, p: int, r: int) -> Datatype:
        """A complex type whose parts have precision `p` and exponent range `r`."""
        return cls._f90("F90_COMPLEX", f"c{2 * _real_size(p, r)}", {"p": p, "r": r})

    @classmethod
    def _f90(cls, combiner: str, dtype: str, params: dict) -> Datatype:
        kind = np.dtype(np.longdouble if dtype == "f16" else np.clongdouble if dtype == "c32" else dtype)
        return cls._of(_State("", typemap.Typemap(basic=kind), combiner, None, params, kind))


def _real_size(p: int, r: int) -> int:
    return 4 if p <= 6 and r <= 37 else 8 if p <= 15 and r <= 307 else 16


def _count(value: int, what: str) -> int:
    value = operator.index(value)
    if value < 0:
        raise ValueError(f"negative {what} {value}")
    return value


def _pair(value: str) -> np.dtype:
    """A (value, index) C struct as MAXLOC/MINLOC use it, with C's alignment and padding."""
    return np.dtype([("value", value), ("index", np.intc)], align=True)


_PAIRS = {"SHORT_INT": ("SHORT", "INT"), "TWOINT": ("INT", "INT"), "LONG_INT": ("LONG", "INT"),
          "FLOAT_INT": ("FLOAT", "INT"), "DOUBLE_INT": ("DOUBLE", "INT"),
          "LONG_DOUBLE_INT": ("LONG_DOUBLE", "INT")}
_TABLE: dict[str, object] = {
    "DATATYPE_NULL": None, "BYTE": np.uint8, "PACKED": np.uint8, "CHAR": np.byte, "WCHAR": np.uint32,
    "SIGNED_CHAR": np.byte, "UNSIGNED_CHAR": np.ubyte, "SHORT": np.short, "UNSIGNED_SHORT": np.ushort,
    "INT": np.intc, "UNSIGNED": np.uintc, "LONG": "l", "UNSIGNED_LONG": "L", "LONG_LONG": np.longlong,
    "UNSIGNED_LONG_LONG": np.ulonglong, "FLOAT": np.single, "DOUBLE": np.double, "LONG_DOUBLE": np.longdouble,
    "C_BOOL": np.bool_, "CXX_BOOL": np.bool_, "INT8_T": np.int8, "INT16_T": np.int16, "INT32_T": np.int32,
    "INT64_T": np.int64, "UINT8_T": np.uint8, "UINT16_T": np.uint16, "UINT32_T": np.uint32,
    "UINT64_T": np.uint64, "FLOAT16_T": np.float16, "BFLOAT16_T": None, "AINT": np.intp, "OFFSET": np.int64,
    "COUNT": np.int64, "C_COMPLEX": np.csingle, "C_DOUBLE_COMPLEX": np.cdouble,
    "C_LONG_DOUBLE_COMPLEX": np.clongdouble, "CXX_FLOAT_COMPLEX": np.csingle,
    "CXX_DOUBLE_COMPLEX": np.cdouble, "CXX_LONG_DOUBLE_COMPLEX": np.clongdouble,
    "CHARACTER": np.byte, "LOGICAL": np.intc, "INTEGER": np.intc, "REAL": np.single,
    "DOUBLE_PRECISION": np.double, "COMPLEX": np.csingle, "DOUBLE_COMPLEX": np.cdouble,
    "LOGICAL1": None, "LOGICAL2": None, "LOGICAL4": None, "LOGICAL8": None, "LOGICAL16": None,
    "INTEGER1": np.int8, "INTEGER2": np.int16, "INTEGER4": np.int32, "INTEGER8": np.int64, "INTEGER16": None,
    "REAL2": None, "REAL4": np.float32, "REAL8": np.float64, "REAL16": np.longdouble, "COMPLEX4": None,
    "COMPLEX8": np.complex64, "COMPLEX16": np.complex128, "COMPLEX32": np.clongdouble,
    "SHORT_INT": _pair("h"), "TWOINT": _pair("i"), "LONG_INT": _pair("l"), "FLOAT_INT": _pair("f"),
    "DOUBLE_INT": _pair("d"), "LONG_DOUBLE_INT": _pair("g"),
}
_ALIASES = {"UNSIGNED_INT": "UNSIGNED", "SIGNED_SHORT": "SHORT", "SIGNED_INT": "INT", "SIGNED_LONG": "LONG",
            "SIGNED_LONG_LONG": "LONG_LONG", "BOOL": "C_BOOL", "SINT8_T": "INT8_T", "SINT16_T": "INT16_T",
            "SINT32_T": "INT32_T", "SINT64_T": "INT64_T", "F_BOOL": "LOGICAL", "F_INT": "INTEGER",
            "F_FLOAT": "REAL", "F_DOUBLE": "DOUBLE_PRECISION", "F_COMPLEX": "COMPLEX",
            "F_FLOAT_COMPLEX": "COMPLEX", "F_DOUBLE_COMPLEX": "DOUBLE_COMPLEX", "INT_INT": "TWOINT",
            "C_FLOAT_COMPLEX": "C_COMPLEX", "FLOAT32_T": "FLOAT", "FLOAT64_T": "DOUBLE"}
_MPI_NAMES = {"TWOINT": "MPI_2INT", "LONG_LONG": "MPI_LONG_LONG_INT", "FLOAT16_T": "MPIX_C_FLOAT16"}

def _named_state(name: str, dtype: object) -> _State:
    if dtype is None:   # MPI.DATATYPE_NULL, and the types MPICH does not have (LOGICAL1, REAL2, ...)
        return _NULL
    kind = np.dtype(dtype)
    return _State(_MPI_NAMES.get(name, f"MPI_{name}"), typemap.Typemap(basic=kind), dtype=kind)


PREDEFINED: dict[str, Datatype] = {name: Datatype._of(_named_state(name, dtype))
                                   for name, dtype in _TABLE.items()}
NAMED_BY_STATE: dict[int, str] = {id(handle._s): name for name, handle in reversed(PREDEFINED.items())}
PREDEFINED.update({alias: PREDEFINED[name] for alias, name in _ALIASES.items()})
BY_CODE: dict[str, Datatype] = {}
for _handle in PREDEFINED.values():
    if _handle and _handle.typechar != "V":
        BY_CODE.setdefault(_handle.typechar, _handle)
        BY_CODE.setdefault(_handle.typestr, _handle)

# buffer format characters (PEP 3118, as numpy and array.array give them) -> datatype, like mpi4py's
# TypeDict; "B" is MPI_BYTE, as in mpi4py.
TYPE_DICT: dict[str, Datatype] = {
    "?": PREDEFINED["C_BOOL"], "c": PREDEFINED["CHAR"], "b": PREDEFINED["SIGNED_CHAR"],
    "B": PREDEFINED["BYTE"], "h": PREDEFINED["SHORT"], "H": PREDEFINED["UNSIGNED_SHORT"],
    "i": PREDEFINED["INT"], "I": PREDEFINED["UNSIGNED"], "l": PREDEFINED["LONG"],
    "L": PREDEFINED["UNSIGNED_LONG"], "q": PREDEFINED["LONG_LONG"], "Q": PREDEFINED["UNSIGNED_LONG_LONG"],
    "e": PREDEFINED["FLOAT16_T"], "f": PREDEFINED["FLOAT"], "d": PREDEFINED["DOUBLE"],
    "g": PREDEFINED["LONG_DOUBLE"], "F": PREDEFINED["C_FLOAT_COMPLEX"], "D": PREDEFINED["C_DOUBLE_COMPLEX"],
    "G": PREDEFINED["C_LONG_DOUBLE_COMPLEX"], "Zf": PREDEFINED["C_FLOAT_COMPLEX"],
    "Zd": PREDEFINED["C_DOUBLE_COMPLEX"], "Zg": PREDEFINED["C_LONG_DOUBLE_COMPLEX"],
}


def lookup(key: object) -> Datatype:
    """A `Datatype` itself, or the one a format string such as "i" or "Zd" names."""
    if isinstance(key, Datatype):
        return key
    if isinstance(key, str):
        stripped = key.lstrip("@=<>!")
        if stripped in TYPE_DICT:
            return TYPE_DICT[stripped]
    raise KeyError(f"cannot map {key!r} to MPI datatype")


def for_dtype(dtype: np.dtype) -> Datatype:
    """The predefined datatype of a numpy dtype (by its character code, as mpi4py infers it)."""
    if dtype.byteorder not in "=|" and dtype.byteorder != ("<" if np.little_endian else ">"):
        raise BufferError(f"format with non-native byte order ({dtype}) is not supported")
    return lookup(dtype.char)
