"""Integer handles for the facade's objects: `toint`/`py2f` and `fromint`/`f2py`, as mpi4py has them.

An MPI handle is a C value that a Fortran or C library could be handed. The facade has no C library,
so each distinct handle (a communicator's, an info's, a group's membership) gets a small number the
first time one is asked for, and the number gives the same handle back while it exists.
`NumberedHandle` gives a class these methods from such a table; `StateHandle` those of a handle
whose state carries its own number (datatypes, operations).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

NULL_HANDLE = 0


class HandleTable:
    """Numbers for the handles of one kind of object (numbers start at 1; 0 is the null handle)."""

    def __init__(self) -> None:
        self._numbers: dict[int, int] = {}       # id(handle) -> number
        self._handles: dict[int, Any] = {}       # number -> handle
        self._next = itertools.count(1)
        self._lock = threading.Lock()

    def number(self, handle: Any) -> int:
        """The number of `handle` (None: the null handle, 0)."""
        if handle is None:
            return NULL_HANDLE
        with self._lock:
            number = self._numbers.get(id(handle))
            if number is None or self._handles.get(number) is not handle:
                number = next(self._next)
                self._numbers[id(handle)] = number
                self._handles[number] = handle
            return number

    def handle(self, number: int) -> Any:
        """The handle numbered `number` (None for 0).

        Raises:
            ValueError: no handle has that number.
        """
        if number == NULL_HANDLE:
            return None
        with self._lock:
            if number not in self._handles:
                raise ValueError(f"fromint: {number!r} is not a handle of this process")
            return self._handles[number]

    def forget(self, handle: Any) -> None:
        """Drop `handle`'s number (it was freed)."""
        with self._lock:
            number = self._numbers.pop(id(handle), None)
            if number is not None:
                self._handles.pop(number, None)


class NumberedHandle:
    """Mixin: `toint`/`py2f`/`handle` and `fromint`/`f2py`/`fromhandle`, numbered by the class's
    `_numbers` table.

    The numbered value is `self._h` and `fromint` wraps it as `_h` of a new object; a class whose
    handle lives elsewhere overrides `_numbered` and `_from_numbered` (or `toint` and `fromint`).
    """

    _numbers: HandleTable
    _h: Any

    def _numbered(self) -> Any:
        return self._h

    @classmethod
    def _from_numbered(cls, value: Any) -> Any:
        obj = object.__new__(cls)
        obj._h = value
        return obj

    def toint(self) -> int:
        """This handle as an int (`fromint` gives it back; 0 for a null handle)."""
        return self._numbers.number(self._numbered())

    def py2f(self) -> int:
        """This handle as an int (`toint`)."""
        return self.toint()

    @property
    def handle(self) -> int:
        """This handle as an int (`toint`)."""
        return self.toint()

    @classmethod
    def fromint(cls, number: int) -> Any:
        """The handle whose `toint()` was `number`.

        Raises:
            ValueError: no handle has that number.
        """
        return cls._from_numbered(cls._numbers.handle(number))

    @classmethod
    def f2py(cls, number: int) -> Any:
        """The handle whose `toint()` was `number` (`fromint`)."""
        return cls.fromint(number)

    fromhandle = f2py


class StateHandle:
    """Mixin of handles whose state object `_s` carries the integer handle (`_s.handle`): copies
    of one state are equal handles, and `toint`/`py2f`/`handle` give that integer."""

    _s: Any

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateHandle) and other._s is self._s

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._s.handle)

    @property
    def handle(self) -> int:
        """The integer handle (0 for the null handle)."""
        return self._s.handle

    def toint(self) -> int:
        """The integer handle."""
        return self._s.handle

    py2f = toint
