"""`SimTransport`: one rank's end of a `SimWorld` group, the transport the algorithms call."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..base import Exchange, Reducer, Request, Transport
from ..errors import CollectiveMismatch, CommunicatorAborted
from .network import Route
from .ranks import _COMPLETE, _PORT_START, _Group, _Message, _SimRequest
from .symbolic import _rewrite_seconds, _written, is_symbolic, root_of

if TYPE_CHECKING:
    from .world import SimWorld

REAL_COPY_BYTES = 1 << 20   # real send buffers up to this size are copied at post (eager semantics)


class SimTransport(Transport):
    """One rank's end of a `SimWorld` group (the world, or a sub-group of it)."""

    name = "sim"

    def __init__(self, world: SimWorld, group: _Group, rank: int) -> None:
        self.world = world
        self.group = group
        self.rank = rank
        self.size = len(group.world_ranks)
        self.me = world.ranks[group.world_ranks[rank]]

    @property
    def clock(self) -> float:
        """This rank's virtual time, in seconds."""
        return max(self.me.clock, self.world.now)

    def elapse(self, seconds: float) -> None:
        """Spend `seconds` of this rank's time on work between messages (a model of computing)."""
        self.me.clock = max(self.me.clock, self.world.now) + seconds * self.me.slowdown

    def overwrite(self, buf: np.ndarray) -> None:
        """This rank writes all of `buf` now, its copying priced apart (`elapse`): only what writing
        lines that ranks on other cores have read adds (`_rewrite_seconds`)."""
        if self.world.unpaid:
            me = self.me
            me.clock = max(me.clock, self.world.now) + _rewrite_seconds(self.world, buf) * me.slowdown

    def leave_barrier(self, parent: int | None, children: Sequence[int], latency: float) -> None:
        """Leave a barrier that releases ranks down a tree (MPICH's: each rank waits for its
        `parent` to have left, then releases its `children`), `latency` seconds a hand-on. A rank
        waiting there holds no core (the next rank to take it pays no switch), and its timer
        (`SimWorld.finish_times`) starts when it leaves. Group ranks; once per run of the world."""
        world, me = self.world, self.me
        if parent is not None:
            release = world.release_request(me, self.group.world_ranks[parent])
            me.in_barrier = True
            try:
                self.wait_all([release], math.inf)
            finally:
                me.in_barrier = False
        me.clock = max(me.clock, world.now)
        me.started_at = me.clock
        for child in children:
            owner = world.ranks[self.group.world_ranks[child]]
            world._push(me.clock + latency, _COMPLETE, world.release_request(owner, me.rank))

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        return self._send(buf, peer, tag, None)

    def sendrecv(self, send_buf: np.ndarray | None, dst: int, recv_buf: np.ndarray | None, src: int,
                 tag: int, deadline: float, reducer: Reducer | None = None) -> None:
        """A send and a receive posted together (either may be None: one alone). On a network with
        `exchange_route` (a transport that does the pair as one step, as shm's sendrecv through its
        slots), the send takes that route and neither side pays a post: the route's α is the whole
        measured step. In place (`recv_buf is send_buf`): up to the network's
        `in_place_exchange_bytes` (shm: one slot, copied out at once) the send's bytes leave the
        buffer when posted (a real buffer's are copied then); above, from a fresh scratch copy."""
        if send_buf is None or recv_buf is None:
            requests = []
            if send_buf is not None:
                requests.append(self._send(send_buf, dst, tag, None))
            if recv_buf is not None:
                requests.append(self._post_recv(recv_buf, src, tag, reducer))
            self.wait_all(requests, deadline)
            return
        if recv_buf is send_buf:
            limit = getattr(self.world.network, "in_place_exchange_bytes", 0)
            if send_buf.nbytes > limit or not (is_symbolic(send_buf) or send_buf.nbytes <= REAL_COPY_BYTES):
                send_buf = np.empty_like(recv_buf)   # a scratch buffer: its first touch, then the copy
                np.copyto(send_buf, recv_buf)
        world = self.world
        fused = None
        if world.fuses_exchanges:
            written = world.written is not None and id(root_of(send_buf)) in world.written
            after_work, self.me.after_work = self.me.after_work, False
            # a reducer that reads a third buffer (`Op.from_source`) is priced apart
            reducing = "source" if getattr(reducer, "reads_source", False) else reducer is not None
            fused = world.exchange_route(self.me.rank, self.group.world_ranks[dst], send_buf.nbytes,
                                         reducing, written, after_work)
        send = self._send(send_buf, dst, tag, fused)
        receive = self._post_recv(recv_buf, src, tag, reducer, post=fused is None)
        self.me.in_sendrecv = fused is not None
        try:
            self.wait_all([send, receive], deadline)
        finally:
            self.me.in_sendrecv = False

    def _send(self, buf: np.ndarray, peer: int, tag: int, route: Route | None) -> Request:
        world, me = self.world, self.me
        dst = self.group.world_ranks[peer]
        if world.symmetry is None:
            receiver, key = world.ranks[dst], (self.group.id, self.rank, tag)
        else:   # a representative receives it, as from the sender's image
            receiver, key = world.target(self.group, me.rank, dst, tag)
        fused = route   # a sendrecv's send on the network's exchange route (priced as the whole step)
        if route is None:
            me.clock = max(me.clock, world.now) + world.post_seconds * me.slowdown
            written = world.written is not None and id(root_of(buf)) in world.written
            route = world._routes.get((me.rank, dst)) or world.route(me.rank, dst, buf.nbytes, written)
        else:   # the fused step's own copying in
            me.clock = max(me.clock, world.now) + route.send_busy * me.slowdown
        request = _SimRequest("send", peer, tag, buf, me)
        data = None
        if not is_symbolic(buf):
            data = buf.copy() if buf.nbytes <= REAL_COPY_BYTES else buf
        message = _Message(request, route, data, me)
        waiting = receiver.unmatched_recvs.get(key)
        if waiting:
            self._match(message, waiting.popleft())
        else:
            queue = receiver.unmatched_sends.get(key)
            if queue is None:
                receiver.unmatched_sends[key] = deque((message,))
            else:
                queue.append(message)
        world.post_send(message)
        if fused is None and route.eager:
            # the message left at its post (its timing is the route's); the sender is still copying
            # (and, a route's own `send_busy` beside, what its copy costs on that route)
            busy = route.send_busy
            if world.send_busy_seconds is not None:
                busy += world.send_busy_seconds(buf.nbytes)
            me.clock += busy * me.slowdown
        return request

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        return self._post_recv(buf, peer, tag, None)

    def irecv_reduce(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer) -> Request:
        return self._post_recv(buf, peer, tag, reducer)

    def _post_recv(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer | None,
                   post: bool = True) -> Request:
        me = self.me
        if self.world.written is not None:
            _written(buf, pays=False)   # what arrives is written into it by this rank (when it lands)
        me.clock = max(me.clock, self.world.now) + (self.world.post_seconds * me.slowdown if post else 0.0)
        request = _SimRequest("recv", peer, tag, buf, me, reducer)
        # with a symmetry, senders are named by world rank (`SimWorld.target`)
        key = (self.group.id, peer if self.world.symmetry is None else self.group.world_ranks[peer], tag)
        sent = me.unmatched_sends.get(key)
        if sent:
            self._match(sent.popleft(), request)
        else:
            queue = me.unmatched_recvs.get(key)
            if queue is None:
                me.unmatched_recvs[key] = deque((request,))
            else:
                queue.append(request)
        return request

    def _match(self, message: _Message, recv: _SimRequest) -> None:
        if message.send.nbytes != recv.nbytes:
            raise CollectiveMismatch(
                f"sim: world rank {recv.owner.rank} posted a receive of {recv.nbytes} B from rank "
                f"{recv.peer} (tag {recv.tag}) but rank {message.sender.rank} sent {message.send.nbytes} B")
        message.recv = recv
        if message.parked:   # its sender's port was waiting for this receive
            message.parked = False
            self.world._push(max(recv.posted, self.world.now), _PORT_START, message)
        if message.arrived is not None:
            self.world.deliver(message)

    def wait_all(self, requests: Sequence[Request], deadline: float) -> None:
        me = self.me
        while True:
            for request in requests:   # bytes this rank copies itself, one message after another
                pulled = getattr(request, "pulled", None)
                if pulled is not None:
                    request.pulled = None
                    start = max(me.clock, self.world.now)
                    alone, contended, completes = pulled
                    if contended is not None:
                        me.clock = self.world.pull(start, alone, contended, completes)
                    else:   # its own copy: a fused exchange's
                        me.clock = start + alone
                        if completes is not None:
                            self.world._push(me.clock, _COMPLETE, completes)
            outstanding = 0
            for request in requests:
                if not request.done:
                    request.watched = True
                    outstanding += 1
            if not outstanding:
                return
            me.outstanding = outstanding
            self.world.block(me)
            for request in requests:
                request.watched = False

    def subgroup(self, ranks: Sequence[int], exchange: Exchange) -> Transport | None:
        # No exchange is needed in one process: every member derives the same key for the group.
        calls = self.group.splits.get(self.me.rank, 0)
        self.group.splits[self.me.rank] = calls + 1
        if not ranks:
            return None
        child = self.world.group(self.group, calls, tuple(ranks), [self.group.world_ranks[r] for r in ranks])
        return SimTransport(self.world, child, list(ranks).index(self.rank))

    def abort(self, reason: str) -> None:
        if self.world.failure is None:
            self.world.failure = CommunicatorAborted(reason)
