"""The block collectives of `MPI.Comm` (Bcast, Gather, Allreduce, ...) mapped onto colls' own.

Each method first turns its arguments into `Message`s (byte views of the caller's buffers), then
makes one colls call writing straight into the receive buffer; the `I...` forms make the same call
with `async_op=True` and return a `Request`. Data-movement collectives move bytes (any datatype);
reductions move elements of the datatype through the operator it maps to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import buffers
from .buffers import Message, is_in_place, simple
from .ops import SUM, Op
from .request import Request

if TYPE_CHECKING:
    from colls.communicator import Communicator


def _begin(nonblocking: bool, call: Callable[[bool], Any], finish: Callable[[Any], None] | None = None,
           landed: Sequence[Message] = ()) -> Request | None:
    """Make the colls call (async when nonblocking); once it completes, run `finish` and unpack the
    receiving messages (`Message.received`): now, or when the Request completes."""
    def done(result: Any) -> None:
        if finish is not None:
            finish(result)
        for message in landed:
            message.received()

    result = call(nonblocking)
    if nonblocking:
        return Request(result, done)
    done(result)
    return None


def _writable_or_none(data: np.ndarray) -> np.ndarray | None:
    return data if data.flags.writeable else None


class BlockCollectives:
    """Mixin of `Comm`: needs `_comm` (the colls `Communicator`)."""

    _comm: Communicator

    # -- data movement ---------------------------------------------------------------------------

    def _bcast(self, buf, root: int, nonblocking: bool) -> Request | None:
        comm = self._comm
        message = simple(buf, writable=comm.rank != root)
        data = message.data()
        out = _writable_or_none(data)
        return _begin(nonblocking, lambda a: comm.broadcast(data, root, out=out, async_op=a),
                      landed=[message])

    def _gather(self, sendbuf, recvbuf, root: int, nonblocking: bool) -> Request | None:
        comm = self._comm
        out, landed = None, []
        if comm.rank == root:
            received = simple(recvbuf, writable=True, blocks=comm.size)
            send = (received.block(root).copy() if is_in_place(sendbuf)
                    else simple(sendbuf, writable=False).data())
            out, landed = received.data(comm.size), [received]
        else:
            send = simple(sendbuf, writable=False).data()
        return _begin(nonblocking, lambda a: comm.gather(send, root, out=out, async_op=a), landed=landed)

    def _scatter(self, sendbuf, recvbuf, root: int, nonblocking: bool) -> Request | None:
        comm = self._comm
        send = out = None
        landed = []
        if comm.rank == root:
            send = simple(sendbuf, writable=False, blocks=comm.size).data(comm.size)
        if comm.rank != root or not is_in_place(recvbuf):
            received = simple(recvbuf, writable=True)
            out, landed = received.data(), [received]
        return _begin(nonblocking, lambda a: comm.scatter(send, root, out=out, async_op=a), landed=landed)

    def _allgather(self, sendbuf, recvbuf, nonblocking: bool) -> Request | None:
        comm = self._comm
        received = simple(recvbuf, writable=True, blocks=comm.size)
        send = (received.block(comm.rank).copy() if is_in_place(sendbuf)
                else simple(sendbuf, writable=False).data())
        out = received.data(comm.size)
        return _begin(nonblocking, lambda a: comm.all_gather(send, out=out, async_op=a), landed=[received])

    def _alltoall(self, sendbuf, recvbuf, nonblocking: bool) -> Request | None:
        comm = self._comm
        received = simple(recvbuf, writable=True, blocks=comm.size)
        out = received.data(comm.size)
        send = out if is_in_place(sendbuf) else simple(sendbuf, writable=False,
                                                       blocks=comm.size).data(comm.size)
        return _begin(nonblocking, lambda a: comm.all_to_all(send, out=out, async_op=a), landed=[received])

    def _allgatherv(self, sendbuf, recvbuf, nonblocking: bool) -> Request | None:
        """Every rank knows every count: all-gather blocks padded to the largest, then unpad."""
        comm = self._comm
        received = buffers.vector(recvbuf, writable=True, blocks=comm.size)
        extent = received.datatype.extent
        mine = received.block(comm.rank)
        send = mine.copy() if is_in_place(sendbuf) else simple(sendbuf, writable=False).data()
        if send.size != mine.size:
            raise ValueError(f"Allgatherv: rank {comm.rank} sends {send.size} bytes but counts[{comm.rank}] "
                             f"is {mine.size // max(extent, 1)} elements ({mine.size} bytes)")
        widest = max(received.counts) * extent
        padded = np.zeros(widest, np.uint8)
        padded[:send.size] = send

        def finish(gathered: np.ndarray) -> None:
            for rank in range(comm.size):
                block = received.block(rank)
                block[...] = gathered[rank * widest:rank * widest + block.size]

        return _begin(nonblocking, lambda a: comm.all_gather(padded, async_op=a), finish, [received])

    # -- reductions ------------------------------------------------------------------------------

    def _reduce(self, sendbuf, recvbuf, op: Op, root: int, nonblocking: bool) -> Request | None:
        comm = self._comm
        out, landed = None, []
        if comm.rank == root:
            received = simple(recvbuf, writable=True)
            out, landed = received.typed(), [received]
            datatype = received.datatype
            if is_in_place(sendbuf):
                x = out
            else:
                sent = simple(sendbuf, writable=False)
                buffers.same_shape(sent, received, "Reduce")
                x = sent.typed()
        else:
            sent = simple(sendbuf, writable=False)
            datatype, x = sent.datatype, sent.typed()
        colls_op = op.for_datatype(datatype)
        return _begin(nonblocking, lambda a: comm.reduce(x, root, op=colls_op, out=out, async_op=a),
                      landed=landed)

    def _allreduce(self, sendbuf, recvbuf, op: Op, nonblocking: bool) -> Request | None:
        comm = self._comm
        received = simple(recvbuf, writable=True)
        out = received.typed()
        if is_in_place(sendbuf):
            x = out
        else:
            sent = simple(sendbuf, writable=False)
            buffers.same_shape(sent, received, "Allreduce")
            x = sent.typed()
        colls_op = op.for_datatype(received.datatype)
        return _begin(nonblocking, lambda a: comm.all_reduce(x, op=colls_op, out=out, async_op=a),
                      landed=[received])

    def _reduce_scatter_block(self, sendbuf, recvbuf, op: Op, nonblocking: bool) -> Request | None:
        comm = self._comm
        if is_in_place(sendbuf):
            received = simple(recvbuf, writable=True, blocks=comm.size)
            x, out = received.typed(comm.size), received.typed()   # colls reduces a copy of x
        else:
            received = simple(recvbuf, writable=True)
            sent = simple(sendbuf, writable=False, blocks=comm.size)
            buffers.same_shape(sent, received, "Reduce_scatter_block")
            x, out = sent.typed(comm.size), received.typed()
        colls_op = op.for_datatype(received.datatype)
        return _begin(nonblocking, lambda a: comm.reduce_scatter(x, op=colls_op, out=out, async_op=a),
                      landed=[received])

    def _reduce_scatter(self, sendbuf, recvbuf, recvcounts, op: Op, nonblocking: bool) -> Request | None:
        """Uneven blocks: reduce-scatter blocks padded to the largest count, then keep this rank's part."""
        comm = self._comm
        received = simple(recvbuf, writable=True)
        if is_in_place(sendbuf):
            if recvcounts is None:
                raise ValueError("Reduce_scatter with MPI.IN_PLACE needs recvcounts")
            x = received.typed()
        else:
            sent = simple(sendbuf, writable=False)
            if sent.datatype != received.datatype and sent.datatype.basic != received.datatype.basic:
                raise ValueError("Reduce_scatter: mismatch in send and receive MPI datatypes")
            x = sent.typed()
        per = received.datatype.size // received.datatype.basic.itemsize   # basic elements per element
        if recvcounts is None:   # every rank's receive count, as mpi4py gathers them
            recvcounts = comm.all_gather(np.array([received.count], np.int64)).tolist()
        counts = [int(c) for c in recvcounts]
        if len(counts) != comm.size:
            raise ValueError(f"Reduce_scatter: expecting {comm.size} counts, got {len(counts)}")
        if x.size != sum(counts) * per:
            raise ValueError(f"Reduce_scatter: mismatch in send count {x.size // per} and sum(counts) "
                             f"{sum(counts)}")
        mine = counts[comm.rank]
        if not is_in_place(sendbuf) and received.count != mine:
            raise ValueError(f"Reduce_scatter: mismatch in receive count {received.count} and "
                             f"counts[{comm.rank}] {mine}")
        widest = max(counts) * per
        padded = np.zeros((comm.size, widest), x.dtype)
        start = 0
        for rank, count in enumerate(counts):
            padded[rank, :count * per] = x[start:start + count * per]
            start += count * per
        colls_op = op.for_datatype(received.datatype)
        out = received.typed()[:mine * per] if is_in_place(sendbuf) else received.typed()

        def finish(block: np.ndarray) -> None:
            out[...] = block[0, :mine * per]

        return _begin(nonblocking, lambda a: comm.reduce_scatter(padded, op=colls_op, async_op=a), finish,
                      [received])

    # -- the mpi4py names ------------------------------------------------------------------------

    def Barrier(self) -> None:
        """Return once every rank has entered the barrier."""
        self._comm.barrier()

    def Ibarrier(self) -> Request:
        """Nonblocking barrier."""
        return Request(self._comm.barrier(async_op=True))

    def Bcast(self, buf, root: int = 0) -> None:
        """Copy the root's buffer to every rank."""
        self._bcast(buf, root, False)

    def Ibcast(self, buf, root: int = 0) -> Request:
        """Nonblocking Bcast."""
        return self._bcast(buf, root, True)

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Collect equal blocks from every rank on the root, in rank order."""
        self._gather(sendbuf, recvbuf, root, False)

    def Igather(self, sendbuf, recvbuf, root: int = 0) -> Request:
        """Nonblocking Gather."""
        return self._gather(sendbuf, recvbuf, root, True)

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Give rank i block i of the root's buffer."""
        self._scatter(sendbuf, recvbuf, root, False)

    def Iscatter(self, sendbuf, recvbuf, root: int = 0) -> Request:
        """Nonblocking Scatter."""
        return self._scatter(sendbuf, recvbuf, root, True)

    def Allgather(self, sendbuf, recvbuf) -> None:
        """Every rank gets every rank's block, in rank order."""
        self._allgather(sendbuf, recvbuf, False)

    def Iallgather(self, sendbuf, recvbuf) -> Request:
        """Nonblocking Allgather."""
        return self._allgather(sendbuf, recvbuf, True)

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        """Allgather with per-rank counts and displacements."""
        self._allgatherv(sendbuf, recvbuf, False)

    def Iallgatherv(self, sendbuf, recvbuf) -> Request:
        """Nonblocking Allgatherv."""
        return self._allgatherv(sendbuf, recvbuf, True)

    def Alltoall(self, sendbuf, recvbuf) -> None:
        """Block i of the send buffer goes to rank i."""
        self._alltoall(sendbuf, recvbuf, False)

    def Ialltoall(self, sendbuf, recvbuf) -> Request:
        """Nonblocking Alltoall."""
        return self._alltoall(sendbuf, recvbuf, True)

    def Reduce(self, sendbuf, recvbuf, op: Op = SUM, root: int = 0) -> None:
        """Reduce every rank's buffer onto the root."""
        self._reduce(sendbuf, recvbuf, op, root, False)

    def Ireduce(self, sendbuf, recvbuf, op: Op = SUM, root: int = 0) -> Request:
        """Nonblocking Reduce."""
        return self._reduce(sendbuf, recvbuf, op, root, True)

    def Allreduce(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """Reduce every rank's buffer; every rank gets the result."""
        self._allreduce(sendbuf, recvbuf, op, False)

    def Iallreduce(self, sendbuf, recvbuf, op: Op = SUM) -> Request:
        """Nonblocking Allreduce."""
        return self._allreduce(sendbuf, recvbuf, op, True)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """Reduce, then give rank i block i (equal blocks)."""
        self._reduce_scatter_block(sendbuf, recvbuf, op, False)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op: Op = SUM) -> Request:
        """Nonblocking Reduce_scatter_block."""
        return self._reduce_scatter_block(sendbuf, recvbuf, op, True)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op: Op = SUM) -> None:
        """Reduce, then give rank i `recvcounts[i]` elements."""
        self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, False)

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op: Op = SUM) -> Request:
        """Nonblocking Reduce_scatter."""
        return self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, True)
