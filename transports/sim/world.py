"""The `sim` transport's scheduler: `SimWorld`, a discrete-event simulation in virtual time.

It runs every rank's body in its own fiber, one at a time, processes port, flow and completion
events in time order, shares links fairly among the flows crossing them, and delivers messages to
their matched receives.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable

import numpy as np

from ..errors import CommunicatorAborted
from .network import Link, Route
from .ranks import (
    _COMPLETE,
    _CORE_FREE,
    _FLOW_DONE,
    _PORT_START,
    _Cores,
    _greenlet,
    _Greenlets,
    _Group,
    _Message,
    _Port,
    _Rank,
    _SimRequest,
    _Threads,
)
from .symbolic import _RUNNING, _rewrite_seconds, is_symbolic, root_of
from .symmetry import NotSymmetric, Symmetry
from .transport import SimTransport

# what a network may say of its machine beyond links and routes; a symmetry supports none of them
_EXTRAS = {"route_for", "exchange_route", "time_sharing", "tracks_writes", "rewrite_seconds",
           "alloc_seconds_per_byte", "post_seconds", "send_busy_seconds", "receive_reduce_seconds",
           "reduce_call_seconds", "copy_call_seconds", "after_work_bytes", "in_place_exchange_bytes"}


class SimulationFailed(RuntimeError):
    """The simulated program deadlocked or one of its ranks raised."""


class SimWorld:
    """A simulated cluster of `size` ranks over `network`; `run(body)` runs body(transport) on each.

    `gamma`: seconds per byte reduced; `copy_seconds_per_byte`: per byte copied by algorithm code;
    `slowdown[rank]`: a factor on that rank's α, γ and copies (a straggler); `threads`: run the
    ranks as threads even where greenlet is installed (`COLLS_SIM_THREADS`, read by `colls plan`);
    `symmetry`: run only ranks 0 .. symmetry.period-1, the others being their relabelled images
    (`transports.sim.symmetry`; `ranks`, `run`'s results and `finish_times` are theirs only).
    """

    def __init__(self, size: int, network, gamma: float = 0.0, copy_seconds_per_byte: float = 0.0,
                 slowdown: dict[int, float] | None = None, threads: bool = False,
                 symmetry: Symmetry | None = None) -> None:
        self.size = size
        self.threads = threads
        self.network = network
        self.gamma = gamma
        self.copy_seconds_per_byte = copy_seconds_per_byte
        self.now = 0.0
        if symmetry is not None and (symmetry.size != size or slowdown or _EXTRAS & set(dir(network))):
            raise NotSymmetric(f"{symmetry} does not fit {size} ranks with a straggler or this network")
        self.symmetry = symmetry
        self.ranks = [_Rank(self, r) for r in range(size if symmetry is None else symmetry.period)]
        for rank, factor in (slowdown or {}).items():
            self.ranks[rank].slowdown = factor
        self._events: list[tuple] = []
        self._sequence = itertools.count()
        self._runnable: deque[_Rank] = deque()
        self._dirty: set[Link] = set()
        self._routes: dict[tuple[int, int], Route] = {}
        self._groups: dict[tuple, _Group] = {}
        self._images: dict[tuple[int, int], int] = {}   # (group id, k) -> id of its image by k
        self._pulls: list[float] = []   # when the pulls (copies by receivers) in progress end
        # buffers written in this run (reduced into, copied into, received into), by their root's
        # id, when the network routes messages from written buffers apart (`route_for(..., written)`)
        self.written: dict[int, np.ndarray] | None = {} if getattr(network, "tracks_writes", False) else None
        # a network that prices writing lines another core has just read (`rewrite_seconds(bytes)`):
        # the bytes of each buffer (by its root's id: [root, bytes]) that ranks on other cores read
        # in this run, and, seeded from an earlier call's reads, [bytes read, bytes not yet rewritten]
        # of buffers this run writes again (`colls.plan.calibrate.predict`)
        self.rewrite_seconds = getattr(network, "rewrite_seconds", None)
        self.read_by_peers: dict[int, list] | None = {} if self.rewrite_seconds is not None else None
        self.unpaid: dict[int, list[int]] = {}
        # what the network says of its machine beyond links: a cost per byte of a new buffer (by
        # size; page faults of a fresh mapping), software per posted message, fewer cores than ranks
        self.alloc_seconds_per_byte = getattr(network, "alloc_seconds_per_byte", None)
        self.post_seconds = getattr(network, "post_seconds", 0.0)   # a rank's own work per send/receive
        # and, by size, what a send copied into a buffer (an eager route) keeps its sender busy
        # beyond that post: the shm transport copies a FIFO message in inside `isend`
        self.send_busy_seconds = getattr(network, "send_busy_seconds", None)
        # and per reducing receive, beyond γ per byte (the reducer's call)
        self.receive_reduce_seconds = getattr(network, "receive_reduce_seconds", 0.0)
        # and per sum or copy in algorithm code, beyond γ or the copy's cost per byte (numpy's call)
        self.reduce_call_seconds = getattr(network, "reduce_call_seconds", 0.0)
        self.copy_call_seconds = getattr(network, "copy_call_seconds", 0.0)
        # from how many bytes a copy, reduction or receive makes the sendrecv after it dearer (the
        # network's `exchange_route(..., after_work=True)`); None: never
        self.after_work_bytes = getattr(network, "after_work_bytes", None)
        # a transport that does a send and a receive posted together as one step (`exchange_route`)
        self.fuses_exchanges = callable(getattr(network, "exchange_route", None))
        sharing = getattr(network, "time_sharing", None)
        self._cores = _Cores(sharing) if sharing is not None and sharing.cores < size else None
        self.failure: BaseException | None = None
        self.messages = 0

    # -- running ---------------------------------------------------------------------------------

    def run(self, body: Callable[[SimTransport], object], stack_bytes: int = 256 << 10) -> list[object]:
        """Run `body(transport)` on every rank to completion; returns their results in rank order."""
        group = _Group(0, list(range(self.size)))
        transports = [SimTransport(self, group, r) for r in range(len(self.ranks))]
        use_threads = _greenlet is None or self.threads
        self._fibers = _Threads(stack_bytes) if use_threads else _Greenlets()
        self._fibers.start(self.ranks, [functools.partial(self._rank_main, rank, body, transport)
                                        for rank, transport in zip(self.ranks, transports, strict=True)])
        self._runnable.extend(self.ranks)
        try:
            while True:
                following = self._next_runnable() if self.failure is None else self._next_stuck()
                if following is None:
                    stuck = [rank.rank for rank in self.ranks if not rank.finished]
                    if not stuck:
                        break
                    self.failure = SimulationFailed(f"deadlock at t={self.now:.6g} s: {len(stuck)} ranks "
                                                    f"wait forever, first {stuck[:8]}")
                    continue
                self._fibers.resume(following)
        finally:
            self._fibers.close()
            _RUNNING[0] = None
        if self.failure is not None:
            raise self.failure
        return [rank.result for rank in self.ranks]

    @property
    def finish_times(self) -> list[float]:
        """Each rank's virtual clock when its body returned; with time sharing, less the time it
        first ran (a rank that waited for a core only starts its own timer then, as in a benchmark)."""
        return [rank.clock - rank.started_at for rank in self.ranks]

    def _rank_main(self, rank: _Rank, body: Callable, transport: SimTransport) -> None:
        _RUNNING[0] = rank
        rank.started = True
        self._woken(rank)
        if self._cores is not None:
            rank.started_at = rank.clock
        try:
            if self.failure is None:
                rank.result = body(transport)
        except CommunicatorAborted:
            pass
        except BaseException as error:  # handed to run()'s caller
            if self.failure is None:
                self.failure = error
        rank.finished = True
        rank.clock = max(rank.clock, self.now)
        if self._cores is not None:
            self._cores.release(rank, rank.clock, returned=True)

    def _woken(self, rank: _Rank) -> None:
        """A rank that took a core another rank had yielded pays the wake-up (time sharing)."""
        rank.clock = max(rank.clock, self.now) + rank.wake
        rank.wake = 0.0

    def _next_stuck(self) -> _Rank | None:
        """After a failure: an unfinished rank to resume so that it raises and ends."""
        return next((rank for rank in self.ranks if not rank.finished), None)

    def block(self, rank: _Rank) -> None:
        """`rank` waits: hand the baton straight to the next runnable rank, return when resumed."""
        if self._cores is not None:
            self._cores.release(rank, rank.clock)
        following = self._next_runnable() if self.failure is None else None
        if following is not None and not following.started:
            # a rank starts from run(), not from deep in another rank's stack (greenlets would
            # otherwise stack their recursion depths)
            self._runnable.appendleft(following)
            following = None
        if following is not rank:
            self._fibers.switch(rank, following)   # None: back to run(), which ends the run
        _RUNNING[0] = rank
        if self.failure is not None:
            raise CommunicatorAborted(f"simulation stopped: {self.failure}")
        rank.clock = max(rank.clock, self.now)
        self._woken(rank)

    def _next_runnable(self) -> _Rank | None:
        """Process events in virtual-time order until a rank can run; None when nothing is left."""
        events = self._events
        while True:
            if self._runnable:
                rank = self._runnable.popleft()
                if self._cores is None or self._cores.claim(rank, self.now):
                    return rank
                self._push(self._cores.next_free(rank), _CORE_FREE, rank)   # no core for it yet
                continue
            if events and events[0][0] <= self.now:
                _, _, kind, what, version = heapq.heappop(events)
                if kind == _CORE_FREE:
                    self._runnable.append(what)
                elif kind == _FLOW_DONE:
                    if what.version == version:
                        self._end_flow(what)
                elif kind == _PORT_START:
                    self._start_flow(what)
                else:
                    self._done_request(what)
            elif self._dirty:
                self._update_rates()
            elif events:
                self.now = events[0][0]
            else:
                return None

    def _push(self, time: float, kind: int, what, version: int = 0) -> None:
        heapq.heappush(self._events, (time, next(self._sequence), kind, what, version))

    # -- messages --------------------------------------------------------------------------------

    def route(self, src: int, dst: int, nbytes: int = 0, written: bool = False) -> Route:
        """The (cached) route from world rank `src` to `dst`; a network with `route_for(src, dst,
        nbytes)` (protocols chosen by message size, as shared memory's) routes each size apart, and
        one that `tracks_writes` also a message from a buffer its sender wrote in this run."""
        sized = getattr(self.network, "route_for", None)
        key = (src, dst) if sized is None else (src, dst, nbytes, written)
        route = self._routes.get(key)
        if route is None:
            if self.symmetry is not None:
                route = self.symmetry.route(self.network, src, dst)
            elif sized is None:
                route = self.network.route(src, dst)
            else:
                route = sized(src, dst, nbytes, written) if written else sized(src, dst, nbytes)
            self._routes[key] = route
        return route

    def exchange_route(self, src: int, dst: int, nbytes: int, reducing: bool | str, written: bool,
                       after_work: bool = False) -> Route | None:
        """The (cached) route of a send made in a sendrecv (whose receive is `reducing` or not, from
        a buffer the sender has `written` in this run or not, right `after_work` of the sender's
        or not), from the network's `exchange_route`; None: the network prices it as any other
        message."""
        key = ("sendrecv", src, dst, nbytes, reducing, written, after_work)
        if key not in self._routes:
            self._routes[key] = self.network.exchange_route(src, dst, nbytes, reducing, written, after_work)
        return self._routes[key]

    def post_send(self, message: _Message) -> None:
        """Queue `message` on its sender's port; the port sends one message at a time."""
        sender = message.sender
        if message.route.eager:
            message.send.done = True
        port = sender.ports.get(message.route.port)
        if port is None:
            port = sender.ports[message.route.port] = _Port()
        if port.busy:
            port.queue.append(message)
        else:
            port.busy = True
            self._push(max(message.posted, self.now) + message.route.alpha * sender.slowdown,
                       _PORT_START, message)

    def _start_flow(self, message: _Message) -> None:
        if message.route.rendezvous and message.recv is None:
            message.parked = True   # SimTransport._match starts it when the receive comes
            return
        self.messages += 1
        self._flow(message)

    def _flow(self, message: _Message) -> None:
        """Put `message`'s bytes on its route's links from now (its end is an event)."""
        message.since = self.now
        if message.remaining <= 0 or not message.route.links:
            self._end_flow(message)
            return
        alone = True
        for link in message.route.links:
            link.flows.add(message)
            if len(link.flows) > 1:
                alone = False
                self._dirty.add(link)
        if alone:   # the common case: nobody to share with, so no fair shares to work out
            message.rate = min(link.capacity for link in message.route.links)
            message.version += 1
            self._push(self.now + message.remaining / message.rate, _FLOW_DONE, message, message.version)

    def _update_rates(self) -> None:
        """New fair shares for the flows on links whose set of flows changed at this instant."""
        now = self.now
        affected: set[_Message] = set()
        for link in self._dirty:
            affected.update(link.flows)
        self._dirty.clear()
        for message in affected:
            rate = math.inf
            for link in message.route.links:
                share = link.capacity / len(link.flows)
                if share < rate:
                    rate = share
            if rate == message.rate:
                continue
            message.remaining = max(0.0, message.remaining - message.rate * (now - message.since))
            message.since = now
            message.rate = rate
            message.version += 1
            self._push(now + message.remaining / rate, _FLOW_DONE, message, message.version)

    def _end_flow(self, message: _Message) -> None:
        now = self.now
        for link in message.route.links:
            flows = link.flows
            if message in flows:
                flows.discard(message)
                if flows:
                    self._dirty.add(link)
        message.version += 1
        route = message.route
        if route.then is not None and not message.staged:
            # the first stage is over: the port is free for the next message, the bytes go on
            self._release_port(message)
            message.staged = True
            message.route = route.then
            message.remaining = float(message.send.nbytes) * route.then.byte_weight
            message.rate = 0.0   # no share yet on the new links (`_update_rates` sets one)
            self._flow(message)
            return
        if not route.pull:   # a pulled message's send ends when its receiver has copied it
            self._done_request(message.send)
        if not message.staged:
            self._release_port(message)
        message.arrived = now
        if message.recv is not None:
            self.deliver(message)

    def _release_port(self, message: _Message) -> None:
        """`message` has left its sender's port: start the next one queued there."""
        port = message.sender.ports[message.route.port]
        if port.queue:
            following = port.queue.popleft()
            self._push(max(following.posted, self.now) + following.route.alpha * message.sender.slowdown,
                       _PORT_START, following)
        else:
            port.busy = False

    def deliver(self, message: _Message) -> None:
        """The message has arrived and its receive is posted: complete the receive (γ later if reducing)."""
        recv = message.recv
        done = max(message.arrived, recv.posted)
        # the receiver's own work on what lands: its reduction, and writing it into lines ranks on
        # other cores read in the call before
        work = ((recv.nbytes * self.gamma + self.receive_reduce_seconds) * recv.owner.slowdown
                if recv.reducer is not None else 0.0)
        route = message.route
        if self.after_work_bytes is not None and recv.nbytes >= self.after_work_bytes:
            recv.owner.after_work = True
        if self.unpaid:
            work += _rewrite_seconds(self, recv.buf) * recv.owner.slowdown
        if route.pull:   # the receiver copies (and reduces) when it runs again
            per_byte = recv.nbytes * recv.owner.slowdown
            recv.pulled = (per_byte * route.pull + work,
                           per_byte * (route.pull_contended or route.pull) + work, message.send)
        elif route.receive_busy:   # a fused exchange: it copies out (and reduces) on its own core
            recv.pulled = (route.receive_busy * recv.owner.slowdown + work, None, None)
        else:
            done += work
        if self.read_by_peers is not None and route.reads_sender and self._apart(message.sender, recv.owner):
            root = root_of(message.send.buf)
            self.read_by_peers.setdefault(id(root), [root, 0])[1] += recv.nbytes
        if message.data is not None and not is_symbolic(recv.buf) and recv.nbytes:
            incoming = message.data.reshape(-1).view(np.uint8).view(recv.buf.dtype)
            if recv.reducer is None:
                np.copyto(recv.buf, incoming)
            else:
                recv.reducer(recv.buf, incoming)
        if done <= self.now:
            self._done_request(recv)
        else:
            self._push(done, _COMPLETE, recv)

    def _apart(self, one: _Rank, other: _Rank) -> bool:
        """Whether two ranks run on different cores (one core each, placed apart, or last seen so)."""
        if self._cores is None:
            return True
        placement = self._cores.sharing.placement
        if placement:
            return placement[one.rank] != placement[other.rank]
        return one.core is None or other.core is None or one.core != other.core

    def pull(self, start: float, alone: float, contended: float, send: _SimRequest) -> float:
        """A receiver's copy from `start`: `alone` seconds, or `contended` if another one is running
        then; completes `send` when it ends, which it returns."""
        self._pulls = [end for end in self._pulls if end > start]
        end = start + (contended if self._pulls else alone)
        self._pulls.append(end)
        self._push(end, _COMPLETE, send)
        return end

    def _done_request(self, request: _SimRequest) -> None:
        request.done = True
        if not request.watched:
            return
        owner = request.owner
        owner.outstanding -= 1
        if owner.outstanding == 0 or (request.pulled is not None and owner.outstanding > 0):
            # all it waits for is here, or bytes it must copy itself (it does so, then waits on)
            owner.outstanding = 0
            self._runnable.append(owner)


    def release_request(self, owner: _Rank, parent: int) -> _SimRequest:
        """What `owner` waits on to leave a barrier, completed by its `parent` (world ranks)."""
        if owner.released is None:
            owner.released = _SimRequest("recv", parent, -1, np.empty(0, np.uint8), owner)
        return owner.released

    def group(self, parent: _Group, calls: int, ranks: tuple[int, ...], world_ranks: list[int]) -> _Group:
        """The sub-group of `parent` made by its members' call number `calls` over `ranks` (of the
        parent), made on first use; with a symmetry, the one its label names."""
        if self.symmetry is None:
            key = (parent.id, calls, ranks)
        else:
            key = (parent.label, calls, frozenset(world_ranks))
        found = self._groups.get(key)
        if found is None:
            found = self._groups[key] = _Group(len(self._groups) + 1, world_ranks, label=key)
        elif not found.made:   # made as a message's image: now its order is known
            found.world_ranks, found.made = world_ranks, True
        elif self.symmetry is not None and found.world_ranks != world_ranks:
            raise NotSymmetric(f"two orders of one group of {len(world_ranks)} ranks")
        return found

    def target(self, group: _Group, src: int, dst: int, tag: int) -> tuple[_Rank, tuple]:
        """With a symmetry: the representative that receives what world rank `src` sends to world
        rank `dst` in `group`, and the key it receives it under (its image of the group, the
        sender's image, the tag)."""
        symmetry = self.symmetry
        rep, k = symmetry.locate(dst)
        if k == 0:
            return self.ranks[rep], (group.id, src, tag)
        back = symmetry.inverse(k)
        image = self._images.get((group.id, back)) if group.label else group.id   # (): the world
        if image is None:
            label = symmetry.image_label(group.label, back)
            found = self._groups.get(label)
            if found is None:
                members = sorted(label[2])
                found = self._groups[label] = _Group(len(self._groups) + 1, members, label=label,
                                                     made=False)
            image = self._images[(group.id, back)] = found.id
        return self.ranks[rep], (image, symmetry.apply(back, src), tag)
