"""Integer handles for the facade's objects: `toint`/`py2f` and `fromint`/`f2py`, as mpi4py has them.

An MPI handle is a C value that a Fortran or C library could be handed. The facade has no C library,
so each distinct handle (a communicator's, an info's, a group's membership) gets a small number the
first time one is asked for, and the number gives the same handle back while it exists.
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
