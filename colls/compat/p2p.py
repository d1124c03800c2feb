"""Point-to-point calls of `MPI.Comm` over a colls `Communicator`: `Send`/`Recv` and their forms,
probes, matched probes, persistent requests, and (from `objects`) the lowercase object methods.

MPI's rules hold as the transports implement them: `MPI.ANY_SOURCE`/`MPI.ANY_TAG` receives, a
receive buffer larger than the message (the status says how much came), MPI.PROC_NULL as a peer
that completes at once with nothing. `Ssend`/`Issend` are synchronous (complete once the receiver
has matched the message); `Bsend` and `Rsend` are sends (colls buffers every message it cannot
deliver at once, so a buffered send needs no attached buffer).
"""

from __future__ import annotations

from typing import Any

from .buffers import simple
from .objects import ObjectMethods
from .request import ANY_SOURCE, ANY_TAG, PROC_NULL, Prequest, Request, Status

BSEND_OVERHEAD = 96   # bytes a buffered send reserves per message in MPICH (colls reserves none)
_attached: list[Any] = [None]


def Attach_buffer(buf: Any) -> None:   # noqa: N802 - mpi4py's name
    """Record the buffer for buffered sends (colls' sends buffer on their own; it stays unused)."""
    _attached[0] = buf


def Detach_buffer() -> Any:   # noqa: N802 - mpi4py's name
    """Give back the buffer `Attach_buffer` recorded (None if none)."""
    buf, _attached[0] = _attached[0], None
    return buf


class Message:
    """A message claimed by `Mprobe`/`Improbe`: only `Recv`/`recv` of this object receives it.

    Args:
        comm: the facade communicator it was claimed on; or a Message to copy; None:
            MPI.MESSAGE_NULL.
        envelope: the transport's `Envelope` (source, tag, nbytes); None with a communicator:
            a message from MPI.PROC_NULL (MPI.MESSAGE_NO_PROC), which receives nothing.
    """

    def __init__(self, comm: Any = None, envelope: Any = None) -> None:
        if isinstance(comm, Message):
            comm, envelope = comm._comm, comm._envelope
        self._comm = comm
        self._envelope = envelope

    def __bool__(self) -> bool:
        return self._comm is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        if self._comm is None or other._comm is None:
            return self._comm is other._comm
        return self._envelope is other._envelope   # None for both: MESSAGE_NO_PROC

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return id(self._envelope)

    def _take(self) -> tuple[Any, Any]:
        if self._comm is None:
            raise ValueError("Message: MPI.MESSAGE_NULL cannot be received")
        comm, envelope = self._comm, self._envelope
        self._comm = self._envelope = None   # received once: now MESSAGE_NULL
        return comm, envelope

    def Recv(self, buf: Any, status: Status | None = None) -> None:
        """Receive the message into `buf` (larger than the message is fine)."""
        self.Irecv(buf).Wait(status)

    def Irecv(self, buf: Any) -> Request:
        """Nonblocking Recv."""
        comm, envelope = self._take()
        if envelope is None:
            return Request(None, status_fields=(PROC_NULL, ANY_TAG, 0))
        return comm._mrecv_buffer(buf, envelope)

    def recv(self, status: Status | None = None) -> Any:
        """Receive the message's object."""
        return self.irecv().wait(status)

    def irecv(self) -> Request:
        """Nonblocking recv: the request's `wait()` returns the object."""
        comm, envelope = self._take()
        if envelope is None:
            return Request(None, status_fields=(PROC_NULL, ANY_TAG, 0), returns_object=True)
        return comm._mrecv_object(envelope)

    @classmethod
    def Probe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Status | None = None) -> Message:
        """`comm.Mprobe(source, tag, status)`."""
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Status | None = None) -> Message | None:
        """`comm.Improbe(source, tag, status)`."""
        return comm.Improbe(source, tag, status)

    probe, iprobe = Probe, Iprobe

    def free(self) -> None:
        """Forget the message (it stays claimed)."""
        self._comm = self._envelope = None

    Free = free


MESSAGE_NULL = Message()
MESSAGE_NO_PROC = Message(PROC_NULL)   # from MPI.PROC_NULL: Mprobe returns a copy; receiving it gets nothing


def _unsupported(feature: str):
    def method(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"{feature} is not supported by the colls mpi4py facade")
    method.__doc__ = f"Not supported: {feature}."
    return method


def _fields(work: Any, source: int, tag: int, nbytes: int) -> tuple[int, int, int]:
    """(source, tag, bytes) of a completed receive: its envelope where the communicator gives one."""
    envelope = getattr(work, "status", None)
    if envelope is not None:
        return envelope.source, envelope.tag, envelope.nbytes
    request = getattr(work, "_request", None)   # the transport's request: what it filled in
    if request is not None:
        return request.source, request.received_tag, request.count
    return source, tag, nbytes


class _Both:
    """A send and a receive (Isendrecv): complete when both are; the status is the receive's."""

    def __init__(self, send: Request, receive: Request) -> None:
        self.send, self.receive = send, receive
        self.status = Status()   # the receive's, kept when its request retires

    def poll(self) -> bool:
        return self.send.Get_status() and self.receive.Get_status()

    def wait(self) -> None:
        self.send.Wait()
        self.receive.Wait(self.status)

    def fields(self) -> tuple[int, int, int]:
        status = self.status
        return status.source, status.tag, status.count


class PointToPoint(ObjectMethods):
    """The point-to-point methods of `Comm` (a mixin: `self._comm` is the colls `Communicator`)."""

    def _isend(self, buf: Any, dest: int, tag: int, synchronous: bool = False) -> Request:
        return self._post_send(None if dest == PROC_NULL else simple(buf, writable=False).data(), dest, tag,
                               synchronous)

    def _post_send(self, data: Any, dest: int, tag: int, synchronous: bool = False) -> Request:
        if dest == PROC_NULL:
            return Request(None)
        return Request(self._comm.send(data, int(dest), int(tag), async_op=True, synchronous=synchronous))

    def _irecv(self, buf: Any, source: int, tag: int) -> Request:
        if source == PROC_NULL:
            return Request(None, status_fields=(PROC_NULL, ANY_TAG, 0))
        message = simple(buf, writable=True)
        data = message.data()
        work = self._comm.recv(data, int(source), int(tag), async_op=True)
        return Request(work, lambda _: message.received(),
                       lambda: _fields(work, int(source), int(tag), data.nbytes))

    def _mrecv_buffer(self, buf: Any, envelope: Any) -> Request:
        message = simple(buf, writable=True)
        work = self._comm.mrecv(message.data(), envelope, async_op=True)
        return Request(work, lambda _: message.received(),
                       lambda: _fields(work, envelope.source, envelope.tag, envelope.nbytes))

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        """Send a buffer to `dest` with `tag`."""
        self._isend(buf, dest, tag).Wait()

    Bsend = Rsend = Send

    def Ssend(self, buf: Any, dest: int, tag: int = 0) -> None:
        """Synchronous send: returns once `dest` has matched the message to a receive."""
        self._isend(buf, dest, tag, synchronous=True).Wait()

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> None:
        """Receive into a buffer from `source` with `tag` (wildcards allowed; the buffer may be
        larger than the message: `status` says how much came)."""
        self._irecv(buf, source, tag).Wait(status)

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        """Nonblocking Send."""
        return self._isend(buf, dest, tag)

    Ibsend = Irsend = Isend

    def Issend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        """Nonblocking synchronous send: complete once `dest` has matched the message."""
        return self._isend(buf, dest, tag, synchronous=True)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Nonblocking Recv."""
        return self._irecv(buf, source, tag)

    def Isendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Request:
        """Nonblocking Sendrecv: one request for both; its status is the receive's. The send's buffer
        is read first, so a bad one raises before anything is posted."""
        outgoing = None if dest == PROC_NULL else simple(sendbuf, writable=False).data()
        receive = self._irecv(recvbuf, source, recvtag)
        both = _Both(self._post_send(outgoing, dest, sendtag), receive)
        return Request(both, status_fields=both.fields)

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        """Send to `dest` and receive from `source`, both posted before either is waited for."""
        self.Isendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag).Wait(status)

    def _replace(self, buf: Any) -> list[Any]:
        outgoing = simple(buf, writable=True)
        return [outgoing.data().copy(), outgoing.datatype]

    def Isendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                          recvtag: int = ANY_TAG) -> Request:
        """Nonblocking Sendrecv_replace."""
        sendbuf = buf if dest == PROC_NULL else self._replace(buf)
        return self.Isendrecv(sendbuf, dest, sendtag, buf, source, recvtag)

    def Sendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                         recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        """Sendrecv with one buffer: its contents are sent, then replaced by what arrives."""
        self.Isendrecv_replace(buf, dest, sendtag, source, recvtag).Wait(status)

    # -- probes ----------------------------------------------------------------------------------

    @staticmethod
    def _found(envelope: Any, status: Status | None) -> None:
        if status is not None:
            status._fill(envelope.source, envelope.tag, envelope.nbytes)

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Block until a message from `source` with `tag` can be received (within the deadline)."""
        if source == PROC_NULL:
            if status is not None:
                status._fill(PROC_NULL, ANY_TAG, 0)
            return True
        self._found(self._comm.probe(int(source), int(tag)), status)
        return True

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Whether a message from `source` with `tag` can be received now (`status` says which)."""
        if source == PROC_NULL:
            return self.Probe(source, tag, status)
        envelope = self._comm.iprobe(int(source), int(tag))
        if envelope is None:
            return False
        self._found(envelope, status)
        return True

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Message:
        """Claim the next message from `source` with `tag`: only the returned Message receives it."""
        if source == PROC_NULL:
            self.Probe(source, tag, status)
            return Message(MESSAGE_NO_PROC)
        envelope = self._comm.mprobe(int(source), int(tag))
        self._found(envelope, status)
        return Message(self, envelope)

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                status: Status | None = None) -> Message | None:
        """As `Mprobe`, without blocking: None if no message is there yet."""
        if source == PROC_NULL:
            return self.Mprobe(source, tag, status)
        envelope = self._comm.improbe(int(source), int(tag))
        if envelope is None:
            return None
        self._found(envelope, status)
        return Message(self, envelope)

    # -- persistent requests ---------------------------------------------------------------------

    def Send_init(self, buf: Any, dest: int, tag: int = 0) -> Prequest:
        """A persistent send: each `Start` sends the buffer's contents at that time."""
        return Prequest(lambda: self._isend(buf, dest, tag))

    Bsend_init = Rsend_init = Send_init

    def Ssend_init(self, buf: Any, dest: int, tag: int = 0) -> Prequest:
        """A persistent synchronous send: each `Start` posts an `Issend` of the buffer."""
        return Prequest(lambda: self._isend(buf, dest, tag, synchronous=True))

    def Recv_init(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:
        """A persistent receive: each `Start` posts the receive again."""
        return Prequest(lambda: self._irecv(buf, source, tag))

    Psend_init = Precv_init = _unsupported("partitioned communication (Psend_init, Precv_init)")

    # -- buffered sends ----------------------------------------------------------------------------

    def Attach_buffer(self, buf: Any) -> None:
        """As MPI.Attach_buffer (the buffer stays unused)."""
        Attach_buffer(buf)

    def Detach_buffer(self) -> Any:
        """As MPI.Detach_buffer."""
        return Detach_buffer()
