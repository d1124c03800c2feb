"""`MPI.Info`: ordered string key/value hints, with mpi4py's dict-like methods; INFO_NULL, INFO_ENV.

An Info object is a handle: `MPI.Info(info)` is a second handle of the same key/value table, equal
to the first; `Dup` and `copy` make a new table. colls reads no hint (none would change what it
does), so an Info given to `Dup_with_info` or `Split_type` is kept and handed back, as MPI allows.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterable, Iterator

from colls import config

from .errors import ERR_ARG, ERR_INFO, ERR_INFO_NOKEY, MPIException
from .handles import HandleTable, NumberedHandle

_MISSING = object()


class InfoError(MPIException, KeyError):
    """MPI.INFO_NULL used, or a key that is not there: an MPI error, and a KeyError to the dict-like
    methods."""

    def __str__(self) -> str:
        return self._text


class Info(NumberedHandle):
    """An MPI info object: string keys to string values, in insertion order (None: MPI.INFO_NULL)."""

    _h: dict[str, str] | None
    _numbers = HandleTable()

    def __new__(cls, info: Info | None = None) -> Info:
        self = object.__new__(cls)
        if info is None:
            self._h = None
        elif isinstance(info, Info):
            self._h = info._h
        else:
            raise TypeError(f"Info: expecting an MPI.Info, got {type(info).__name__}")
        return self

    # -- handle ----------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Info):
            return NotImplemented
        return self._h is other._h

    __hash__ = None   # type: ignore[assignment] - handles are unhashable in mpi4py

    def __bool__(self) -> bool:
        return self._h is not None

    def __repr__(self) -> str:
        return f"<colls.compat.MPI.Info {'null' if self._h is None else dict(self._h)}>"

    def __reduce__(self) -> object:
        if self is INFO_NULL:
            return "INFO_NULL"
        if self is INFO_ENV:
            return "INFO_ENV"
        if self._h is None:
            return (type(self), ())
        if self._h is INFO_ENV._h:
            return (type(self), (INFO_ENV,))
        return (_rebuild, (type(self), list(self._h.items())))

    # -- MPI's methods ---------------------------------------------------------------------------

    @classmethod
    def Create(cls, items: dict[str, str] | Iterable[tuple[str, str]] | None = None) -> Info:
        """A new info object, empty or holding `items` (a mapping or (key, value) pairs).

        Raises:
            TypeError: `items` is neither a mapping nor an iterable of pairs.
        """
        info = object.__new__(cls)
        info._h = {}
        if items is not None:
            if not isinstance(items, (dict, list, tuple)) and not hasattr(items, "items"):
                raise TypeError(f"Info.Create: items must be a mapping or (key, value) pairs, got "
                                f"{type(items).__name__}")
            info.update(items)
        return info

    @classmethod
    def Create_env(cls, args: object = None) -> Info:
        """An info object holding the keys of MPI.INFO_ENV (command, argv, ...) for this process."""
        info = cls.Create(_environment(args))
        return info

    def Free(self) -> None:
        """Release the info object; the handle becomes MPI.INFO_NULL (the predefined ones stay)."""
        self._live()
        if self is not INFO_ENV:
            self._numbers.forget(self._h)
            self._h = None

    def free(self) -> None:
        """Free, where this is an info object that can be freed (not null, not MPI.INFO_ENV)."""
        if self._h is not None and self is not INFO_ENV:
            self.Free()

    def Dup(self) -> Info:
        """A new info object (of this one's class) with the same keys and values."""
        return _rebuild(type(self), list(self._live().items()))

    def Get(self, key: str) -> str | None:
        """The value of `key`, or None when it is not set."""
        return self._live().get(_key(key))

    def Set(self, key: str, value: str) -> None:
        """Set `key` to `value` (both strings)."""
        self._live()[_key(key)] = str(value)

    def Delete(self, key: str) -> None:
        """Remove `key`.

        Raises:
            MPIException: `key` is not set (MPI.ERR_INFO_NOKEY; also a KeyError).
        """
        table = self._live()
        if _key(key) not in table:
            raise InfoError(ERR_INFO_NOKEY, f"Info.Delete: no key {key!r}")
        del table[key]

    def Get_nkeys(self) -> int:
        """The number of keys set."""
        return len(self._live())

    def Get_nthkey(self, n: int) -> str:
        """The `n`-th key, in the order set.

        Raises:
            MPIException: `n` is not in 0..Get_nkeys()-1 (MPI.ERR_ARG).
        """
        keys = list(self._live())
        if not 0 <= n < len(keys):
            raise MPIException(ERR_ARG, f"Info.Get_nthkey: n={n} is not in 0..{len(keys) - 1}")
        return keys[n]

    # -- mpi4py's dict-like methods (INFO_NULL reads as empty and refuses writes) -------------------

    def _live(self) -> dict[str, str]:
        if self._h is None:
            raise InfoError(ERR_INFO, "invalid info: MPI.INFO_NULL (or a freed info)")
        return self._h

    def _view(self) -> dict[str, str]:
        return {} if self._h is None else self._h

    def __len__(self) -> int:
        return len(self._view())

    def __contains__(self, key: object) -> bool:
        return key in self._view()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._view()))

    def __getitem__(self, key: str) -> str:
        value = self._view().get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: str) -> None:
        self.Set(key, value)

    def __delitem__(self, key: str) -> None:
        self.Delete(key)

    def get(self, key: str, default: str | None = None) -> str | None:
        """The value of `key`, or `default`."""
        return self._view().get(key, default)

    def keys(self) -> list[str]:
        """The keys, in the order set."""
        return list(self._view().keys())

    def values(self) -> list[str]:
        """The values, in the order their keys were set."""
        return list(self._view().values())

    def items(self) -> list[tuple[str, str]]:
        """(key, value) pairs, in the order set."""
        return list(self._view().items())

    def update(self, items: object = (), **kwds: str) -> None:
        """Set the keys of a mapping or of (key, value) pairs, then those given as keywords."""
        table = self._live()
        pairs = items.items() if hasattr(items, "items") else items
        for key, value in list(pairs) + list(kwds.items()):   # type: ignore[call-overload]
            table[_key(key)] = str(value)

    def pop(self, key: str, default: object = _MISSING) -> str | object:
        """Remove `key` and return its value (or `default`; KeyError without one)."""
        if key in self._view():
            return self._live().pop(key)
        if default is _MISSING:
            raise KeyError(key)
        return default

    def popitem(self) -> tuple[str, str]:
        """Remove and return the (key, value) set last."""
        table = self._live()
        if not table:
            raise KeyError("popitem(): the info object is empty")
        return table.popitem()

    def copy(self) -> Info:
        """A new info object with the same keys (MPI.INFO_NULL's copy is a null handle)."""
        return type(self)() if self._h is None else self.Dup()

    def clear(self) -> None:
        """Remove every key."""
        if self._h is not None:
            self._h.clear()


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"Info: keys are strings, got {type(key).__name__}")
    return key


def _rebuild(cls: type, items: list[tuple[str, str]]) -> Info:
    return cls.Create(items)


def _environment(args: object = None) -> dict[str, str]:
    """MPI_INFO_ENV's keys for this process (MPI 4.0, 9.1)."""
    argv = sys.argv if args is None else ([args] if isinstance(args, str) else list(args))  # type: ignore
    thread_level = "MPI_THREAD_MULTIPLE"
    return {"command": argv[0] if argv else sys.executable, "argv": " ".join(argv[1:]),
            "maxprocs": str(config.get("COLLS_WORLD_SIZE") or 1), "soft": "", "host": platform.node(),
            "arch": platform.machine(), "wdir": os.getcwd(), "file": "", "thread_level": thread_level}


def info_of(info: Info | None) -> dict[str, str]:
    """A copy of the keys of an Info argument (None or MPI.INFO_NULL: none)."""
    if info is None:
        return {}
    if not isinstance(info, Info):
        raise TypeError(f"info: expecting an MPI.Info, got {type(info).__name__}")
    return dict(info._view())


def info_with(table: dict[str, str]) -> Info:
    """A new Info holding a copy of `table`."""
    return Info.Create(table)


INFO_NULL = Info()
INFO_ENV = Info.Create(_environment())
