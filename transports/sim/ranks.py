"""The `sim` transport's per-rank state: requests and messages in flight, each rank's fiber (a
thread or a greenlet) and, with time sharing, which rank holds which core."""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..base import Reducer, Request
from .network import Route, TimeSharing

if TYPE_CHECKING:
    from .world import SimWorld

try:   # optional: greenlets switch ~20x faster than threads; without them every rank is a thread
    import greenlet as _greenlet
except ImportError:  # pragma: no cover - depends on the environment
    _greenlet = None


class _SimRequest(Request):
    __slots__ = ("owner", "watched", "buf", "reducer", "posted", "key", "pulled")

    def __init__(self, kind: str, peer: int, tag: int, buf: np.ndarray, owner: _Rank,
                 reducer: Reducer | None = None) -> None:
        self.kind = kind
        self.peer = peer
        self.tag = tag
        self.nbytes = buf.nbytes
        self.done = False
        self.owner = owner
        self.watched = False
        self.buf = buf
        self.reducer = reducer
        self.posted = owner.clock
        # work the owner does when it runs: (seconds alone, seconds while another rank pulls, the
        # request it completes or None); contended None: its own copy, which no other pull slows
        self.pulled: tuple[float, float | None, _SimRequest | None] | None = None


class _Message:
    """A send in flight: its route, its progress through the links, and the receive it matched."""

    __slots__ = ("send", "recv", "route", "data", "arrived", "remaining", "rate", "since", "version",
                 "posted", "sender", "parked", "staged")

    def __init__(self, send: _SimRequest, route: Route, data: np.ndarray | None, sender: _Rank) -> None:
        self.send = send
        self.recv: _SimRequest | None = None
        self.route = route
        self.data = data
        self.arrived: float | None = None
        self.remaining = float(send.nbytes) * route.byte_weight
        self.rate = 0.0
        self.since = 0.0
        self.version = 0
        self.posted = send.posted
        self.sender = sender
        self.parked = False    # a rendezvous message whose port is ready, waiting for its receive
        self.staged = False    # in its route's second stage (`Route.then`): its port is free again


class _Port:
    __slots__ = ("busy", "queue")

    def __init__(self) -> None:
        self.busy = False
        self.queue: deque[_Message] = deque()


# event kinds
_PORT_START, _FLOW_DONE, _COMPLETE, _CORE_FREE = range(4)


class _Rank:
    """One world rank's state: its clock, its ports, its unmatched sends and receives, its thread."""

    def __init__(self, world: SimWorld, rank: int) -> None:
        self.world = world
        self.rank = rank
        self.clock = 0.0
        self.slowdown = 1.0
        self.core: int | None = None  # with time sharing: the core it runs (or spins) on
        self.wake = 0.0               # and what getting it back costs when it resumes
        self.started_at = 0.0         # with time sharing: when it first got a core
        self.in_sendrecv = False      # waits in a fused sendrecv (its spin may differ)
        self.in_barrier = False       # waits to leave a barrier (`SimTransport.leave_barrier`)
        self.released: _SimRequest | None = None   # and what its parent there completes
        self.after_work = False       # its last operation copied, reduced or received a lot
        self.outstanding = 0          # watched requests not yet done while blocked
        self.fiber = None             # its thread's lock, or its greenlet
        self.started = False
        self.ports: dict[str, _Port] = {}
        self.unmatched_sends: dict[tuple, deque[_Message]] = {}   # by (group, source, tag)
        self.unmatched_recvs: dict[tuple, deque[_SimRequest]] = {}
        self.result: object = None
        self.finished = False


class _Threads:
    """Each rank a thread parked on its own lock; the baton (one lock released) lets one run."""

    def __init__(self, stack_bytes: int) -> None:
        self.stack_bytes = stack_bytes
        self.main = threading.Lock()
        self.main.acquire()
        self.threads: list[threading.Thread] = []

    def start(self, ranks: list[_Rank], targets: list[Callable[[], None]]) -> None:
        previous = threading.stack_size(self.stack_bytes)
        try:
            for rank, target in zip(ranks, targets, strict=True):
                rank.fiber = threading.Lock()
                rank.fiber.acquire()
                self.threads.append(threading.Thread(target=self._body, args=(rank.fiber, target),
                                                     daemon=True, name=f"sim-{rank.rank}"))
        finally:
            threading.stack_size(previous)
        for thread in self.threads:
            thread.start()

    def _body(self, lock: threading.Lock, target: Callable[[], None]) -> None:
        lock.acquire()
        target()
        self.main.release()   # a finished rank hands control back to run()

    def resume(self, rank: _Rank) -> None:
        """From run(): let `rank` go, and wait until control comes back."""
        rank.fiber.release()
        self.main.acquire()

    def switch(self, rank: _Rank, following: _Rank | None) -> None:
        """From `rank`'s thread: let `following` (or run()) go, and park until resumed."""
        (self.main if following is None else following.fiber).release()
        rank.fiber.acquire()

    def close(self) -> None:
        for thread in self.threads:
            thread.join(timeout=10)


class _Greenlets:
    """Each rank a greenlet in the caller's thread: a switch costs well under a microsecond."""

    def start(self, ranks: list[_Rank], targets: list[Callable[[], None]]) -> None:
        self.main = _greenlet.getcurrent()
        for rank, target in zip(ranks, targets, strict=True):
            rank.fiber = _greenlet.greenlet(target, parent=self.main)

    def resume(self, rank: _Rank) -> None:
        rank.fiber.switch()

    def switch(self, rank: _Rank, following: _Rank | None) -> None:
        (self.main if following is None else following.fiber).switch()

    def close(self) -> None:
        return None


class _Cores:
    """Which rank holds which core, and from when each core is free for another rank to take."""

    def __init__(self, sharing: TimeSharing) -> None:
        self.sharing = sharing
        self.free = [0.0] * sharing.cores             # inf while its rank runs
        self.owner: list[_Rank | None] = [None] * sharing.cores

    def claim(self, rank: _Rank, now: float) -> bool:
        """Whether `rank` can run at `now`: on the core it still spins on, or on a core that is free
        (yielded: its clock pays the wake-up; idle: nothing). False: no core until `next_free`."""
        core = rank.core
        if core is not None and self.owner[core] is rank and now <= self.free[core]:
            self.free[core] = math.inf
            return True
        placement = self.sharing.placement
        core = placement[rank.rank] if placement else min(range(len(self.free)), key=self.free.__getitem__)
        if self.free[core] > now:
            return False
        previous = self.owner[core]
        if previous is not None:
            previous.core = None
            wake = self.sharing.sendrecv_wake if rank.in_sendrecv else None
            rank.wake = self.sharing.wake if wake is None else wake
        self.owner[core], self.free[core], rank.core = rank, math.inf, core
        return True

    def next_free(self, rank: _Rank | None = None) -> float:
        """When a core (`rank`'s own, if ranks are placed) is free next (while every rank that holds
        one waits or spins)."""
        placement = self.sharing.placement
        return self.free[placement[rank.rank]] if placement and rank is not None else min(self.free)

    def release(self, rank: _Rank, now: float, returned: bool = False) -> None:
        """`rank` waits (or has `returned`: `colls bench` then waits at its barrier) from `now`;
        it keeps its core `spin` longer (or the spin of that wait)."""
        if rank.core is not None and rank.in_barrier:
            # a rank that has not left the barrier yet holds nothing: the next to take its core
            # finds it idle (no switch to pay)
            self.free[rank.core], self.owner[rank.core], rank.core = now, None, None
        elif rank.core is not None:
            spin = (self.sharing.returned_spin if returned
                    else self.sharing.sendrecv_spin if rank.in_sendrecv else None)
            self.free[rank.core] = now + (self.sharing.spin if spin is None else spin)


@dataclass
class _Group:
    id: int
    world_ranks: list[int]
    splits: dict[int, int] = field(default_factory=dict)   # world rank -> subgroup calls made
    # with a `Symmetry`: (parent's label, calls, frozenset of world ranks), the world's (); and
    # whether a member made it (its ranks' order is then known), not only a sender to its image
    label: tuple = ()
    made: bool = True
