"""Cross-memory attach: read another process's memory in one copy (Linux `process_vm_readv`).

Large shm messages use it the way MPICH's and Open MPI's shared-memory layers do for big
messages: the sender publishes the address of its buffer, the receiver copies (or reduces) straight
out of it, and no byte goes through a shared segment twice. Same user only; where the kernel or a
seccomp profile forbids it, `probe` says so and the transport keeps the two-copy FIFO path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

import numpy as np

from .errors import TransportError


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    _readv = _libc.process_vm_readv
    _readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                       ctypes.c_ulong, ctypes.c_ulong]
    _readv.restype = ctypes.c_ssize_t
    _writev = _libc.process_vm_writev
    _writev.argtypes = _readv.argtypes
    _writev.restype = ctypes.c_ssize_t
except (OSError, AttributeError):
    _readv = _writev = None


def address_of(buf: np.ndarray) -> int:
    """The address of the contiguous `buf`'s first byte. ctypes' view of a writable buffer gives it
    in a third of the time numpy's `buf.ctypes.data` takes, and a big
    message's exchange asks for several. Buffers ctypes cannot view writably (read-only, empty, a
    dtype the buffer protocol does not export) take numpy's way."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))
    except (TypeError, ValueError):
        return buf.ctypes.data


def read(pid: int, address: int, target: np.ndarray) -> None:
    """Copy `target.nbytes` bytes at `address` in process `pid` into the contiguous `target`."""
    _move(_readv, "process_vm_readv", pid, address, target)


def write(pid: int, address: int, source: np.ndarray) -> None:
    """Copy the contiguous `source` to `address` in process `pid` (process_vm_writev)."""
    _move(_writev, "process_vm_writev", pid, address, source)


# the most one process_vm_readv call moves (the kernel's MAX_RW_COUNT: 2 GiB less a page); a bigger
# buffer goes in several calls
MOST_BYTES = (1 << 31) - 4096


def _move(call, name: str, pid: int, address: int, local_buffer: np.ndarray) -> None:
    total = local_buffer.nbytes
    base = address_of(local_buffer)
    for offset in range(0, total, MOST_BYTES) if total > MOST_BYTES else (0,):
        n = min(MOST_BYTES, total - offset)
        local = _IoVec(base + offset, n)
        remote = _IoVec(address + offset, n)
        done = call(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) if call else -1
        if done == n:
            continue
        code = ctypes.get_errno()
        if code == errno.ESRCH:
            raise ProcessLookupError(f"the process {pid} being copied from has gone")
        raise TransportError(f"{name} with pid {pid} moved {offset + max(done, 0)} of {total} B: "
                             f"{os.strerror(code) if code else 'short copy'}")


HUGE_FROM_BYTES = 4 << 20   # numpy asks the kernel for huge pages for its allocations from here


def _huge_pages_given() -> bool:
    """Whether the kernel gives anonymous memory transparent huge pages (on request or always)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as handle:
            return "[never]" not in handle.read()
    except OSError:
        return False


HUGE_PAGES = _huge_pages_given()


def in_huge_pages(buf: np.ndarray) -> bool:
    """Whether `buf` most likely lies in transparent huge pages: it is part of an allocation of
    4 MiB or more (numpy's own arrays from that size ask for them, as `colls bench`'s do), on a
    kernel that gives them. A peer's `read` of it pins 512 times fewer pages, which is why the shm
    transport reads such messages sooner (`transports.shm.options.EXCHANGE_HUGE_BYTES`)."""
    if not HUGE_PAGES:
        return False
    owner = buf
    while isinstance(owner, np.ndarray):
        base = owner.base
        if base is None:
            return owner.nbytes >= HUGE_FROM_BYTES
        owner = base
    try:
        return memoryview(owner).nbytes >= HUGE_FROM_BYTES
    except TypeError:   # an object that exports no buffer (a registered region's owner, say)
        return False


def probe(pid: int, address: int, expected: int) -> bool:
    """Whether this process may read `pid`'s memory: the int64 at `address` must read `expected`."""
    if _readv is None:
        return False
    got = np.zeros(1, np.int64)
    try:
        read(pid, address, got)
    except (TransportError, ProcessLookupError):
        return False
    return int(got[0]) == expected
