"""`Communicator`: a group of ranks over one transport, with every collective, p2p and `split`.

Every collective call takes one path: its arguments are checked and compiled into a `Description`
once per signature (`_describe`, cached), then `_execute` numbers it, and runs its body in issue
order (`Executor`): now for a blocking call, on the communicator's worker for an `async_op=True`
call or a persistent request's `start()`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from algorithms.blocks import bind_schedule
from algorithms.channel import Channel
from transports import registered
from transports.base import COLLECTIVE_TAG_BASE, FP_BITS, Traffic, Transport
from transports.errors import CollectiveMismatch, CollsError, InvalidArgument

from . import config, fingerprint
from .collectives import Collectives, Result
from .describe import CACHED_SIGNATURES, CallName, Description, Validator, fixed_op, seconds
from .executor import Executor
from .hierarchy import Layout, Levels, build_levels, discover
from .objects import ObjectCollectives
from .p2p import PointToPoint
from .selection import Selector
from .trace import Tracer

CLOSE_DRAIN_S = 10.0   # how long `close` waits for asynchronous work it has aborted to end


def default_timeout() -> float:
    """Seconds a call may wait: COLLS_TIMEOUT, else five minutes."""
    given = config.get("COLLS_TIMEOUT")
    if seconds(given) is None:   # NaN or infinity would mean no deadline at all
        raise ValueError(f"COLLS_TIMEOUT={given!r}: give a finite number of seconds > 0")
    return given


class Communicator(Collectives, ObjectCollectives, PointToPoint):
    """A group of `size` ranks; this object is rank `rank`'s end of it.

    Several threads may use one communicator at once: point-to-point calls with tags of their own
    (over local, shm and mpi), beside collectives, which run one at a time in issue order (two
    threads that both make collectives must agree on their order with the other ranks, as in MPI).
    """

    def __init__(self, transport: Transport, timeout: float | None = None, name: str = "world",
                 layout: Layout | None = None) -> None:
        self.transport = transport
        self.rank = transport.rank
        self.size = transport.size
        self.name = name
        self.members = tuple(range(self.size))   # the world's ranks, in this group's order (`split`)
        self.timeout = default_timeout() if timeout is None else seconds(timeout)
        if self.timeout is None:
            raise InvalidArgument(f"rank {self.rank}: Communicator: timeout must be a finite number of "
                                  f"seconds > 0, got {timeout!r}")
        self.layout = Layout.one_host(self.size) if layout is None else layout
        self._shm_inside = transport.name in ("shm", "local")   # hosts' ranks share a machine
        self._levels: Levels | None = None
        self._check = Validator(self.rank, self.size,
                                Selector(transport.name, self.size, self.layout.spans_hosts),
                                transport.capabilities.device_buffers)
        self._executor = Executor(name)
        self._numbers = itertools.count()   # each call's number (its tag); next() is atomic under threads
        self._hidden = 0   # calls colls made for itself (finding hosts, building levels): not numbered
        self._splits = 0
        self._traffic: dict[str, Traffic] = {}
        self._tracer = Tracer(name, self.rank)
        self._channel = Channel(transport, COLLECTIVE_TAG_BASE, 0.0, "", None)   # see `_job`
        self._name = CallName()   # the blocking call running now, as messages name it (see `_execute`)
        self._scratch_bytes: np.ndarray | None = None   # see `_scratch`
        self.closed = False

    def __repr__(self) -> str:
        return f"<colls.Communicator {self.name} rank {self.rank}/{self.size} over {self.transport.name}>"

    # -- describe, then execute ------------------------------------------------------------------

    def _describe(self, collective: str, x: np.ndarray | None, op: Any, root: int | None,
                  algorithm: Any) -> Description:
        """The call's `Description`: the cached one of its signature (collective, op as given,
        dtype, shape, root, `algorithm=` as given), else made by `_compile` and cached where the op
        is a name or a built-in (a user's Op may change between calls)."""
        key = (collective, algorithm) if x is None else (collective, op, x.dtype, x.shape, root, algorithm)
        described = self._check.described
        try:
            return described[key]
        except KeyError:
            pass
        except TypeError:   # an unhashable op or algorithm: the checks name it
            key = None
        description = self._compile(collective, x, op, root, algorithm)
        if key is not None and (op is None or fixed_op(op)) and (algorithm is None or type(algorithm) is str):
            if len(described) >= CACHED_SIGNATURES:
                described.clear()
            described[key] = description
        return description

    def _compile(self, collective: str, x: np.ndarray | None, op: Any, root: int | None,
                 algorithm: Any) -> Description:
        """Check a signature's arguments, choose its algorithm and work out its schedule."""
        check = self._check
        if x is None:   # barrier
            return Description(collective, None, (), None, None, check.algorithm(collective, algorithm),
                               self.name)
        if x.dtype.hasobject:   # (callers pass a contiguous numpy array on without `Validator.array`)
            raise check.fail(collective, f"x has dtype {x.dtype}; object arrays cannot be sent")
        nbytes, out_shape = x.nbytes, x.shape
        if collective in ("reduce_scatter", "all_to_all", "scatter"):
            rows = check.divisible(collective, x)
            if collective != "all_to_all":
                out_shape = (rows, *x.shape[1:])
        elif collective in ("all_gather", "gather"):
            nbytes, out_shape = self.size * x.nbytes, (self.size * x.shape[0], *x.shape[1:])
        if collective in ("all_reduce", "reduce", "reduce_scatter"):
            op = check.op(collective, op, x.dtype)
        chosen = check.algorithm(collective, algorithm, op, nbytes)
        schedule = exchanges = None
        if chosen.schedule is not None:
            schedule = chosen.schedule(self.rank, self.size, x.size, op)
        if schedule is not None:
            exchanges = bind_schedule(self._channel, schedule, x.dtype, x.size, math.prod(out_shape))
        return Description(collective, x.dtype, x.shape, root, op, chosen, self.name, out_shape, schedule,
                           exchanges)

    def _execute(self, description: Description, body: Callable[..., Any], args: tuple, async_op: bool,
                 limit: float) -> Result:
        """Run `body(channel, description, args)` as the communicator's next call: it takes its
        number (and so its tag) now, in issue order, and runs after every call issued before it:
        in this thread for a blocking call on an idle communicator, else on the worker."""
        if self.closed:
            raise self._check.fail(description.collective, "the communicator is closed")
        if self._levels is None and description.algorithm.name == "hierarchical":
            self._build_levels()   # collective: every rank makes its first hierarchical call here
        seq = next(self._numbers)   # its tag: the same on every rank, as every rank makes the call
        number = seq - self._hidden
        collective = description.collective
        traffic = self._traffic.get(collective) or self._traffic_for(collective)
        executor = self._executor
        if async_op or executor.pending:
            name = CallName(description, number)   # (the shared one names the blocking call of the moment)
            return executor.run(name, async_op, self._job, name, seq, limit, traffic, body, args)
        with executor.lock:   # `Executor.run`'s blocking branch, a frame less (every call)
            name = self._name
            name.description, name.seq = description, number
            return self._job(name, seq, limit, traffic, body, args)

    def _job(self, name: CallName, seq: int, limit: float, traffic: Traffic, body: Callable[..., Any],
             args: tuple) -> Any:
        """Run one call's body over the communicator's channel, now that every call before it has
        run. One channel serves call after call (calls run one at a time), pointed at each in turn."""
        traffic.calls += 1
        channel = self._channel
        description = name.description
        channel.tag = description.tag + (seq << FP_BITS)   # the call's number and fingerprint
        channel.deadline = time.monotonic() + limit
        channel.what = name
        channel.traffic = traffic
        channel.levels = self._levels
        tracer = self._tracer
        try:
            if not tracer.active:
                return body(channel, description, args)
            start = time.perf_counter()
            if tracer.debug:
                fingerprint.check(channel, description, name.seq)   # before any data moves
            result = body(channel, description, args)
        except BaseException as error:
            if tracer.active:
                tracer.failed(name, error)
            self._broken(name, error)
            raise
        nbytes = 0 if description.dtype is None else description.count * description.dtype.itemsize
        tracer.finished(name, nbytes, time.perf_counter() - start)
        return result

    def _traffic_for(self, collective: str) -> Traffic:
        """The counters `stats()` reports for `collective` (made on its first call)."""
        return self._traffic.get(collective) or self._traffic.setdefault(collective, Traffic(self.size))

    def _broken(self, name: CallName, error: BaseException) -> None:
        """A call that failed half-way for a reason of this rank's own (a bug, an interrupt, memory)
        leaves its peers waiting for messages that will never come: abort the communicator so that
        they raise `CommunicatorAborted` naming this rank and the error now, not at their deadline.
        Errors the peers see for themselves (timeouts, lost peers, aborts, mismatches) abort nothing,
        except in a hierarchical call: there any error but a bad argument (or a mismatch COLLS_DEBUG's
        check found, before any data moved) aborts both levels, so that ranks blocked on the level
        this rank is not on are released too."""
        first = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        reason = f"rank {self.rank} failed in {self.name} {name.label()} ({first})"
        if (name.description.algorithm.name == "hierarchical" and self._levels is not None
                and not isinstance(error, InvalidArgument)
                and not (isinstance(error, CollectiveMismatch) and self._tracer.debug)):
            # a rank released on one level passes it on, so that ranks waiting on the other level
            # (for peers stuck on this one) are released too, whatever the error
            self._levels.abort(reason)
        if not isinstance(error, CollsError):
            self.transport.abort(reason)

    def channel(self, what: str = "custom schedule", timeout: float | None = None) -> Channel:
        """A raw `Channel` with a fresh collective tag, for writing a schedule of your own.

        Every rank must call it at the same point in its sequence of calls, as for a collective.
        """
        limit = self.timeout if timeout is None else self._check.timeout(what, timeout)
        seq = next(self._numbers)
        return Channel(self.transport, COLLECTIVE_TAG_BASE + (seq << FP_BITS), time.monotonic() + limit,
                       f"{self.name} {what} #{seq - self._hidden}",
                       self._traffic.setdefault(what, Traffic(self.size)))

    # -- hosts -----------------------------------------------------------------------------------

    def discover_hosts(self) -> Layout:
        """Collective: learn which host each rank runs on (COLLS_HOST, else the host name), so that
        collectives over ranks that span hosts run hierarchically. `colls.init()` calls it.

        Returns:
            The `Layout` of this communicator's ranks over hosts.
        """
        self.layout, self._shm_inside = self._internally(discover, self._exchange)
        self._check.use(Selector(self.transport.name, self.size, self.layout.spans_hosts))
        return self.layout

    def _build_levels(self) -> None:
        self._levels = self._internally(build_levels, self.rank, self.layout, self.transport, self._exchange,
                                        self._shm_inside)

    def _internally(self, setup: Callable[..., Any], *args: Any) -> Any:
        """Run `setup`'s collectives as colls' own: they neither count in `stats()` nor take the
        numbers of the user's calls in messages (the user's first call stays #0)."""
        first, counters = next(self._numbers), self._traffic   # (every rank takes the same numbers)
        self._traffic = {}
        try:
            return setup(*args)
        finally:
            self._traffic = counters
            self._hidden += next(self._numbers) - first + 1   # setup's calls and the two numbers taken here

    # -- groups ----------------------------------------------------------------------------------

    def split(self, color: int | None, key: int | None = None) -> Communicator | None:
        """Ranks with the same `color` form a new communicator, ordered by (`key`, rank); MPI_Comm_split.

        Collective over this communicator. A rank passing `color=None` (or a negative color, like
        MPI_UNDEFINED) joins no group and gets None.
        """
        if color is not None and (isinstance(color, bool) or not isinstance(color, (int, np.integer))):
            raise self._check.fail("split", f"color must be an int or None, got {color!r}")
        if key is not None and (isinstance(key, bool) or not isinstance(key, (int, np.integer))):
            raise self._check.fail("split", f"key must be an int or None, got {key!r}")
        for name, value in (("color", color), ("key", key)):   # both travel as int64
            if value is not None and not -(1 << 63) <= int(value) < 1 << 63:
                raise self._check.fail("split", f"{name} must fit in 64 bits, got {value!r}")
        colour = -1 if color is None or color < 0 else int(color)
        mine = np.array([colour, self.rank if key is None else int(key)], np.int64)
        table = self.all_gather(mine.reshape(1, 2))
        members = [] if colour < 0 else sorted(
            (r for r in range(self.size) if table[r, 0] == colour), key=lambda r: (table[r, 1], r))
        self._splits += 1
        transport = self.transport.subgroup(members, self._exchange)
        if transport is None:
            return None
        child = Communicator(transport, self.timeout, f"{self.name}.{self._splits}:{colour}",
                             self.layout.subset(members))
        child._shm_inside = self._shm_inside
        child.members = tuple(self.members[r] for r in members)
        return child

    def _exchange(self, data: bytes) -> list[bytes]:
        """All-gather small byte strings over this communicator (used to set up sub-groups)."""
        lengths = self.all_gather(np.array([len(data)], np.int64))
        padded = np.zeros(int(lengths.max()), np.uint8)
        padded[:len(data)] = np.frombuffer(data, np.uint8)
        table = self.all_gather(padded.reshape(1, -1))
        return [table[r, :lengths[r]].tobytes() for r in range(self.size)]

    # -- counters and teardown -------------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, object]]:
        """Messages and bytes this rank sent and received, per kind of call and per peer."""
        return {name: traffic.as_dict() for name, traffic in self._traffic.items()}

    def reset_stats(self) -> None:
        """Zero the counters `stats` returns."""
        self._traffic.clear()

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait until every asynchronous call issued so far has finished."""
        self._executor.drain(timeout)

    def abort(self, reason: str = "") -> None:
        """Release every rank blocked in a call on this communicator with `CommunicatorAborted`.

        Callable from any thread (a watchdog, a signal handler's thread); the peers notice within
        a fraction of a second. The communicator cannot be used afterwards.
        """
        message = f"aborted by rank {self.rank}" + (f": {reason}" if reason else "")
        if self._levels is not None:
            self._levels.abort(message)
        self.transport.abort(message)

    def _scratch(self, like: np.ndarray) -> np.ndarray:
        """A flat work buffer of `like`'s dtype and size, for a blocking call's body only (bodies run
        one at a time, in issue order): kept from call to call and grown to the largest asked for, so a
        schedule that folds into its input costs a copy but no allocation per call. On a transport
        whose peers can map registered memory (shm) it is registered (`colls.alloc`): its big
        messages are read out of a mapping instead of page by page (the transport's declared
        capabilities say whether, and from what size). Device arrays get a fresh copy."""
        if not isinstance(like, np.ndarray):
            return like.copy().reshape(-1)
        held = self._scratch_bytes
        if held is None or held.nbytes < like.nbytes:
            held = None
            capabilities = self.transport.capabilities
            if capabilities.maps_registered_memory and like.nbytes >= capabilities.registered_from_bytes:
                held = registered.alloc((like.nbytes,), np.uint8)
            self._scratch_bytes = held = np.empty(like.nbytes, np.uint8) if held is None else held
        flat = held[:like.nbytes].view(like.dtype)
        np.copyto(flat, like.reshape(-1))
        return flat

    def close(self) -> None:
        """Finish pending work and release the transport (segments, MPI communicators)."""
        if not self.closed:
            if not self._executor.drain(self.timeout):
                # asynchronous work still running (a longer timeout= of its own): released by an
                # abort, not left to find its transport closed under it
                self.transport.abort(f"rank {self.rank} closed {self.name} with asynchronous work "
                                     f"still running")
                self._executor.drain(CLOSE_DRAIN_S)
            self._scratch_bytes = None
            self.closed = True
            if self._levels is not None:
                self._levels.close()
            self.transport.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
