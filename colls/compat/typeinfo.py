"""What a datatype says about itself, as mpi4py has it: envelope and contents (MPICH's large-count
layout), `decode`, type codes (`typechar`, `typestr`, `tocode`/`fromcode`) and pickling.

`Described` is a mixin of `datatypes.Datatype`: it reads the handle's state (`self._s`: combiner,
old type, constructor parameters, numpy dtype) and the tables of `datatypes`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import datatypes as _types

if TYPE_CHECKING:
    from .datatypes import Datatype

_F90 = ("F90_INTEGER", "F90_REAL", "F90_COMPLEX")
_CHAR_OVERRIDES = {"BYTE": "B", "PACKED": "B", "CHAR": "c", "CHARACTER": "c", "WCHAR": "U", "AINT": "p",
                   "OFFSET": "p", "COUNT": "p"}
_STR_OVERRIDES = {"c": "S1", "U": "U1", "p": "i8", "?": "b1"}


class Described:
    """Envelope, contents, decode, type codes and pickling of a `Datatype` (a mixin)."""

    def __reduce__(self) -> tuple:
        if self._s.combiner == "NAMED":   # type: ignore[attr-defined]
            canonical = _types.NAMED_BY_STATE[id(self._s)]   # type: ignore[attr-defined]
            named = _types.PREDEFINED[canonical]
            return (_named, (canonical,)) if self is named else (_types.Datatype, (named,))
        old, combiner, params = self.decode()
        return (_recreate, (old, combiner, params))

    # -- type codes -------------------------------------------------------------------------------

    @property
    def typechar(self) -> str:
        """One-character code of the element type, as mpi4py gives it ('V' for derived types)."""
        s = self._s   # type: ignore[attr-defined]
        if s.combiner == "DUP":
            return s.old.typechar
        if s.dtype is None or s.dtype.fields is not None:
            return "V"
        return _CHAR_OVERRIDES.get(_types.NAMED_BY_STATE.get(id(s), ""), s.dtype.char)

    @property
    def typestr(self) -> str:
        """numpy-style type string ('i4', 'f8', 'V16' for derived types)."""
        s = self._s   # type: ignore[attr-defined]
        if s.combiner == "DUP":
            return s.old.typestr
        char = self.typechar
        if char == "V":
            return f"V{self.extent}"   # type: ignore[attr-defined]
        return _STR_OVERRIDES.get(char, f"{s.dtype.kind}{s.dtype.itemsize}")

    def tocode(self) -> str:
        """The code `fromcode` maps back to an equivalent type.

        Raises:
            ValueError: the type has no such code (MPI.DATATYPE_NULL, pairs, derived types).
        """
        if not self or self.typechar == "V":
            raise ValueError(f"cannot map datatype {self.Get_name() or 'derived'} to a type code")  # type: ignore
        return self.typechar

    @classmethod
    def fromcode(cls, code: str) -> Datatype:
        """The predefined type of a type code ('i', 'd', 'i4', 'f8', 'Zd', ...).

        Raises:
            ValueError: unknown code.
        """
        found = _types.BY_CODE.get(code) or _types.TYPE_DICT.get(code)
        if found is None:
            raise ValueError(f"cannot map code {code!r} to MPI datatype")
        return found

    # -- envelope and contents --------------------------------------------------------------------

    @property
    def combiner(self) -> int:
        """MPI.COMBINER_* of the constructor that made the type."""
        return _types.COMBINERS[self._s.combiner]   # type: ignore[attr-defined]

    @property
    def is_named(self) -> bool:
        """Whether this is a named predefined type."""
        return self._s.combiner == "NAMED"   # type: ignore[attr-defined]

    @property
    def is_predefined(self) -> bool:
        """Whether the type is predefined (named, or made by Create_f90_*)."""
        return self._s.combiner == "NAMED" or self._s.combiner in _F90   # type: ignore[attr-defined]

    def Get_contents(self) -> tuple[list[int], list[int], list[int], list[Datatype]]:
        """(integers, addresses, large counts, datatypes) of the constructor call (MPICH's layout).

        Raises:
            MPI.Exception: a named type has no contents.
        """
        s = self._s   # type: ignore[attr-defined]
        p, copy = s.params, _types.Datatype
        types = [copy(s.old)] if s.old is not None else []
        if s.combiner == "NAMED":
            raise _types.type_error("MPI_Type_get_contents: a named datatype has no contents")
        if s.combiner == "DUP":
            return [], [], [], types
        if s.combiner == "CONTIGUOUS":
            return [], [], [p["count"]], types
        if s.combiner in ("VECTOR", "HVECTOR"):
            return [], [], [p["count"], p["blocklength"], p["stride"]], types
        if s.combiner in ("INDEXED", "HINDEXED"):
            return [], [], [len(p["blocklengths"]), *p["blocklengths"], *p["displacements"]], types
        if s.combiner in ("INDEXED_BLOCK", "HINDEXED_BLOCK"):
            return [], [], [len(p["displacements"]), p["blocklength"], *p["displacements"]], types
        if s.combiner == "STRUCT":
            return ([], [], [len(p["blocklengths"]), *p["blocklengths"], *p["displacements"]],
                    [copy(t) for t in p["datatypes"]])
        if s.combiner == "SUBARRAY":
            return [len(p["sizes"]), p["order"]], [], [*p["sizes"], *p["subsizes"], *p["starts"]], types
        if s.combiner == "RESIZED":
            return [], [], [p["lb"], p["extent"]], types
        if s.combiner == "VALUE_INDEX":
            return [], [], [], [copy(p["value"]), copy(p["index"])]
        return [p[k] for k in ("p", "r") if k in p], [], [], []   # F90_*

    def Get_envelope(self) -> tuple[int, int, int, int, int]:
        """(number of integers, addresses, large counts, datatypes, combiner)."""
        if self.is_named:
            return (0, 0, 0, 0, self.combiner)
        i, a, c, d = self.Get_contents()
        return (len(i), len(a), len(c), len(d), self.combiner)

    envelope = property(Get_envelope, doc="Get_envelope().")
    contents = property(Get_contents, doc="Get_contents().")

    def decode(self) -> tuple[Datatype, str, dict]:
        """(old type, combiner name, parameters) such that old.Create_<combiner>(**parameters)
        rebuilds the type; a named type decodes to (itself, 'NAMED', {})."""
        s = self._s   # type: ignore[attr-defined]
        if s.combiner == "NAMED":
            return self, "NAMED", {}   # type: ignore[return-value]
        params = {k: (list(v) if isinstance(v, list) else v) for k, v in s.params.items()}
        if "datatypes" in params:
            params["datatypes"] = [_types.Datatype(t) for t in params["datatypes"]]
        return (_types.Datatype(s.old) if s.old is not None else _types.Datatype()), s.combiner, params


def _named(name: str) -> Datatype:
    """The predefined type `name` (what a pickled named type loads as)."""
    return _types.PREDEFINED[name]


def _recreate(old: Datatype, combiner: str, params: dict) -> Datatype:
    """The type `decode` described (what a pickled derived type loads as)."""
    if combiner in ("STRUCT", "VALUE_INDEX") or combiner in _F90:
        prefix = "Get_" if combiner == "VALUE_INDEX" else "Create_"
        return getattr(_types.Datatype, prefix + combiner.lower())(**params)
    return getattr(old, f"Create_{combiner.lower()}")(**params)
