"""The blocking buffer collectives of `MPI.Intercomm`: Bcast, Gather, Scatter, Allgather, Alltoall,
Allreduce, with MPI's rules for inter-communicators (data goes from one group to the other; in a
rooted one the root passes MPI.ROOT, the rest of its group MPI.PROC_NULL, the other group the root's
rank in it).

Each is one of colls' collectives over the union of both groups (`intergroup.RemoteView.union`),
whose blocks are the bytes each rank sends, padded to one width every rank knows: a rooted one first
finds the root's union rank and the block width with one small all-reduce (the MPI.PROC_NULL ranks
know neither); an all-to-all one pads to the wider of the two groups' blocks, which every rank
knows from its send and receive buffers. Their `I...` forms are not offered.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .buffers import simple
from .ops import SUM
from .request import PROC_NULL

ROOT = -3   # MPI.ROOT


class InterBlockCollectives:
    """Mixin of `Intercomm`: needs `_view` (the `RemoteView`), `_root` and `_union_root`."""

    def Bcast(self, buf: Any, root: int = 0) -> None:
        """The root's buffer into every rank's of the other group."""
        root = self._root(root)
        union = self._view.union
        message = None if root == PROC_NULL else simple(buf, writable=root >= 0)
        data = None if message is None else message.data()
        where, width = self._union_root(root, data.nbytes if root == ROOT else -1)
        if width:
            if root >= 0:
                union.broadcast(data, where, out=data)
                message.received()
            else:
                union.broadcast(data if root == ROOT else np.empty(width, np.uint8), where)

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """The other group's buffers, in rank order, into the root's `recvbuf`."""
        root = self._root(root)
        view = self._view
        send = received = None
        width = -1
        if root == ROOT:
            received = simple(recvbuf, writable=True, blocks=view.remote_size)
            width = received.data(view.remote_size).nbytes // view.remote_size
        elif root >= 0:
            send = simple(sendbuf, writable=False).data()
            width = send.nbytes
        where, width = self._union_root(root, width)
        if not width:
            return
        block = send.reshape(1, -1) if send is not None else np.zeros((1, width), np.uint8)
        rows = view.union.gather(block, where)
        if received is not None:
            received.data(view.remote_size)[...] = self._remote_rows(rows, width).reshape(-1)
            received.received()

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Block i of the root's `sendbuf` into the `recvbuf` of rank i of the other group."""
        root = self._root(root)
        view = self._view
        send = received = out = None
        width = -1
        if root == ROOT:
            data = simple(sendbuf, writable=False, blocks=view.remote_size).data(view.remote_size)
            width = data.nbytes // view.remote_size
            send = np.zeros((view.union.size, width), np.uint8)
            remote = slice(view.remote_offset, view.remote_offset + view.remote_size)
            send[remote] = data.reshape(view.remote_size, -1)
        elif root >= 0:
            received = simple(recvbuf, writable=True)
            out = received.data()
            width = out.nbytes
        where, width = self._union_root(root, width)
        if not width:
            return
        view.union.scatter(send, where, out=out.reshape(1, -1) if out is not None else
                           np.empty((1, width), np.uint8))
        if received is not None:
            received.received()

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        """The other group's buffers, in rank order, into every rank's `recvbuf`."""
        view = self._view
        received = simple(recvbuf, writable=True, blocks=view.remote_size)
        out = received.data(view.remote_size)
        send = simple(sendbuf, writable=False).data()
        incoming = out.nbytes // view.remote_size
        width = max(send.nbytes, incoming)   # the wider group's block: every rank knows both
        if not width:
            return
        padded = np.zeros((1, width), np.uint8)
        padded[0, :send.nbytes] = send
        rows = view.union.all_gather(padded)
        out[...] = self._remote_rows(rows, width)[:, :incoming].reshape(-1)
        received.received()

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        """Block i of this rank's `sendbuf` to rank i of the other group; block j of `recvbuf` from
        its rank j."""
        view = self._view
        count = view.remote_size
        send = simple(sendbuf, writable=False, blocks=count).data(count)
        received = simple(recvbuf, writable=True, blocks=count)
        out = received.data(count)
        outgoing, incoming = send.nbytes // count, out.nbytes // count
        width = max(outgoing, incoming)
        if not width:
            return
        table = np.zeros((view.union.size, width), np.uint8)
        table[view.remote_offset:view.remote_offset + count, :outgoing] = send.reshape(count, -1)
        rows = view.union.all_to_all(table)
        out[...] = self._remote_rows(rows, width)[:, :incoming].reshape(-1)
        received.received()

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> None:
        """The other group's buffers combined element by element by `op`, in rank order, into
        every rank's `recvbuf`."""
        view = self._view
        source = simple(sendbuf, writable=False)
        target = simple(recvbuf, writable=True)
        values = source.typed()
        if not values.size:
            return
        rows = view.union.all_gather(values.reshape(1, -1))
        rows = self._remote_rows(rows, values.size)
        combine = op.for_datatype(target.datatype)
        combine.check(target.datatype.basic)
        accumulator = target.typed()
        accumulator[...] = rows[-1]
        for row in rows[-2::-1]:   # x0 op (x1 op (... op x_last)): rank order kept
            combine.into_right(accumulator, row)
        target.received()

    def _remote_rows(self, rows: np.ndarray, width: int) -> np.ndarray:
        view = self._view
        return np.asarray(rows).reshape(view.union.size, width)[view.remote_offset:
                                                                view.remote_offset + view.remote_size]
