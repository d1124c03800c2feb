"""The `local` transport: ranks are threads of one process, for fast tests and `colls.spawn`.

A send larger than 4 KiB is a rendezvous, not an eager copy: it is parked in the receiver's mailbox
and completes only when the receiver has copied (or reduced) straight out of the sender's buffer.
That is stricter than a buffered transport, so an algorithm that only works because big sends
complete early fails here too; small sends are copied and complete at once, as MPI's eager ones do.
One lock and condition guard the whole world; with the GIL there is nothing to gain from finer locks.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from .base import Exchange, Reducer, Request, Transport, check_buffer, timeout_error
from .errors import CollectiveMismatch, CommunicatorAborted, PeerLost

EAGER_BYTES = 4096   # sends up to this size are copied and complete at once; larger ones rendezvous


class _Send(Request):
    __slots__ = ("data",)

    def __init__(self, peer: int, tag: int, data: np.ndarray) -> None:
        super().__init__("send", peer, tag, data.nbytes)
        self.data = data


class _Recv(Request):
    __slots__ = ("buf", "reducer")

    def __init__(self, peer: int, tag: int, buf: np.ndarray, reducer: Reducer | None) -> None:
        super().__init__("recv", peer, tag, buf.nbytes)
        self.buf = buf
        self.reducer = reducer


class LocalWorld:
    """The state shared by the threads of one local group: mailboxes, liveness, sub-groups."""

    _ids = itertools.count()

    def __init__(self, size: int, parent_ranks: Sequence[int] = ()) -> None:
        self.size = size
        # parent rank -> rank here, so that a death in the parent group reaches this one
        self.from_parent = {parent_rank: i for i, parent_rank in enumerate(parent_ranks)}
        self.cond = threading.Condition()
        # mailbox[dst][src]: sends from src waiting for dst to match them, in posting order.
        self.mailbox: list[list[deque[_Send]]] = [[deque() for _ in range(size)] for _ in range(size)]
        self.lost: dict[int, str] = {}
        self.aborted: str | None = None
        self.children: dict[int, LocalWorld] = {}

    def transport(self, rank: int) -> LocalTransport:
        """The transport of `rank` in this world."""
        return LocalTransport(self, rank)

    def mark_lost(self, rank: int, reason: str) -> None:
        """Record that `rank` has died (its thread raised or returned early); wakes every waiter."""
        with self.cond:
            self.lost[rank] = reason
            self.cond.notify_all()
            children = list(self.children.values())
        for child in children:
            if rank in child.from_parent:
                child.mark_lost(child.from_parent[rank], reason)


class LocalTransport(Transport):
    """One thread's end of a `LocalWorld`."""

    name = "local"

    def __init__(self, world: LocalWorld, rank: int) -> None:
        self.world = world
        self.rank = rank
        self.size = world.size
        # receives posted by this rank and not yet matched, per source, in posting order
        self.pending: list[list[_Recv]] = [[] for _ in range(world.size)]

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "local send")
        eager = buf.nbytes <= EAGER_BYTES
        request = _Send(peer, tag, buf.copy() if eager else buf)
        request.done = eager   # like MPI's eager protocol: a small send completes once copied
        with self.world.cond:
            self.world.mailbox[peer][self.rank].append(request)
            self.world.cond.notify_all()
        return request

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "local receive")
        request = _Recv(peer, tag, buf, None)
        self.pending[peer].append(request)
        return request

    def irecv_reduce(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer) -> Request:
        check_buffer(buf, "local receive-reduce")
        request = _Recv(peer, tag, buf, reducer)
        self.pending[peer].append(request)
        return request

    def wait_all(self, requests: Sequence[Request], deadline: float) -> None:
        world = self.world
        with world.cond:
            while True:
                if self._progress():
                    world.cond.notify_all()
                if all(r.done for r in requests):
                    return
                for r in requests:
                    if not r.done and r.peer in world.lost:
                        raise PeerLost(f"rank {r.peer} is gone ({world.lost[r.peer]}); "
                                       f"rank {self.rank} was waiting for its {r!r}", r.peer)
                self.check_aborted()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise timeout_error(requests, deadline)
                world.cond.wait(min(remaining, 0.5))

    def _progress(self) -> bool:
        """Match posted receives against parked sends; call with the world lock held."""
        moved = False
        inbox = self.world.mailbox[self.rank]
        for src, receives in enumerate(self.pending):
            # each receive takes the first parked send with its tag: receives of one tag in the
            # order posted, of different tags in any (one waiting for a tag blocks no other)
            index = 0
            while index < len(receives) and inbox[src]:
                send = _first_with_tag(inbox[src], receives[index].tag)
                if send is None:
                    index += 1
                    continue
                recv = receives.pop(index)
                inbox[src].remove(send)
                _deliver(send, recv, src, self.rank)
                moved = True
        return moved

    def check_aborted(self) -> None:
        if self.world.aborted is not None:
            raise CommunicatorAborted(f"rank {self.rank}: {self.world.aborted}")
        if self.watched is not None:
            self.watched.check_aborted()

    def abort(self, reason: str) -> None:
        with self.world.cond:
            self.world.aborted = reason
            self.world.cond.notify_all()

    def subgroup(self, ranks: Sequence[int], exchange: Exchange) -> Transport | None:
        # The first rank of each new group creates its world; the others find it by id.
        parent = self.world
        world_id = -1
        if ranks and ranks[0] == self.rank:
            child = LocalWorld(len(ranks), ranks)
            world_id = next(LocalWorld._ids)
            with parent.cond:
                parent.children[world_id] = child
        ids = [int(b.decode()) for b in exchange(str(world_id).encode())]
        if not ranks:
            return None
        with parent.cond:
            child = parent.children[ids[ranks[0]]]
        return child.transport(list(ranks).index(self.rank))


def _first_with_tag(queue: deque[_Send], tag: int) -> _Send | None:
    for send in queue:
        if send.tag == tag:
            return send
    return None


def _deliver(send: _Send, recv: _Recv, src: int, dst: int) -> None:
    """Copy or reduce the sender's buffer into the receiver's, completing both requests."""
    if send.nbytes != recv.nbytes:
        raise CollectiveMismatch(f"rank {dst} posted a receive of {recv.nbytes} B from rank {src} "
                                 f"(tag {recv.tag}) but rank {src} sent {send.nbytes} B")
    incoming = send.data.view(np.uint8).view(recv.buf.dtype) if send.nbytes else recv.buf[:0]
    if recv.reducer is None:
        np.copyto(recv.buf, incoming)
    else:
        recv.reducer(recv.buf, incoming)
    send.done = True
    recv.done = True
