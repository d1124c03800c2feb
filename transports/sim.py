"""The `sim` transport: the registered algorithms, unchanged, on a simulated cluster with virtual clocks.

Every rank runs the real algorithm code in its own thread, but only one thread runs at a time: a
discrete-event scheduler keyed on virtual time resumes a rank when what it waits for has completed,
and the rank runs until its next wait that cannot be satisfied yet (then it hands the baton straight
to the next runnable rank, so each resumption costs one thread switch).

Buffers may be *symbolic* (`symbolic(count, dtype)`): stride-0 views of one element, so a 1 GiB
buffer costs no memory; slicing, `np.empty_like` and `np.copyto` on them cost nothing real, and a
ufunc on them (an `Op` reducing) only charges γ per byte to the running rank's clock. Real (small)
buffers are delivered and reduced for real, so data-dependent control flow (a count exchanged first)
still works.

The cost model, stated (Thakur, Rabenseifner & Gropp 2005's α-β-γ, plus links):
- A rank sends from one *port* per route class ("intra" inside a node, "net" through its NIC), one
  message at a time in posting order (the single-port model): the port is busy α, then the bytes
  flow through every link of the route.
- Links are shared: each link splits its capacity equally among the flows crossing it, and a flow
  moves at the smallest share along its route (a local fair share, exact when flows meet at one
  bottleneck; it does not hand a flow's unused share to others as max-min fairness would).
- A receive completes when its data has arrived and it was posted; a receive-reduce γ·bytes later.
- Charges of γ (reductions in algorithm code) and of copies advance the running rank's own clock.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .base import Exchange, Reducer, Request, Transport
from .errors import CollectiveMismatch, CommunicatorAborted

try:   # optional: greenlets switch ~20x faster than threads; without them every rank is a thread
    import greenlet as _greenlet
except ImportError:  # pragma: no cover - depends on the environment
    _greenlet = None

REAL_COPY_BYTES = 1 << 20   # real send buffers up to this size are copied at post (eager semantics)


# -- symbolic buffers ---------------------------------------------------------------------------

class SymbolicArray(np.ndarray):
    """A buffer with a size and a dtype but no data: every element aliases one element."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        # an Op combining two buffers: charge γ per byte of the result, compute nothing
        target = out[0] if out else next(x for x in inputs if isinstance(x, SymbolicArray))
        _charge(target.nbytes, "gamma")
        if out:
            _written(target)
        return target if out else symbolic(target.size, target.dtype).reshape(target.shape)

    def __array_function__(self, func, types, args, kwargs):
        if func is np.copyto:
            _charge(args[0].nbytes, "copy")
            _written(args[0])
            return None
        if func is np.take:   # a gather of blocks (bruck's packing): a copy of what it takes
            taken = kwargs.get("out")
            if taken is None:   # as symbolic as its source: a shape, no memory
                source, indices = args[0], np.shape(args[1])
                axis = kwargs.get("axis", args[2] if len(args) > 2 else None)
                axis = None if axis is None else axis % source.ndim
                shape = (indices if axis is None
                         else (*source.shape[:axis], *indices, *source.shape[axis + 1:]))
                taken = symbolic(int(np.prod(shape, dtype=np.int64)), source.dtype).reshape(shape)
            _charge(taken.nbytes, "copy")
            _written(taken)
            return taken
        if func in _LIKE:
            prototype = args[0]
            position = 2 if func is np.full_like else 1
            dtype = kwargs.get("dtype") or (args[position] if len(args) > position else None)
            shape = kwargs.get("shape")
            shape = prototype.shape if shape is None else tuple(np.atleast_1d(shape).tolist())
            made = symbolic(int(np.prod(shape, dtype=np.int64)), dtype or prototype.dtype).reshape(shape)
            _charge(made.nbytes, "alloc")   # a fresh buffer's first touch (page faults), if modelled
            return made
        if func in (np.may_share_memory, np.shares_memory):
            return False
        return super().__array_function__(func, types, args, kwargs)

    def __setitem__(self, key, value) -> None:
        _charge(getattr(value, "nbytes", 0), "copy")   # nothing to write into
        _written(self)

    def copy(self, order="C") -> SymbolicArray:  # noqa: ARG002 - numpy's signature
        """Another symbolic buffer of the same shape (no data to copy)."""
        _charge(self.nbytes, "copy")
        return symbolic(self.size, self.dtype).reshape(self.shape)


_LIKE = (np.empty_like, np.zeros_like, np.ones_like, np.full_like)


def symbolic(count: int, dtype=np.float32) -> SymbolicArray:
    """A 1-D symbolic buffer of `count` elements of `dtype`: costs one element of memory."""
    one = np.zeros(1, dtype)
    return as_strided(one, (int(count),), (0,), writeable=True).view(SymbolicArray)


def is_symbolic(buf: np.ndarray) -> bool:
    """Whether `buf` carries no data (a `SymbolicArray`)."""
    return isinstance(buf, SymbolicArray)


_RUNNING: list = [None]   # the _Rank whose algorithm code runs right now (one at a time, per process)


def _charge(nbytes: int, kind: str) -> None:
    rank = _RUNNING[0]
    if rank is not None:
        world = rank.world
        fixed = 0.0
        if world.after_work_bytes is not None and kind != "alloc" and nbytes >= world.after_work_bytes:
            rank.after_work = True
        if kind == "alloc":
            rate = world.alloc_seconds_per_byte(nbytes) if world.alloc_seconds_per_byte else 0.0
        elif kind == "gamma":
            rate, fixed = world.gamma, world.reduce_call_seconds
        else:
            rate, fixed = world.copy_seconds_per_byte, world.copy_call_seconds
        rank.clock = max(rank.clock, world.now) + (nbytes * rate + fixed) * rank.slowdown


def root_of(buf: np.ndarray) -> np.ndarray:
    """The array that owns `buf`'s memory (every view of one buffer has the same root)."""
    while isinstance(buf.base, np.ndarray):
        buf = buf.base
    return buf


def _written(buf: np.ndarray, pays: bool = True) -> None:
    """The running rank has written `buf` in this run (a network with `tracks_writes` routes a
    message from a buffer its sender wrote apart: the receiver reads lines dirty in another cache;
    one with `rewrite_seconds` charges a write to lines that ranks on other cores have read, now
    unless not `pays`: a receive's is charged when its bytes land, `SimWorld.deliver`)."""
    rank = _RUNNING[0]
    if rank is None:
        return
    world = rank.world
    if world.written is not None:
        root = root_of(buf)
        world.written[id(root)] = root
    if pays and world.unpaid:
        rank.clock = max(rank.clock, world.now) + _rewrite_seconds(world, buf) * rank.slowdown


def _rewrite_seconds(world: SimWorld, buf: np.ndarray) -> float:
    """What writing `buf` adds if ranks on other cores read its lines in the call before (the
    world's `unpaid`): each store must first take its line back from the reader's cache. The
    network's price of rewriting as many bytes as were read is shared out over the writes that
    cover them; those lines are the writer's again after."""
    owed = world.unpaid.get(id(root_of(buf)))
    if owed is None or owed[1] <= 0:
        return 0.0
    total, left = owed
    paid = min(buf.nbytes, left)
    owed[1] = left - paid
    return world.rewrite_seconds(total) * paid / total


# -- the network: links, routes, flows ----------------------------------------------------------

class Link:
    """One direction of one wire (or switch port): a capacity in bytes per second, shared fairly."""

    __slots__ = ("name", "capacity", "flows")

    def __init__(self, name: str, capacity: float) -> None:
        self.name = name
        self.capacity = capacity
        self.flows: set[_Message] = set()

    def __repr__(self) -> str:
        return f"Link({self.name}, {self.capacity / 1e9:g} GB/s)"


@dataclass(frozen=True)
class Route:
    """How a message from one rank reaches another: its α, the links it crosses, the sending port;
    `byte_weight` scales the bytes that flow (a protocol that costs more per byte than the links'
    capacities say); `eager`: the sender is done once it posted (as with a copy into a FIFO);
    `rendezvous`: nothing flows before the receiver has posted its receive (it pulls the bytes)."""

    alpha: float
    links: tuple[Link, ...]
    port: str = "net"
    byte_weight: float = 1.0
    eager: bool = False    # the send completes when posted (copied into a buffer), not on arrival
    rendezvous: bool = False   # the bytes move only once the receive is posted (the receiver copies)
    pull: float = 0.0      # seconds per byte the receiver copies itself once its wait ends (on its
                           # own clock, so on its core); its send completes when that copy is done
    pull_contended: float = 0.0   # the same while another rank's pull runs (0: no slower)
    # a second stage: when the bytes have crossed `links`, the sending port is free for the next
    # message and the bytes cross `then`'s links before they arrive (a FIFO: the sender copies in,
    # then the receiver copies out, while the sender copies its next message in)
    then: Route | None = None
    # the receiver's own core reads the sender's buffer (cross-memory attach, not a FIFO's slots):
    # the sender's next write of those lines pays the network's `rewrite_seconds`
    reads_sender: bool = False
    # a fused exchange's own CPU work (a network's `exchange_route`): its sender holds its core
    # `send_busy` seconds before the bytes leave, its receiver `receive_busy` once they are there
    # (and its reduction, if any); an eager message's `send_busy`, what its sender's copy costs
    # on this route beyond the network's `send_busy_seconds`. Only with time sharing does it
    # matter that this is work and not waiting: a rank that waits lends its core to another after
    # its spin; one that copies does not
    send_busy: float = 0.0
    receive_busy: float = 0.0
    # a pulled message whose receiver asks its sender to copy half (shm's `_ask_help`: a big plain
    # message into a receive not made by a sendrecv; a sendrecv's from small pages into huge ones,
    # which shm has its sender write whole, is not modelled apart): the sender then copies as long as the
    # receiver does, on its own core when it runs, and the send completes when both have
    helped: bool = False


class IdealNetwork:
    """Every rank has its own full-duplex link of 1/β bytes per second into a non-blocking switch."""

    def __init__(self, size: int, alpha: float, beta: float) -> None:
        capacity = math.inf if beta == 0 else 1 / beta
        self.outgoing = [Link(f"rank{r}.out", capacity) for r in range(size)]
        self.incoming = [Link(f"rank{r}.in", capacity) for r in range(size)]
        self.alpha = alpha

    def route(self, src: int, dst: int) -> Route:
        """The two links between `src` and `dst`, and the one α."""
        return Route(self.alpha, (self.outgoing[src], self.incoming[dst]))


# -- requests and messages ----------------------------------------------------------------------

class _SimRequest(Request):
    __slots__ = ("owner", "watched", "buf", "reducer", "posted", "key", "pulled", "helpable", "joins")

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
        self.helpable = True   # a receive whose sender may be asked to copy half (`Route.helped`)
        self.joins = 1         # completions it waits for (a helped send: the receiver's and its own)


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
        self.sends_to: dict[int, list[_SimRequest]] = {}   # its sends by world rank, the last not done
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


@dataclass(frozen=True)
class TimeSharing:
    """More ranks than `cores` on one machine: a rank that waits spins on its core `spin` seconds,
    then yields it to a rank that can run; taking a core back costs `wake` (switch and scheduler)."""

    cores: int
    spin: float
    wake: float
    # each rank's core (None: any rank takes any free core): the kernel keeps a runnable process on
    # its core's run queue, and one that yields there hands the core only to the ranks queued on it
    placement: tuple[int, ...] | None = None
    # the spin of a wait in a fused sendrecv (the network's `exchange_route`), if it polls apart
    # (shm's one-slot receive polls the slot's head, far cheaper a turn than a request's wait)
    sendrecv_spin: float | None = None
    sendrecv_wake: float | None = None   # and what taking a core back from such a wait costs
    # how long a rank that has returned keeps its core (None: `spin`): what it waits in next is
    # the caller's (`colls bench` waits in MPI's barrier, which polls apart from colls' waits)
    returned_spin: float | None = None


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


class SimulationFailed(RuntimeError):
    """The simulated program deadlocked or one of its ranks raised."""


class SimWorld:
    """A simulated cluster of `size` ranks over `network`; `run(body)` runs body(transport) on each.

    `gamma`: seconds per byte reduced; `copy_seconds_per_byte`: per byte copied by algorithm code;
    `slowdown[rank]`: a factor on that rank's α, γ and copies (a straggler).
    """

    def __init__(self, size: int, network, gamma: float = 0.0, copy_seconds_per_byte: float = 0.0,
                 slowdown: dict[int, float] | None = None) -> None:
        self.size = size
        self.network = network
        self.gamma = gamma
        self.copy_seconds_per_byte = copy_seconds_per_byte
        self.now = 0.0
        self.ranks = [_Rank(self, r) for r in range(size)]
        for rank, factor in (slowdown or {}).items():
            self.ranks[rank].slowdown = factor
        self._events: list[tuple] = []
        self._sequence = itertools.count()
        self._runnable: deque[_Rank] = deque()
        self._dirty: set[Link] = set()
        self._routes: dict[tuple[int, int], Route] = {}
        self._groups: dict[tuple, _Group] = {}
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
        transports = [SimTransport(self, group, r) for r in range(self.size)]
        use_threads = _greenlet is None or os.environ.get("COLLS_SIM_THREADS") == "1"
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
                    what.joins -= 1
                    if what.joins <= 0:
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
            if sized is None:
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
        read = recv.nbytes   # bytes of the sender's buffer the receiver's core reads (if it does)
        rewrite = _rewrite_seconds(self, recv.buf) * recv.owner.slowdown if self.unpaid else 0.0
        work += rewrite
        if route.pull:   # the receiver copies (and reduces) when it runs again
            per_byte = recv.nbytes * recv.owner.slowdown
            send = message.send
            # (shm asks no help of a sender that is reading a message of mine meanwhile)
            busy = any(not sent.done for sent in recv.owner.sends_to.get(message.sender.rank, ()))
            if route.helped and recv.reducer is None and recv.helpable and not busy:
                # its half, and its sender the other: as the profile's message, two copies at once
                # (a read beside it slows it no more: that is the other rank's copy, priced apart)
                recv.pulled = (per_byte * route.pull + rewrite, per_byte * route.pull + rewrite, send)
                read -= recv.nbytes // 2
                send.joins += 1
                send.pulled = (recv.nbytes * message.sender.slowdown * route.pull, None, send)
                self._wake(send)
            else:
                recv.pulled = (per_byte * route.pull + work,
                               per_byte * (route.pull_contended or route.pull) + work, send)
        elif route.receive_busy:   # a fused exchange: it copies out (and reduces) on its own core
            recv.pulled = (route.receive_busy * recv.owner.slowdown + work, None, None)
        else:
            done += work
        if self.read_by_peers is not None and route.reads_sender and self._apart(message.sender, recv.owner):
            root = root_of(message.send.buf)
            self.read_by_peers.setdefault(id(root), [root, 0])[1] += read
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

    def _wake(self, request: _SimRequest) -> None:
        """`request` has work for its owner (`pulled`): resume the owner if it waits on it."""
        owner = request.owner
        if request.watched and owner.outstanding > 0:
            owner.outstanding = 0
            self._runnable.append(owner)

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

    def group(self, key: tuple, world_ranks: list[int]) -> _Group:
        """The sub-group registered under `key`, made on first use."""
        found = self._groups.get(key)
        if found is None:
            found = self._groups[key] = _Group(len(self._groups) + 1, world_ranks)
        return found


@dataclass
class _Group:
    id: int
    world_ranks: list[int]
    splits: dict[int, int] = field(default_factory=dict)   # world rank -> subgroup calls made


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

    def sendrecv(self, send_buf: np.ndarray, dst: int, recv_buf: np.ndarray, src: int, tag: int,
                 deadline: float, reducer: Reducer | None = None) -> None:
        """A send and a receive posted together. On a network with `exchange_route` (a transport
        that does the pair as one step, as shm's sendrecv through its slots), the send takes that route and
        neither side pays a post: the route's α is the whole measured step."""
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
        # (shm asks no half-help for a sendrecv's receive: its sender is receiving too; one from
        # small pages into huge ones, written whole by its sender, is priced as any exchange)
        receive = self._post_recv(recv_buf, src, tag, reducer, post=fused is None, helpable=False)
        self.me.in_sendrecv = fused is not None
        try:
            self.wait_all([send, receive], deadline)
        finally:
            self.me.in_sendrecv = False

    def sendrecv_replace(self, buf: np.ndarray, dst: int, src: int, tag: int, deadline: float,
                         reducer: Reducer | None = None,
                         scratch: np.ndarray | None = None) -> np.ndarray | None:
        """Up to the network's `in_place_exchange_bytes` (shm: one slot, copied out at once), no
        scratch copy: the send's bytes leave `buf` when posted (a real buffer's are copied then)."""
        limit = getattr(self.world.network, "in_place_exchange_bytes", 0)
        if buf.nbytes > limit or not (is_symbolic(buf) or buf.nbytes <= REAL_COPY_BYTES):
            return super().sendrecv_replace(buf, dst, src, tag, deadline, reducer, scratch)
        self.sendrecv(buf, dst, buf, src, tag, deadline, reducer)
        return scratch

    def _send(self, buf: np.ndarray, peer: int, tag: int, route: Route | None) -> Request:
        world, me = self.world, self.me
        receiver = world.ranks[self.group.world_ranks[peer]]
        fused = route   # a sendrecv's send on the network's exchange route (priced as the whole step)
        if route is None:
            me.clock = max(me.clock, world.now) + world.post_seconds * me.slowdown
            written = world.written is not None and id(root_of(buf)) in world.written
            route = world._routes.get((me.rank, receiver.rank)) or world.route(me.rank, receiver.rank,
                                                                              buf.nbytes, written)
        else:   # the fused step's own copying in
            me.clock = max(me.clock, world.now) + route.send_busy * me.slowdown
        request = _SimRequest("send", peer, tag, buf, me)
        pending = [sent for sent in me.sends_to.get(receiver.rank, ()) if not sent.done]
        pending.append(request)
        me.sends_to[receiver.rank] = pending
        data = None
        if not is_symbolic(buf):
            data = buf.copy() if buf.nbytes <= REAL_COPY_BYTES else buf
        message = _Message(request, route, data, me)
        key = (self.group.id, self.rank, tag)
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
                   post: bool = True, helpable: bool = True) -> Request:
        me = self.me
        if self.world.written is not None:
            _written(buf, pays=False)   # what arrives is written into it by this rank (when it lands)
        me.clock = max(me.clock, self.world.now) + (self.world.post_seconds * me.slowdown if post else 0.0)
        request = _SimRequest("recv", peer, tag, buf, me, reducer)
        request.helpable = helpable
        key = (self.group.id, peer, tag)
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
                    else:   # its own copy: a fused exchange's, or its half of a helped message
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
        key = (self.group.id, calls, tuple(ranks))
        child = self.world.group(key, [self.group.world_ranks[r] for r in ranks])
        return SimTransport(self.world, child, list(ranks).index(self.rank))

    def abort(self, reason: str) -> None:
        if self.world.failure is None:
            self.world.failure = CommunicatorAborted(reason)
