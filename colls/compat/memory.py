"""`MPI.buffer` (alias `MPI.memory`), `MPI.Alloc_mem` and `MPI.Free_mem`.

mpi4py's `buffer` is a byte view of memory with an `address`. Here it is a 1-D uint8 numpy array
(so it has the buffer protocol, `len`, indexing and `tobytes`), with mpi4py's extra attributes.
`Alloc_mem` allocates ordinary memory: colls needs no registered memory for point-to-point.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


class buffer(np.ndarray):   # noqa: N801 - mpi4py's name
    """Bytes of memory with an address (mpi4py's MPI.buffer)."""

    def __new__(cls, obj: Any = None) -> buffer:
        if obj is None:
            return np.empty(0, np.uint8).view(cls)
        view = memoryview(obj)
        array = np.frombuffer(view, np.uint8) if view.nbytes else np.empty(0, np.uint8)
        return array.view(cls)

    @staticmethod
    def allocate(nbytes: int, clear: bool = False) -> buffer:
        """A new buffer of `nbytes` bytes (zeroed when `clear`)."""
        if nbytes < 0:
            raise ValueError(f"buffer.allocate: negative size {nbytes}")
        return (np.zeros if clear else np.empty)(int(nbytes), np.uint8).view(buffer)

    @staticmethod
    def frombuffer(obj: Any, readonly: bool = False) -> buffer:
        """A buffer over the memory of `obj` (anything with the buffer protocol)."""
        view = buffer(obj)
        if readonly:
            view.flags.writeable = False
        return view

    @staticmethod
    def fromaddress(address: int, nbytes: int, readonly: bool = False) -> buffer:
        """A buffer over `nbytes` bytes at `address` (memory the caller keeps alive)."""
        if nbytes == 0:
            return buffer.allocate(0)
        raw = (ctypes.c_ubyte * int(nbytes)).from_address(int(address))
        view = np.ctypeslib.as_array(raw).view(buffer)
        if readonly:
            view.flags.writeable = False
        return view

    @property
    def address(self) -> int:
        """The address of the first byte."""
        return int(self.__array_interface__["data"][0])

    @property
    def readonly(self) -> bool:
        """Whether the memory is read-only."""
        return not self.flags.writeable

    @property
    def obj(self) -> Any:
        """The object whose memory this is (None for allocated memory)."""
        return self.base

    def toreadonly(self) -> buffer:
        """A read-only view of the same memory."""
        view = self.view(buffer)
        view.flags.writeable = False
        return view

    @property
    def format(self) -> str:
        """The format of an element: "B" (bytes), as mpi4py's buffer has it."""
        return "B"

    def cast(self, format: str, shape: object = None) -> memoryview:   # noqa: A002 - mpi4py's name
        """A memoryview of the same memory, of elements `format` (and `shape`)."""
        view = memoryview(self).cast("B")
        return view.cast(format) if shape is None else view.cast(format, shape)

    def release(self) -> None:
        """Nothing to release: the memory lives as long as a reference to it."""


memory = buffer


def Alloc_mem(size: int, info: object = None) -> buffer:   # noqa: N802 - mpi4py's name
    """`size` bytes of memory, as a `buffer`."""
    return buffer.allocate(size)


def Free_mem(mem: buffer) -> None:   # noqa: N802 - mpi4py's name
    """Release memory from `Alloc_mem` (it is freed when the last reference goes)."""
    if not isinstance(mem, np.ndarray):
        raise TypeError(f"Free_mem: expecting memory from MPI.Alloc_mem, got {type(mem).__name__}")
