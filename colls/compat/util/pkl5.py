"""`mpi4py.util.pkl5` over the colls facade: pickle protocol 5 with out-of-band buffers.

The facade's own lowercase methods already move large buffers out of band (see
`colls.compat.objects`), so `Comm` here is the facade's communicator with this module's `pickle`
(whose `THRESHOLD` a program may lower) and mpi4py.util.pkl5's request and message types: tuples of
the facade's requests and messages. As in mpi4py, `irecv` is not offered (a receive of unknown size
needs a probe first: `mprobe(...).irecv()`).
"""

from __future__ import annotations

import struct
from typing import Any

from .. import MPI
from ..objects import Pickle

__all__ = ["Comm", "Intercomm", "Intracomm", "Message", "Pickle", "Request", "pickle"]

pickle = Pickle()


class _BigMPI:
    """mpi4py's splitting of messages with more than `blocksize` bytes: colls counts bytes in 64
    bits, so nothing is split; kept so programs that set `blocksize` run unchanged."""

    blocksize = (1 << (struct.calcsize("q") * 8 - 1)) - 1

    def __init__(self) -> None:
        self.cache: dict[int, Any] = {}

    def __enter__(self) -> _BigMPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cache.clear()

    def __call__(self, buf: Any) -> tuple[memoryview, int, Any]:
        view = memoryview(buf)
        return (view, view.nbytes, MPI.BYTE)


_bigmpi = _BigMPI()


class _Handles(tuple):
    """A tuple of MPI handles of one kind (`_kind`; made from None: a tuple of `_null`), equal to
    another such tuple of the same handles, or to one handle that all of its handles equal."""

    _kind: type
    _null: str   # the null handle's name in MPI

    def __new__(cls, handles: Any = None) -> Any:
        if handles is None:
            handles = (getattr(MPI, cls._null),)
        if isinstance(handles, cls._kind):
            handles = (handles,)
        return super().__new__(cls, handles)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Handles) and other._kind is self._kind:
            return tuple(self) == tuple(other)
        if isinstance(other, self._kind):
            return all(handle == other for handle in self)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = tuple.__hash__

    def __bool__(self) -> bool:
        return any(self)


class Request(_Handles):
    """Requests of one object operation (mpi4py.util.pkl5.Request): a tuple of MPI.Request."""

    _kind, _null = MPI.Request, "REQUEST_NULL"

    def Free(self) -> None:   # noqa: N802 - mpi4py's name
        """Free every request."""
        for request in self:
            request.Free()

    free = Free

    def cancel(self) -> None:
        """Ask to cancel every request (colls cannot: they complete as usual)."""
        for request in self:
            request.Cancel()

    def get_status(self, status: MPI.Status | None = None) -> bool:
        """Whether every request has completed, freeing none."""
        slots = [status] + [None] * (len(self) - 1)
        return all([request.Get_status(slot) for request, slot in zip(self, slots, strict=True)])

    def test(self, status: MPI.Status | None = None) -> tuple[bool, Any]:
        """(whether complete, the received object or None)."""
        flag, objects = MPI.Request.testall(list(self), None if status is None else [status] * len(self))
        return (True, _first(objects)) if flag else (False, None)

    def wait(self, status: MPI.Status | None = None) -> Any:
        """Wait; returns the received object (None for a send)."""
        return _first(MPI.Request.waitall(list(self), None if status is None else [status] * len(self)))

    @classmethod
    def get_status_all(cls, requests: list[Request], statuses: list[MPI.Status] | None = None) -> bool:
        """Whether every request has completed, freeing none."""
        slots = _slots(requests, statuses)
        return all([request.get_status(slot) for request, slot in zip(requests, slots, strict=True)])

    @classmethod
    def testall(cls, requests: list[Request], statuses: list[MPI.Status] | None = None
                ) -> tuple[bool, list[Any] | None]:
        """(whether all completed, their objects or None)."""
        if not all([request.get_status() for request in requests]):
            return False, None
        return True, cls.waitall(requests, statuses)

    @classmethod
    def waitall(cls, requests: list[Request], statuses: list[MPI.Status] | None = None) -> list[Any]:
        """Wait for every request; their objects."""
        slots = _slots(requests, statuses)
        return [request.wait(slot) for request, slot in zip(requests, slots, strict=True)]


def _first(objects: list[Any] | None) -> Any:
    return next((obj for obj in objects or () if obj is not None), None)


def _slots(requests: list[Any], statuses: Any) -> list[Any]:
    if statuses is None:
        return [None] * len(requests)
    if isinstance(statuses, list):
        statuses.extend(MPI.Status() for _ in range(len(statuses), len(requests)))
    return [statuses[i] if i < len(statuses) else None for i in range(len(requests))]


class Message(_Handles):
    """A matched message (mpi4py.util.pkl5.Message): a tuple of MPI.Message."""

    _kind, _null = MPI.Message, "MESSAGE_NULL"

    def free(self) -> None:
        """Forget the message."""
        for message in self:
            message.free()

    def recv(self, status: MPI.Status | None = None) -> Any:
        """Receive the matched message's object."""
        return self.irecv().wait(status)

    def irecv(self) -> Request:
        """Nonblocking receive of the matched message's object."""
        return Request(self[0].irecv())

    @classmethod
    def probe(cls, comm: Comm, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG,
              status: MPI.Status | None = None) -> Message:
        """`comm.mprobe(source, tag, status)`."""
        return Message(MPI.Comm.Mprobe(comm, source, tag, status))

    @classmethod
    def iprobe(cls, comm: Comm, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG,
               status: MPI.Status | None = None) -> Message | None:
        """`comm.improbe(source, tag, status)`."""
        message = MPI.Comm.Improbe(comm, source, tag, status)
        return None if message is None else Message(message)


class Comm(MPI.Comm):
    """A communicator whose lowercase methods use this module's `pickle` and types; `Comm(comm)`
    communicates over the MPI.Comm `comm`."""

    def _pickler(self) -> Pickle:
        return pickle

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Nonblocking send of an object."""
        return Request(super().isend(obj, dest, tag))

    def ibsend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Nonblocking buffered send (a send)."""
        return Request(super().ibsend(obj, dest, tag))

    def issend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Nonblocking synchronous send (a send)."""
        return Request(super().issend(obj, dest, tag))

    def irecv(self, buf: Any = None, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG) -> Request:
        """Not offered (as in mpi4py.util.pkl5): use `mprobe(...).irecv()`."""
        raise RuntimeError("unsupported")

    def mprobe(self, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG,
               status: MPI.Status | None = None) -> Message:
        """Claim the next message from `source` with `tag`."""
        return Message(super().mprobe(source, tag, status))

    def improbe(self, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG,
                status: MPI.Status | None = None) -> Message | None:
        """As `mprobe`, without blocking: None if no message is there yet."""
        message = super().improbe(source, tag, status)
        return None if message is None else Message(message)


class Intracomm(Comm, MPI.Intracomm):
    """An intra-communicator with pkl5's lowercase methods."""


class Intercomm(Comm, MPI.Intercomm):
    """An inter-communicator with pkl5's lowercase methods (`Intercomm(intercomm)`)."""
