"""Point-to-point calls of `MPI.Comm`: `Send`/`Recv` and their forms, over a colls `Communicator`."""

from __future__ import annotations

from .buffers import simple
from .request import ANY_SOURCE, ANY_TAG, PROC_NULL, Request, Status


def _unsupported(feature: str):
    def method(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"{feature} is not supported by the colls mpi4py facade")
    method.__doc__ = f"Not supported: {feature}."
    return method


class PointToPoint:
    """The point-to-point methods of `Comm` (a mixin: `self._comm` is the colls `Communicator`)."""

    def _peer(self, rank: int, what: str) -> int:
        if rank == ANY_SOURCE:
            raise NotImplementedError(f"{what} from MPI.ANY_SOURCE is not supported by the colls mpi4py "
                                      "facade: name the source rank")
        return int(rank)

    def _tag(self, tag: int, what: str) -> int:
        if tag == ANY_TAG:
            raise NotImplementedError(f"{what} with MPI.ANY_TAG is not supported by the colls mpi4py "
                                      "facade: pass the tag the sender used")
        return int(tag)

    def _isend(self, buf, dest: int, tag: int) -> Request:
        if dest == PROC_NULL:
            return Request()
        data = simple(buf, writable=False).data()
        return Request(self._comm.send(data, int(dest), self._tag(tag, "Send"), async_op=True))

    def _irecv(self, buf, source: int, tag: int) -> Request:
        if source == PROC_NULL:
            return Request(status_fields=(PROC_NULL, ANY_TAG, 0))
        source, tag = self._peer(source, "Recv"), self._tag(tag, "Recv")
        data = simple(buf, writable=True).data()
        return Request(self._comm.recv(data, source, tag, async_op=True),
                       status_fields=(source, tag, data.nbytes))

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        """Send a buffer to `dest`; the receive must name this rank, the tag, and the same byte size."""
        self._isend(buf, dest, tag).Wait()

    Ssend = Bsend = Rsend = Send

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> None:
        """Receive into a buffer from `source` with `tag` (both explicit: no wildcards)."""
        self._irecv(buf, source, tag).Wait(status)

    def Isend(self, buf, dest: int, tag: int = 0) -> Request:
        """Nonblocking Send."""
        return self._isend(buf, dest, tag)

    Issend = Ibsend = Irsend = Isend

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Nonblocking Recv."""
        return self._irecv(buf, source, tag)

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        """Send to `dest` and receive from `source`, both posted before either is waited for."""
        receive = self._irecv(recvbuf, source, recvtag)
        send = self._isend(sendbuf, dest, sendtag)
        Request.Waitall([send, receive])
        receive.Wait(status)

    def Sendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                         recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        """Sendrecv with one buffer: its contents are sent, then replaced by what arrives."""
        outgoing = simple(buf, writable=True)
        self.Sendrecv([outgoing.data().copy(), outgoing.datatype], dest, sendtag, buf, source, recvtag,
                      status)

    Probe = Iprobe = Mprobe = Improbe = _unsupported("probing for messages (Probe, Iprobe, Mprobe)")
    Send_init = Recv_init = _unsupported("persistent requests (Send_init, Recv_init)")
    Psend_init = Precv_init = _unsupported("partitioned communication")


# mpi4py's pickle-based lowercase methods: not offered (they would unpickle whatever a peer sends).
for _name in ("send", "recv", "isend", "irecv", "sendrecv", "ssend", "issend", "bsend", "ibsend",
              "bcast", "gather", "scatter", "allgather", "alltoall", "reduce", "allreduce", "scan",
              "exscan", "barrier", "probe", "iprobe", "mprobe", "improbe"):
    setattr(PointToPoint, _name, _unsupported(f"the pickle-based lowercase method Comm.{_name} (use the "
                                      f"uppercase buffer methods, e.g. Comm.{_name.capitalize()})"))
