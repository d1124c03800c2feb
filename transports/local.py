"""The `local` transport: ranks are threads of one process, for fast tests and `colls.spawn`.

A send larger than 4 KiB is a rendezvous, not an eager copy: it is parked in the receiver's mailbox
and completes only when the receiver has copied (or reduced) straight out of the sender's buffer.
That is stricter than a buffered transport, so an algorithm that only works because big sends
complete early fails here too; small sends are copied and complete at once, as MPI's eager ones do.
A synchronous send (`issend`) is never eager: it completes when a receive (or `mrecv`) takes it.
One lock and condition guard the whole world; with the GIL there is nothing to gain from finer locks.
Every verb takes it, and a wait releases it while it sleeps, so any number of threads may use one
rank's transport at once.

MPI's point-to-point matching: a rank's receives are kept in one list, in posting order, and each
takes the earliest message that matches it (from its source, or the earliest sent from any source for
ANY_SOURCE; with its tag, or any user tag, below RESERVED_TAG_BASE, for ANY_TAG). With both sides in
a single order that is the matching MPI defines whatever the moment each side arrived.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from .base import (
    ANY_SOURCE,
    ANY_TAG,
    COLLECTIVE_TAG_BASE,
    RESERVED_TAG_BASE,
    Envelope,
    Exchange,
    Reducer,
    Request,
    Transport,
    check_buffer,
    timeout_error,
)
from .errors import CollectiveMismatch, CommunicatorAborted, MessageTruncated, PeerLost

EAGER_BYTES = 4096   # sends up to this size are copied and complete at once; larger ones rendezvous


class _Send(Request):
    __slots__ = ("data", "origin", "order")

    def __init__(self, peer: int, tag: int, data: np.ndarray, origin: int, order: int) -> None:
        super().__init__("send", peer, tag, data.nbytes)
        self.data = data
        self.origin = origin   # the sending rank
        self.order = order   # the world's count of sends when this one was posted (ANY_SOURCE's order)


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
        self.sends = itertools.count()

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
        # receives posted by this rank and not yet matched, in posting order
        self.pending: list[_Recv] = []

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "local send")
        eager = buf.nbytes <= EAGER_BYTES
        data = buf.copy() if eager else buf
        with self.world.cond:
            request = _Send(peer, tag, data, self.rank, next(self.world.sends))
            request.done = eager   # like MPI's eager protocol: a small send completes once copied
            self.world.mailbox[peer][self.rank].append(request)
            self.world.cond.notify_all()
        return request

    def issend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "local synchronous send")
        with self.world.cond:
            request = _Send(peer, tag, buf, self.rank, next(self.world.sends))
            self.world.mailbox[peer][self.rank].append(request)
            self.world.cond.notify_all()
        return request

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "local receive")
        request = _Recv(peer, tag, buf, None)
        with self.world.cond:
            self.pending.append(request)
        return request

    def irecv_reduce(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer) -> Request:
        check_buffer(buf, "local receive-reduce")
        request = _Recv(peer, tag, buf, reducer)
        with self.world.cond:
            self.pending.append(request)
        return request

    def iprobe(self, peer: int, tag: int) -> Envelope | None:
        with self.world.cond:
            send = self._probe(peer, tag)
            return None if send is None else Envelope(send.origin, send.tag, send.nbytes)

    def improbe(self, peer: int, tag: int) -> Envelope | None:
        with self.world.cond:
            send = self._probe(peer, tag)
            if send is None:
                return None
            self.world.mailbox[self.rank][send.origin].remove(send)
            return Envelope(send.origin, send.tag, send.nbytes, send)

    def mrecv(self, buf: np.ndarray, message: Envelope) -> Request:
        check_buffer(buf, "local receive")
        send = message.handle
        if not isinstance(send, _Send):
            raise ValueError(f"rank {self.rank}: mrecv needs a message improbe claimed and not yet "
                             f"received, got {message!r}")
        request = _Recv(message.source, message.tag, buf, None)
        message.handle = None   # received once only
        with self.world.cond:
            _deliver(send, request, message.source, self.rank)
            self.world.cond.notify_all()
        return request

    def _probe(self, peer: int, tag: int) -> _Send | None:
        """The message a receive from `peer` with `tag` would take now; call with the lock held."""
        if self._progress():
            self.world.cond.notify_all()
        return _match(self.world.mailbox[self.rank], peer, tag)

    def wait_all(self, requests: Sequence[Request], deadline: float) -> None:
        world = self.world
        with world.cond:
            while True:
                if self._progress():
                    world.cond.notify_all()
                finished = True
                for r in requests:
                    if r.done:
                        if r.error is not None:
                            raise r.error
                        continue
                    finished = False
                    if r.peer in world.lost:
                        raise PeerLost(f"rank {r.peer} is gone ({world.lost[r.peer]}); "
                                       f"rank {self.rank} was waiting for its {r!r}", r.peer)
                if finished:
                    return
                self.check_fingerprints(requests)   # (the lock held, as `_unreceived` needs)
                self.check_aborted()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise timeout_error(requests, deadline)
                world.cond.wait(min(remaining, 0.5))

    def _unreceived(self, peer: int) -> list[int]:
        return [send.tag for send in self.world.mailbox[self.rank][peer] if send.tag >= COLLECTIVE_TAG_BASE]

    def _progress(self) -> bool:
        """Match posted receives, in posting order, against parked sends; call with the lock held."""
        pending = self.pending
        if not pending:
            return False
        inbox = self.world.mailbox[self.rank]
        moved = False
        index = 0
        while index < len(pending):
            recv = pending[index]
            send = _match(inbox, recv.peer, recv.tag)
            if send is None:
                index += 1   # it waits; receives after it may still match other messages
                continue
            del pending[index]
            inbox[send.origin].remove(send)
            _deliver(send, recv, send.origin, self.rank)
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
    """The first send in `queue` with `tag` (ANY_TAG: with any user tag)."""
    if tag == ANY_TAG:
        for send in queue:
            if send.tag < RESERVED_TAG_BASE:
                return send
        return None
    for send in queue:
        if send.tag == tag:
            return send
    return None


def _match(inbox: list[deque[_Send]], peer: int, tag: int) -> _Send | None:
    """The parked send a receive from `peer` (or ANY_SOURCE) with `tag` takes: the first of its
    sender's that matches, from any sender the earliest posted."""
    if peer != ANY_SOURCE:
        queue = inbox[peer]
        return _first_with_tag(queue, tag) if queue else None
    found = None
    for queue in inbox:
        send = _first_with_tag(queue, tag) if queue else None
        if send is not None and (found is None or send.order < found.order):
            found = send
    return found


def _deliver(send: _Send, recv: _Recv, src: int, dst: int) -> None:
    """Copy or reduce the sender's buffer into the receiver's, completing both requests. A
    point-to-point message may be shorter than the receive's buffer; a longer one completes the
    receive with MessageTruncated (and the send normally); in a collective, any other size
    completes the receive with CollectiveMismatch."""
    nbytes = send.nbytes
    if nbytes != recv.nbytes:
        if recv.tag >= COLLECTIVE_TAG_BASE or recv.reducer is not None:
            # raised by the wait for this receive (not by whichever thread's progress found it);
            # the send stays incomplete, as the sender's call is as wrong as this one
            recv.error = CollectiveMismatch(f"rank {dst} posted a receive of {recv.nbytes} B from rank "
                                            f"{src} (tag {recv.tag}) but rank {src} sent {nbytes} B")
            recv.done = True
            return
        if nbytes > recv.nbytes:
            recv.error = MessageTruncated(
                f"rank {dst}: a message of {nbytes} B from rank {src} (tag {send.tag}) does not fit "
                f"the receive buffer of {recv.nbytes} B")
            recv.buf.view(np.uint8)[:] = send.data.view(np.uint8)[:recv.nbytes]
        else:
            recv.buf.view(np.uint8)[:nbytes] = send.data.view(np.uint8)
    elif recv.reducer is None:
        if nbytes:
            np.copyto(recv.buf, send.data.view(np.uint8).view(recv.buf.dtype))
    else:
        incoming = send.data.view(np.uint8).view(recv.buf.dtype) if nbytes else recv.buf[:0]
        recv.reducer(recv.buf, incoming)
    recv.source, recv.received_tag, recv.count = src, send.tag, min(nbytes, recv.nbytes)
    send.done = True
    recv.done = True
