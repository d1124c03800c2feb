"""Collectives colls has no algorithm for, as custom schedules over `Communicator.channel()`.

Gatherv/Scatterv are linear (the root posts one receive or send per rank, straight into or out of
the user's buffer), Alltoallv/Alltoallw post every pairwise exchange at once, and Scan/Exscan are
MPICH's recursive-doubling prefix (`MPIR_Scan_intra_recursive_doubling`), which keeps rank order so
non-commutative operators are right. A channel's sends and receives run in the caller's thread, so
each schedule first waits for the communicator's queued asynchronous work (`synchronize`); the
`I...` forms therefore complete before they return (MPI allows that) and hand back a done Request.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from algorithms.channel import Channel

from . import buffers
from .buffers import BOTTOM, is_in_place, simple, vector
from .datatypes import Datatype, lookup
from .ops import SUM, Op
from .request import Request

if TYPE_CHECKING:
    from colls.communicator import Communicator


def _check_same(send: np.ndarray, recv: np.ndarray, what: str, rank: int) -> None:
    if send.size != recv.size:
        raise ValueError(f"{what}: rank {rank} sends {send.size} bytes to itself but expects {recv.size}")


def _root(comm: Communicator, root: object, what: str) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < comm.size:
        raise ValueError(f"{what}: root={root!r} is not a rank of this group of {comm.size}")
    return int(root)


def _w_messages(msg: object, writable: bool, size: int) -> list[buffers.Message]:
    """One message per peer of an Alltoallw message: (buf, (counts, byte displs), types) and kin;
    from MPI.BOTTOM, the displacements and datatypes hold absolute addresses."""
    if not isinstance(msg, (list, tuple)) or not 2 <= len(msg) <= 4:
        raise ValueError("Alltoallw: expecting (buffer, types), (buffer, (counts, displs), types) or "
                         "(buffer, counts, displs, types)")
    if len(msg) == 2:
        buf, types = msg
        counts, displs = [1] * size, [0] * size
    elif len(msg) == 3:
        buf, (counts, displs), types = msg
    else:
        buf, counts, displs, types = msg
    if isinstance(types, (Datatype, str)):
        types = [types] * size
    datatypes = [lookup(t) for t in types]
    counts, displs = [int(c) for c in counts], [int(d) for d in displs]
    if not len(counts) == len(displs) == len(datatypes) == size:
        raise ValueError(f"Alltoallw: expecting {size} counts, displacements and datatypes")
    if buf is BOTTOM:
        spans = []
        for count, displ, datatype in zip(counts, displs, datatypes, strict=True):
            layout = datatype.layout(count)
            if layout.size:
                spans.append((displ + layout.lo, displ + layout.hi))
        raw, origin = buffers.memory_at(spans)
    else:
        raw, origin = buffers.raw_bytes(buf, writable)[0], 0
    messages = [buffers.Message(raw, datatype, count, writable=writable, origin=origin - displ)
                for count, displ, datatype in zip(counts, displs, datatypes, strict=True)]
    for rank, message in enumerate(messages):
        try:
            message.window(0, message.count)
        except ValueError as error:
            raise ValueError(f"Alltoallw: block {rank}: {error}") from None
    return messages


class ScheduledCollectives:
    """Mixin of `Comm`: needs `_comm` (the colls `Communicator`)."""

    _comm: Communicator

    def _channel(self, what: str) -> Channel:
        self._comm.synchronize()
        return self._comm.channel(what)

    def _exchange_blocks(self, what: str, send: list[np.ndarray], recv: list[np.ndarray],
                         landed: list[buffers.Message]) -> None:
        """Block i of `send` goes to rank i, block j of `recv` comes from rank j (empty ones skipped);
        then the messages `recv` lies in are unpacked."""
        comm = self._comm
        _check_same(send[comm.rank], recv[comm.rank], what, comm.rank)   # before any byte moves
        channel = self._channel(what)
        requests = [channel.recv(recv[peer], peer) for peer in range(comm.size)
                    if peer != comm.rank and recv[peer].size]
        requests += [channel.send(send[peer], peer) for peer in range(comm.size)
                     if peer != comm.rank and send[peer].size]
        recv[comm.rank][...] = send[comm.rank]
        channel.wait(*requests)
        for message in landed:
            message.received()

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Gather blocks of per-rank counts into the root's buffer at per-rank displacements."""
        comm = self._comm
        root = _root(comm, root, "Gatherv")
        if comm.rank == root:
            received = vector(recvbuf, writable=True, blocks=comm.size)
            blocks = [received.block(rank) for rank in range(comm.size)]
            mine = blocks[root] if is_in_place(sendbuf) else simple(sendbuf, writable=False).data()
            _check_same(mine, blocks[root], "Gatherv", root)   # before any byte moves
            channel = self._channel("Gatherv")
            requests = [channel.recv(blocks[rank], rank) for rank in range(comm.size)
                        if rank != root and blocks[rank].size]
            blocks[root][...] = mine
            channel.wait(*requests)
            received.received()
        else:
            data = simple(sendbuf, writable=False).data()
            channel = self._channel("Gatherv")
            if data.size:
                channel.wait(channel.send(data, root))

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Give rank i `counts[i]` elements from displacement `displs[i]` of the root's buffer."""
        comm = self._comm
        root = _root(comm, root, "Scatterv")
        if comm.rank == root:
            sent = vector(sendbuf, writable=False, blocks=comm.size)
            blocks = [sent.block(rank) for rank in range(comm.size)]
            received = None if is_in_place(recvbuf) else simple(recvbuf, writable=True)
            mine = None if received is None else received.data()
            if mine is not None:
                _check_same(blocks[root], mine, "Scatterv", root)   # before any byte moves
            channel = self._channel("Scatterv")
            requests = [channel.send(blocks[rank], rank) for rank in range(comm.size)
                        if rank != root and blocks[rank].size]
            if mine is not None:
                mine[...] = blocks[root]
            channel.wait(*requests)
        else:
            received = simple(recvbuf, writable=True)
            data = received.data()
            channel = self._channel("Scatterv")
            if data.size:
                channel.wait(channel.recv(data, root))
        if received is not None:
            received.received()

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        """All-to-all with per-peer counts and displacements on both sides."""
        size = self._comm.size
        received = vector(recvbuf, writable=True, blocks=size)
        if is_in_place(sendbuf):
            sent = replace(received, raw=received.raw.copy(), writable=False, _landing=[])
        else:
            sent = vector(sendbuf, writable=False, blocks=size)
        self._exchange_blocks("Alltoallv", [sent.block(r) for r in range(size)],
                              [received.block(r) for r in range(size)], [received])

    def Alltoallw(self, sendbuf, recvbuf) -> None:
        """All-to-all with per-peer counts, byte displacements and datatypes."""
        size = self._comm.size
        received = _w_messages(recvbuf, True, size)
        recv = [message.data() for message in received]
        if is_in_place(sendbuf):
            send = [block.copy() for block in recv]
        else:
            send = [message.data() for message in _w_messages(sendbuf, False, size)]
        self._exchange_blocks("Alltoallw", send, recv, received)

    def _prefix(self, sendbuf, recvbuf, op: Op, exclusive: bool) -> None:
        """Inclusive (Scan) or exclusive (Exscan) prefix reduction by recursive doubling."""
        comm = self._comm
        what = "Exscan" if exclusive else "Scan"
        received = simple(recvbuf, writable=True)
        out = received.typed()
        if is_in_place(sendbuf):
            mine = out.copy()
        else:
            sent = simple(sendbuf, writable=False)
            buffers.same_shape(sent, received, what)
            mine = sent.typed()
        colls_op = op.for_datatype(received.datatype)
        colls_op.check(out.dtype)
        partial = mine.copy()             # reduction over my aligned block of ranks, in rank order
        incoming = np.empty_like(partial)
        if not exclusive:
            out[...] = mine
        have_prefix = not exclusive
        channel = self._channel(what)
        mask = 1
        while mask < comm.size:
            partner = comm.rank ^ mask
            if partner < comm.size:
                # swap block reductions with the partner block of the same size
                channel.exchange(partial.view(np.uint8), partner, incoming.view(np.uint8), partner)
                if partner < comm.rank:   # the lower block comes before everything I hold
                    colls_op.into_right(partial, incoming)
                    if have_prefix:
                        colls_op.into_right(out, incoming)
                    else:
                        out[...] = incoming
                        have_prefix = True
                else:
                    colls_op.into_left(partial, incoming)
            mask <<= 1
        received.received()

    def Scan(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """Rank i gets the reduction of ranks 0..i."""
        self._prefix(sendbuf, recvbuf, op, exclusive=False)

    def Exscan(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """Rank i gets the reduction of ranks 0..i-1 (rank 0's buffer is left as it was)."""
        self._prefix(sendbuf, recvbuf, op, exclusive=True)

    def Igatherv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        """Nonblocking Gatherv (completes before it returns)."""
        self.Gatherv(sendbuf, recvbuf, root)
        return Request(None)   # done at once: active until waited for

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        """Nonblocking Scatterv (completes before it returns)."""
        self.Scatterv(sendbuf, recvbuf, root)
        return Request(None)   # done at once: active until waited for

    def Ialltoallv(self, sendbuf, recvbuf) -> Request:
        """Nonblocking Alltoallv (completes before it returns)."""
        self.Alltoallv(sendbuf, recvbuf)
        return Request(None)   # done at once: active until waited for

    def Ialltoallw(self, sendbuf, recvbuf) -> Request:
        """Nonblocking Alltoallw (completes before it returns)."""
        self.Alltoallw(sendbuf, recvbuf)
        return Request(None)   # done at once: active until waited for

    def Iscan(self, sendbuf, recvbuf, op: Op = SUM) -> Request:
        """Nonblocking Scan (completes before it returns)."""
        self.Scan(sendbuf, recvbuf, op)
        return Request(None)   # done at once: active until waited for

    def Iexscan(self, sendbuf, recvbuf, op: Op = SUM) -> Request:
        """Nonblocking Exscan (completes before it returns)."""
        self.Exscan(sendbuf, recvbuf, op)
        return Request(None)   # done at once: active until waited for
