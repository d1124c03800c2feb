"""Registered memory: arrays that the shm transport's peers copy straight out of.

`alloc` returns a numpy array in a memfd of its own (as MPI_Alloc_mem, ncclMemAlloc or torch's
symmetric memory give memory a library can do more with). A big message sent from such an array
goes as its region's id, file descriptor and offset instead of its address: the receiver takes the
descriptor from the sender (`pidfd_getfd`, Linux 5.6+, under the same permission as cross-memory
attach), maps the region once, and copies or reduces out of it with numpy at memory speed, where
cross-memory attach copies page by page inside the kernel.

Nothing goes into /dev/shm: a memfd has no name there, and its memory is freed when the last
mapping of it goes (the owner's array and every view of it, then the peers' cached mappings).
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import mmap
import os
import threading
from collections.abc import Sequence

import numpy as np

from .errors import InvalidArgument, TransportError

_SYS_PIDFD_GETFD = 438   # x86-64 and most others; the shm transport is x86-64 only
_PAGE = mmap.PAGESIZE
_MADV_HUGEPAGE = 14
_HUGE_FROM = 4 << 20   # as numpy asks for huge pages from 4 MiB

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long
_MAP_FAILED = ctypes.c_void_p(-1).value


class Region:
    """One registered allocation: its id (unique in this process), memfd, address and bytes."""

    __slots__ = ("id", "fd", "base", "size")

    def __init__(self, region_id: int, fd: int, base: int, size: int) -> None:
        self.id, self.fd, self.base, self.size = region_id, fd, base, size


class _Owner:
    """What the array returned by `alloc` is a view of: when the last view goes, the region leaves
    the registry first, and only then is it unmapped and its memfd closed (so no address of a
    mapping made later can be taken for it)."""

    def __init__(self, region: Region, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.region = region
        self.__array_interface__ = {"data": (region.base, False), "shape": shape,
                                    "typestr": dtype.str, "descr": dtype.descr, "version": 3}

    def __del__(self) -> None:
        region = self.region
        try:
            _forget(region)
            _libc.munmap(region.base, region.size)
            os.close(region.fd)
        except Exception:   # at interpreter exit, with this module half torn down: the kernel frees it
            pass


_lock = threading.RLock()   # reentrant: a region's last view may go (and `_forget` it) in a GC under it
_bases: list[int] = []          # the registered regions' addresses, sorted
_regions: list[Region] = []     # in the same order
_ids = itertools.count(1)


def alloc(shape: int | Sequence[int], dtype=np.float64) -> np.ndarray:
    """A zero-filled array of `shape` and `dtype` in registered memory (see the module's docstring);
    any view of it sends as registered too. Where memfds cannot be made, an error says so."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(n, (int, np.integer)) and n >= 0 for n in shape):
        raise InvalidArgument(f"alloc: shape must be non-negative ints, got {shape!r}")
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise InvalidArgument(f"alloc: dtype {dt} holds Python objects; registered memory holds numbers")
    shape = tuple(int(n) for n in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    size = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
    try:
        fd = os.memfd_create("colls-registered", os.MFD_CLOEXEC)
    except (AttributeError, OSError) as error:
        raise TransportError(f"alloc: this system cannot make a memfd ({error})") from error
    try:
        os.ftruncate(fd, size)
        base = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if base in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except OSError as error:
        os.close(fd)
        raise TransportError(f"alloc: could not map {size} B of registered memory: {error}") from error
    if size >= _HUGE_FROM:   # huge pages where the kernel gives them to shared memory (shmem_enabled)
        _libc.madvise(base, size, _MADV_HUGEPAGE)
    region = Region(next(_ids), fd, base, size)
    with _lock:
        at = bisect.bisect_left(_bases, base)
        _bases.insert(at, base)
        _regions.insert(at, region)
    return np.asarray(_Owner(region, shape, dt))


def _forget(region: Region) -> None:
    with _lock:
        at = bisect.bisect_left(_bases, region.base)
        if at < len(_regions) and _regions[at] is region:
            del _bases[at], _regions[at]


def held() -> bool:
    """Whether this process holds any registered region at all."""
    return bool(_bases)


def region_of(address: int, nbytes: int) -> Region | None:
    """The registered region that holds the `nbytes` at `address` whole, if one does."""
    if not _bases:
        return None
    with _lock:
        at = bisect.bisect_right(_bases, address) - 1
        if at < 0:
            return None
        region = _regions[at]
    return region if address + nbytes <= region.base + region.size else None


def take_fd(pidfd: int, fd: int) -> int:
    """A descriptor of my own for the process's (`pidfd`'s) descriptor `fd` (pidfd_getfd)."""
    got = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
    if got < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return got


def map_peer(pidfd: int, fd: int, size: int, writable: bool = False) -> np.ndarray:
    """A uint8 view of the `size` bytes of another process's registered region, read-only unless
    `writable`."""
    local = take_fd(pidfd, fd)
    try:
        mapping = mmap.mmap(local, size, mmap.MAP_SHARED,
                            mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
    finally:
        os.close(local)   # the mapping keeps the memory (mmap holds a descriptor of its own)
    return np.frombuffer(mapping, np.uint8)


def open_pidfd(pid: int) -> int:
    """A pidfd for process `pid` (Linux 5.3+)."""
    return os.pidfd_open(pid)
