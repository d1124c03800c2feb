"""MPI's predefined datatypes as numpy dtypes: `MPI.INT` is `np.intc`, `MPI.DOUBLE_INT` a C struct.

Only predefined (contiguous) types exist here; the constructors of derived datatypes raise
`NotImplementedError`, since colls moves flat buffers only.
"""

from __future__ import annotations

import numpy as np

UNDEFINED = -32766   # MPICH's value, so scripts that print it see the familiar number


class Datatype:
    """A predefined MPI datatype: a name and the numpy dtype of one element."""

    def __init__(self, name: str, dtype: object = None) -> None:
        self.name = name
        self.dtype: np.dtype | None = None if dtype is None else np.dtype(dtype)

    def __repr__(self) -> str:
        return f"<colls.compat.MPI.Datatype {self.name}>"

    def __bool__(self) -> bool:
        return self.dtype is not None

    @property
    def size(self) -> int:
        """Bytes of data in one element."""
        return 0 if self.dtype is None else self.dtype.itemsize

    @property
    def extent(self) -> int:
        """Bytes from one element to the next (the size: predefined types have no holes at the ends)."""
        return self.size

    lb = 0

    @property
    def ub(self) -> int:
        """Upper bound in bytes (the extent: the lower bound is 0)."""
        return self.extent

    def Get_size(self) -> int:
        """Bytes of data in one element."""
        return self.size

    def Get_extent(self) -> tuple[int, int]:
        """(lower bound, extent) in bytes."""
        return (0, self.extent)

    def Get_true_extent(self) -> tuple[int, int]:
        """(true lower bound, true extent) in bytes."""
        return (0, self.extent)

    def Get_name(self) -> str:
        """The type's MPI name, such as MPI_DOUBLE."""
        return f"MPI_{self.name}"

    def Commit(self) -> Datatype:
        """Nothing to do for a predefined type; returns the type, as mpi4py does."""
        return self

    def Free(self) -> None:
        """Predefined types are never freed; a no-op."""

    def Dup(self) -> Datatype:
        """Predefined types are immutable, so the duplicate is the type itself."""
        return self

    @property
    def is_predefined(self) -> bool:
        """Always true: the facade has no derived types."""
        return True


def _derived(constructor: str):
    def unsupported(*args: object, **kwargs: object) -> Datatype:
        raise NotImplementedError(f"derived datatypes (Datatype.{constructor}) are not supported by the "
                                  f"colls mpi4py facade: pass contiguous buffers of a predefined type")
    unsupported.__name__ = constructor
    unsupported.__doc__ = f"Not supported: derived datatypes ({constructor})."
    return unsupported


for _name in ("Create_contiguous", "Create_vector", "Create_hvector", "Create_indexed", "Create_hindexed",
              "Create_indexed_block", "Create_hindexed_block", "Create_subarray", "Create_darray",
              "Create_resized", "Create_f90_integer", "Create_f90_real", "Create_f90_complex"):
    setattr(Datatype, _name, _derived(_name))
Datatype.Create_struct = staticmethod(_derived("Create_struct"))  # type: ignore[attr-defined]


def _pair(value: str) -> np.dtype:
    """A (value, index) C struct as MAXLOC/MINLOC use it, with C's alignment and padding."""
    return np.dtype([("value", value), ("index", np.intc)], align=True)


_TABLE: dict[str, object] = {
    "DATATYPE_NULL": None, "BYTE": np.uint8, "PACKED": np.uint8, "CHAR": np.byte, "WCHAR": np.uint32,
    "SIGNED_CHAR": np.byte, "UNSIGNED_CHAR": np.ubyte, "SHORT": np.short, "UNSIGNED_SHORT": np.ushort,
    "INT": np.intc, "UNSIGNED": np.uintc, "UNSIGNED_INT": np.uintc, "LONG": "l", "UNSIGNED_LONG": "L",
    "LONG_LONG": np.longlong,
    "UNSIGNED_LONG_LONG": np.ulonglong, "FLOAT": np.single, "DOUBLE": np.double, "LONG_DOUBLE": np.longdouble,
    "C_BOOL": np.bool_, "CXX_BOOL": np.bool_, "INT8_T": np.int8, "INT16_T": np.int16, "INT32_T": np.int32,
    "INT64_T": np.int64, "UINT8_T": np.uint8, "UINT16_T": np.uint16, "UINT32_T": np.uint32,
    "UINT64_T": np.uint64, "AINT": np.intp, "OFFSET": np.int64, "COUNT": np.int64,
    "C_COMPLEX": np.csingle, "C_FLOAT_COMPLEX": np.csingle, "C_DOUBLE_COMPLEX": np.cdouble,
    "C_LONG_DOUBLE_COMPLEX": np.clongdouble, "CXX_FLOAT_COMPLEX": np.csingle,
    "CXX_DOUBLE_COMPLEX": np.cdouble, "CXX_LONG_DOUBLE_COMPLEX": np.clongdouble,
    "CHARACTER": np.byte, "LOGICAL": np.intc, "INTEGER": np.intc, "REAL": np.single,
    "DOUBLE_PRECISION": np.double, "COMPLEX": np.csingle, "DOUBLE_COMPLEX": np.cdouble,
    "SHORT_INT": _pair("h"), "TWOINT": _pair("i"), "LONG_INT": _pair("l"), "FLOAT_INT": _pair("f"),
    "DOUBLE_INT": _pair("d"), "LONG_DOUBLE_INT": _pair("g"),
}

PREDEFINED: dict[str, Datatype] = {name: Datatype(name, dtype) for name, dtype in _TABLE.items()}

# buffer format characters (PEP 3118, as numpy and array.array give them) -> datatype, like mpi4py's
# TypeDict; "B" is MPI_BYTE, as in mpi4py.
TYPE_DICT: dict[str, Datatype] = {
    "?": PREDEFINED["C_BOOL"], "c": PREDEFINED["CHAR"], "b": PREDEFINED["SIGNED_CHAR"],
    "B": PREDEFINED["BYTE"], "h": PREDEFINED["SHORT"], "H": PREDEFINED["UNSIGNED_SHORT"],
    "i": PREDEFINED["INT"], "I": PREDEFINED["UNSIGNED"], "l": PREDEFINED["LONG"],
    "L": PREDEFINED["UNSIGNED_LONG"], "q": PREDEFINED["LONG_LONG"], "Q": PREDEFINED["UNSIGNED_LONG_LONG"],
    "f": PREDEFINED["FLOAT"], "d": PREDEFINED["DOUBLE"], "g": PREDEFINED["LONG_DOUBLE"],
    "F": PREDEFINED["C_FLOAT_COMPLEX"], "D": PREDEFINED["C_DOUBLE_COMPLEX"],
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
