"""`Communicator`: a group of ranks over one transport, with every collective, p2p and `split`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from algorithms import faults
from algorithms.blocks import run_block_schedule, run_persistent_block_schedule
from transports import registered
from transports.base import COLLECTIVE_TAG_BASE, Channel, Traffic, Transport, env_number
from transports.errors import CollectiveMismatch, CollsError, InvalidArgument

from . import fingerprint
from .collectives import NOTHING, Collectives, Result, apart_from
from .describe import PLAN_BYTES, Description, Plan, Validator, seconds
from .device import is_cupy
from .executor import Executor, RequestWork
from .hierarchy import Layout, Levels, build_levels, discover
from .selection import Selector
from .trace import Tracer

DEFAULT_TIMEOUT_S = 300.0
# blocking calls of these collectives, from this many bytes of input, let the transport choose how
# their messages move by how fast each way has been lately (`_choosing`; shm with
# COLLS_SHM_ADAPTIVE=1). Rooted ones are left out:
# rank 0 chooses for all by its own time, and a root that sends through a FIFO returns before its
# receivers are done.
CHOOSING = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all"})
CHOOSE_BYTES = 128 << 10


CLOSE_DRAIN_S = 10.0   # how long `close` waits for asynchronous work it has aborted to end


def default_timeout() -> float:
    """Seconds a call may wait: COLLS_TIMEOUT, else five minutes."""
    given = env_number("COLLS_TIMEOUT", DEFAULT_TIMEOUT_S, float)
    if seconds(given) is None:   # NaN or infinity would mean no deadline at all
        raise ValueError(f"COLLS_TIMEOUT={os.environ.get('COLLS_TIMEOUT')!r}: give a finite number of "
                         f"seconds > 0")
    return given


class Communicator(Collectives):
    """A group of `size` ranks; this object is rank `rank`'s end of it."""

    def __init__(self, transport: Transport, timeout: float | None = None, name: str = "world",
                 layout: Layout | None = None) -> None:
        self.transport = transport
        # blocking calls from this size go between the transport's `begin_call` and `end_call`
        # (`_choosing`), where it chooses ways at all: 1-1.5 us a call otherwise spent for nothing
        self._choose_from = CHOOSE_BYTES if transport.adapting else 1 << 62
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
                                transport.device_buffers)
        self._executor = Executor(name)
        self._seq = 0
        self._hidden = 0   # calls colls made for itself (finding hosts, building levels): not numbered
        self._splits = 0
        self._traffic: dict[str, Traffic] = {}
        self._tracer = Tracer(name, self.rank)
        self._channel = Channel(transport, COLLECTIVE_TAG_BASE, 0.0, "", None)   # see `_aim`
        self._scratch_bytes: np.ndarray | None = None   # see `_scratch`
        self.closed = False

    def __repr__(self) -> str:
        return f"<colls.Communicator {self.name} rank {self.rank}/{self.size} over {self.transport.name}>"

    # -- running one call ------------------------------------------------------------------------

    def _run(self, collective: str, algorithm: str, x: np.ndarray | None, body: Callable[[Channel], Any],
             async_op: bool, timeout: float | None, *, root: int | None = None, op=None) -> Result:
        """Give the call its sequence number and tag now (issue order), then run it in order."""
        if self.closed:
            raise self._check.fail(collective, "the communicator is closed")
        deadline_s = self.timeout if timeout is None else self._check.timeout(collective, timeout)
        if algorithm == "hierarchical" and self._levels is None:
            self._build_levels()   # collective: every rank makes its first hierarchical call here
        seq = self._seq
        self._seq += 1   # the collective's tag: the same on every rank, as every rank makes the call
        description = Description(collective, None if x is None else x.dtype, 0 if x is None else x.size,
                                  root, None if op is None else op.name, algorithm, seq - self._hidden,
                                  self.name)
        traffic = self._traffic_for(collective)
        nbytes = 0 if x is None else x.nbytes
        executor = self._executor
        if async_op or executor.pending:
            return executor.run(description, async_op, self._job, body, description, seq, deadline_s,
                                traffic, nbytes)
        with executor.exclusive():   # `Executor.run`'s blocking branch, a frame less (every call)
            if nbytes < self._choose_from or collective not in CHOOSING:
                return self._job(body, description, seq, deadline_s, traffic, nbytes)
            return self._choosing((collective, algorithm, nbytes), self._job, body, description, seq,
                                  deadline_s, traffic, nbytes)

    def _choosing(self, kind: tuple, run: Callable[..., Any], *args) -> Any:
        """`run(*args)`, one blocking call of `kind` (collective, algorithm, bytes), between the
        transport's `begin_call` and `end_call`: a transport with two ways to move a call's messages
        takes the one that has been faster for this kind lately (`ShmTransport.begin_call`)."""
        transport = self.transport
        transport.begin_call(kind)
        completed = False
        try:
            result = run(*args)
            completed = True
            return result
        finally:
            transport.end_call(completed)

    def _run_planned(self, plan: Plan, x: np.ndarray, work: np.ndarray, timeout: float | None) -> np.ndarray:
        """A blocking all_reduce whose checks `plan` made once (see `describe.Plan`): `_run` and
        `_job` for it, without their closures and frames, since its cost is its software. The plan
        names the call in timeout messages (numbered now), so no `Description` is made unless it fails."""
        if work is not x:
            work[...] = x   # same shape and dtype, both contiguous: a third of `np.copyto`'s cost here
        flat = work if work.ndim == 1 else work.reshape(-1)
        op, algorithm = plan.op, plan.algorithm
        channel = self._aim_plan(plan, timeout)
        exchanges = plan.exchanges
        with self._executor.lock:
            try:
                if exchanges is None:
                    algorithm.run(channel, flat, op)
                else:   # the algorithm's exchanges, worked out when the plan was made
                    for _, exchange in exchanges:
                        exchange(flat)
            except BaseException as error:
                self._broken(plan.description(), error)
                raise
        if op.finishes:
            op.finish(flat, self.size)
        return work

    def _aim_plan(self, plan: Plan, timeout: float | None) -> Channel:
        """`_run`'s and `_aim`'s work for a planned call: its number (kept in the plan, which names
        the call in timeout messages), its counters, the channel pointed at it."""
        limit = self.timeout if timeout is None else self._check.timeout(plan.collective, timeout)
        seq = self._seq
        self._seq = seq + 1
        plan.seq = seq - self._hidden
        collective = plan.collective
        traffic = self._traffic.get(collective) or self._traffic_for(collective)
        traffic.calls += 1
        channel = self._channel
        channel.tag = COLLECTIVE_TAG_BASE + seq
        channel.deadline = time.monotonic() + limit
        channel.what = plan
        channel.traffic = traffic
        return channel

    def _run_planned_blocks(self, collective: str, x: object, out: object, algorithm: str | None,
                            async_op: bool, timeout: float | None) -> np.ndarray | None:
        """A blocking all_gather or all_to_all whose signature (dtype, shape, `algorithm=`) a call
        before it planned, run on that plan; None: this call takes the full path (no plan,
        `async_op`, a strided buffer, another kind of `out`, work queued, tracing, closed)."""
        if async_op or type(x) is not np.ndarray or not (algorithm is None or type(algorithm) is str):
            return None
        plan = self._check.block_plans.get((collective, x.dtype, x.shape, algorithm))
        if (plan is None or not x.flags.c_contiguous or self._executor.pending or self._tracer.active
                or self.closed):
            return None
        if out is None:
            work, send = np.empty(plan.out_shape, x.dtype), x
        elif (type(out) is np.ndarray and out.shape == plan.out_shape and out.dtype == x.dtype
              and out.flags.c_contiguous and out.flags.writeable):
            # blocks are read after others land: an `out` over `x` needs `x` copied first (into
            # the scratch, under the lock)
            work, send = out, apart_from(x, out, self.rank if collective == "all_gather" else None)
        else:
            return None
        channel = self._aim_plan(plan, timeout)
        with self._executor.lock:
            if send is None:
                send = self._scratch(x)
            if x.nbytes < self._choose_from:
                self._run_blocks(plan, channel, send, work)
            else:
                self._choosing((collective, plan.algorithm.name, x.nbytes), self._run_blocks, plan, channel,
                               send, work)
        return work

    def _run_blocks(self, plan: Plan, channel: Channel, send: np.ndarray, work: np.ndarray) -> None:
        # (a fault planted for the fuzzer's tests after the plan was made: the algorithm plants it)
        schedule = None if faults.ACTIVE else plan.schedule
        try:
            if schedule is None:
                plan.algorithm.run(channel, send.reshape(-1), work.reshape(-1))
            elif plan.exchanges is not None:   # and those exchanges made persistent
                run_persistent_block_schedule(send if send.ndim == 1 else send.reshape(-1),
                                              work if work.ndim == 1 else work.reshape(-1), schedule,
                                              plan.exchanges)
            else:   # the algorithm's copy and exchanges, worked out when the plan was made
                run_block_schedule(channel, send if send.ndim == 1 else send.reshape(-1),
                                   work if work.ndim == 1 else work.reshape(-1), schedule)
        except BaseException as error:
            self._broken(plan.description(), error)
            raise

    def _run_plan(self, plan: Plan, run: Callable[..., Any], *args) -> None:
        """`run(*args)`, a planned call's algorithm: an error of this rank's own aborts the group,
        as in `_job` (`_broken`)."""
        try:
            run(*args)
        except BaseException as error:
            self._broken(plan.description(), error)
            raise

    def _run_planned_reduce_scatter(self, x: object, op: object, out: object, algorithm: str | None,
                                    async_op: bool, timeout: float | None) -> np.ndarray | None:
        """A blocking reduce_scatter whose signature (op as given, dtype, shape) a call before it
        planned, run on that plan; None: the full path (as `_run_planned_blocks`, and an `out` that
        may overlap `x`). 2 ranks, 8 B-4 KiB: 12.5-14.0 us through the full checks, MPI 3.6-5.0."""
        if async_op or type(x) is not np.ndarray or not (algorithm is None or type(algorithm) is str):
            return None
        try:
            plan = self._check.block_plans.get(("reduce_scatter", op, x.dtype, x.shape, algorithm))
        except TypeError:   # an unhashable op: the full checks name it
            return None
        if (plan is None or not x.flags.c_contiguous or self._executor.pending or self._tracer.active
                or self.closed):
            return None
        if out is None:
            work = np.empty(plan.out_shape, x.dtype)
        elif (type(out) is np.ndarray and out.shape == plan.out_shape and out.dtype == x.dtype
              and out.flags.c_contiguous and out.flags.writeable and not np.may_share_memory(x, out)):
            work = out
        else:
            return None
        flat = work if work.ndim == 1 else work.reshape(-1)
        algorithm, op = plan.algorithm, plan.op
        channel = self._aim_plan(plan, timeout)
        with self._executor.lock:
            source = x.reshape(-1) if algorithm.reads_input_only else self._scratch(x)
            if x.nbytes < self._choose_from:
                self._run_plan(plan, algorithm.run, channel, source, flat, op)
            else:
                self._choosing(("reduce_scatter", algorithm.name, x.nbytes), self._run_plan, plan,
                               algorithm.run, channel, source, flat, op)
        if op.finishes:
            op.finish(flat, self.size)
        return work

    def _run_planned_reduce(self, x: object, root: object, op: object, out: object, algorithm: str | None,
                            async_op: bool, timeout: float | None) -> object:
        """A blocking reduce whose signature (op as given, dtype, shape, root) a call before it
        planned, run on that plan: the root's result, or `NOTHING` on the other ranks; None: the
        full path (as `_run_planned_blocks`). 2 ranks, 8 B: 8.3-9.1 us through the full checks
        (MPI 2.8-3.6)."""
        if (async_op or type(x) is not np.ndarray or type(root) is not int
                or not (algorithm is None or type(algorithm) is str)):
            return None
        try:
            plan = self._check.block_plans.get(("reduce", op, x.dtype, x.shape, root, algorithm))
        except TypeError:   # an unhashable op: the full checks name it
            return None
        if (plan is None or not x.flags.c_contiguous or self._executor.pending or self._tracer.active
                or self.closed):
            return None
        work = None
        if self.rank == root:
            if out is None:
                work = np.empty(x.shape, x.dtype)
            elif (type(out) is np.ndarray and out.shape == x.shape and out.dtype == x.dtype
                  and out.flags.c_contiguous and out.flags.writeable):
                work = out
            else:
                return None
        algorithm, op = plan.algorithm, plan.op
        channel = self._aim_plan(plan, timeout)
        with self._executor.lock:
            if work is None:
                flat = self._scratch(x)
            else:
                work[...] = x   # (the root reduces into its result: `reduce`)
                flat = work if work.ndim == 1 else work.reshape(-1)
            self._run_plan(plan, algorithm.run, channel, flat, op, root)
        if work is None:
            return NOTHING
        if op.finishes:
            op.finish(flat, self.size)
        return work

    def _run_planned_broadcast(self, x: object, root: object, out: object, algorithm: str | None,
                               async_op: bool, timeout: float | None) -> np.ndarray | None:
        """A blocking broadcast whose signature (dtype, shape, root) a call before it planned, run
        on that plan; None: the full path (as `_run_planned_blocks`)."""
        if (async_op or type(x) is not np.ndarray or type(root) is not int
                or not (algorithm is None or type(algorithm) is str)):
            return None
        plan = self._check.broadcast_plans.get((x.dtype, x.shape, root, algorithm))
        if (plan is None or not x.flags.c_contiguous or self._executor.pending or self._tracer.active
                or self.closed):
            return None
        if out is None:
            work = np.empty(x.shape, x.dtype)
        elif (out is x and x.flags.writeable) or (type(out) is np.ndarray and out.shape == x.shape
                                                  and out.dtype == x.dtype and out.flags.c_contiguous
                                                  and out.flags.writeable):
            work = out
        else:
            return None
        if work is not x and self.rank == root:
            work[...] = x
        channel = self._aim_plan(plan, timeout)
        with self._executor.lock:
            try:
                plan.algorithm.run(channel, work if work.ndim == 1 else work.reshape(-1), root)
            except BaseException as error:
                self._broken(plan.description(), error)
                raise
        return work

    def _keep_block_plan(self, collective: str, x: np.ndarray, forced: str | None, algorithm,
                         out_shape: tuple[int, ...]) -> None:
        """After the full checks of an all_gather or all_to_all: plan its signature's later calls
        (`forced`: the `algorithm=` they pass, None where the selector chose), unless the algorithm
        is the hierarchical one (which builds its levels)."""
        if (algorithm.name != "hierarchical"
                and (collective, x.dtype, x.shape, forced) not in self._check.block_plans):
            schedule = algorithm.schedule and algorithm.schedule(self.rank, self.size, x.size)
            exchanges = None
            if (schedule is not None and x.nbytes <= PLAN_BYTES and type(x) is np.ndarray
                    and all(dst == src for dst, _, _, src, _ in schedule.steps)):
                # each step's exchange made persistent: a small call's cost is its software
                exchanges = tuple(self._channel.persistent_exchange(x.dtype, incoming.stop - incoming.start,
                                                                    src)
                                  for _, _, _, src, incoming in schedule.steps)
            self._check.keep_block_plan(Plan(collective, None, algorithm, x.shape, x.dtype, self.name,
                                             exchanges, out_shape=out_shape, schedule=schedule), forced)

    def _traffic_for(self, collective: str) -> Traffic:
        """The counters `stats()` reports for `collective` (made on its first call)."""
        return self._traffic.get(collective) or self._traffic.setdefault(collective, Traffic(self.size))

    def _aim(self, seq: int, deadline_s: float, description: Description, traffic: Traffic) -> Channel:
        """The communicator's channel, pointed at call `seq`: one per communicator, reused call after
        call (calls run one at a time), so that nothing is made per call on the path every call takes."""
        channel = self._channel
        channel.tag = COLLECTIVE_TAG_BASE + seq
        channel.deadline = time.monotonic() + deadline_s
        channel.what = description
        channel.traffic = traffic
        return channel

    def _job(self, body: Callable[[Channel], Any], description: Description, seq: int, deadline_s: float,
             traffic: Traffic, nbytes: int) -> Any:
        """Run one call's schedule over the communicator's channel, now that every call before it has run."""
        traffic.calls += 1
        channel = self._aim(seq, deadline_s, description, traffic)
        tracer = self._tracer
        try:
            if not tracer.active:
                return body(channel)
            start = time.perf_counter()
            if tracer.debug:
                fingerprint.check(channel, description)   # before any data moves
            result = body(channel)
        except BaseException as error:
            if tracer.active:
                tracer.failed(description, error)
            self._broken(description, error)
            raise
        tracer.finished(description, nbytes, time.perf_counter() - start)
        return result

    def _broken(self, description: Description, error: BaseException) -> None:
        """A call that failed half-way for a reason of this rank's own (a bug, an interrupt, memory)
        leaves its peers waiting for messages that will never come: abort the communicator so that
        they raise `CommunicatorAborted` naming this rank and the error now, not at their deadline.
        Errors the peers see for themselves (timeouts, lost peers, aborts, mismatches) abort nothing,
        except in a hierarchical call: there any error but a mismatch or a bad argument aborts both
        levels, so that ranks blocked on the level this rank is not on are released too."""
        first = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        reason = f"rank {self.rank} failed in {self.name} {description.label()} ({first})"
        if (description.algorithm == "hierarchical" and self._levels is not None
                and not isinstance(error, (CollectiveMismatch, InvalidArgument))):
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
        seq = self._seq
        self._seq += 1
        return Channel(self.transport, COLLECTIVE_TAG_BASE + seq, time.monotonic() + limit,
                       f"{self.name} {what} #{seq - self._hidden}",
                       self._traffic.setdefault(what, Traffic(self.size)))

    # -- hosts -----------------------------------------------------------------------------------

    def discover_hosts(self) -> Layout:
        """Collective: learn which host each rank runs on (COLLS_HOST, else the host name), so that
        collectives over ranks that span hosts run hierarchically. `colls.init()` calls it."""
        self.layout, self._shm_inside = self._internally(discover, self)
        self._check.use(Selector(self.transport.name, self.size, self.layout.spans_hosts))
        return self.layout

    def _build_levels(self) -> None:
        levels = self._internally(build_levels, self, self._shm_inside)
        self._levels = self.transport.levels = levels

    def _internally(self, setup: Callable[..., Any], *args: Any) -> Any:
        """Run `setup`'s collectives as colls' own: they neither count in `stats()` nor take the
        numbers of the user's calls in messages (the user's first call stays #0)."""
        before, counters = self._seq, self._traffic
        self._traffic = {}
        try:
            return setup(*args)
        finally:
            self._traffic = counters
            self._hidden += self._seq - before

    # -- point to point --------------------------------------------------------------------------

    def send(self, x, dst: int, tag: int = 0, async_op: bool = False, timeout: float | None = None) -> Result:
        """Send `x` to rank `dst`; matched by a `recv` on `dst` from this rank with the same tag.

        With `async_op=True` the send is posted and a handle returned at once (MPI_Isend); the buffer
        must not change until `wait()` returns.
        """
        x = self._check.array("send", x)
        dst = self._check.peer("send", dst, "dst")
        tag = self._user_tag("send", tag)
        flat = x.reshape(-1)
        return self._point_to_point("send", lambda: self.transport.isend(flat, dst, tag), dst, flat.nbytes,
                                    None, async_op, timeout)

    def recv(self, x: np.ndarray, src: int, tag: int = 0, async_op: bool = False,
             timeout: float | None = None) -> Result:
        """Receive into `x` (in place; contiguous and writable) from rank `src`; returns `x`."""
        on_device = type(x) is not np.ndarray and is_cupy(x) and self.transport.device_buffers
        if not (isinstance(x, np.ndarray) or on_device) or not x.flags.c_contiguous or not (
                on_device or x.flags.writeable):
            raise self._check.fail("recv", "x must be a writable C-contiguous numpy array (or, over "
                                           "cuda_ipc, cupy array) to receive into")
        if x.dtype.hasobject:   # references to objects of this process: no bytes to receive into
            raise self._check.fail("recv", f"x has dtype {x.dtype}, which holds Python objects")
        src = self._check.peer("recv", src, "src")
        tag = self._user_tag("recv", tag)
        flat = x.reshape(-1)
        return self._point_to_point("recv", lambda: self.transport.irecv(flat, src, tag), src, flat.nbytes,
                                    x, async_op, timeout)

    def _point_to_point(self, what: str, post: Callable[[], Any], peer: int, nbytes: int, result: Any,
                        async_op: bool, timeout: float | None) -> Result:
        """Post in issue order (behind queued asynchronous work), then wait now or on `wait()`.

        Point-to-point calls take no collective sequence number: only some ranks make them, and
        the collectives' tags must stay the same on every rank.
        """
        if self.closed:
            raise self._check.fail(what, "the communicator is closed")
        limit = self.timeout if timeout is None else self._check.timeout(what, timeout)
        traffic = self._traffic.setdefault(what, Traffic(self.size))
        traffic.calls += 1
        if what == "send":
            traffic.messages_sent[peer] += 1
            traffic.bytes_sent[peer] += nbytes
        else:
            traffic.messages_received[peer] += 1
            traffic.bytes_received[peer] += nbytes
        request = self._executor.run(what, False, post)
        work = RequestWork(f"{self.name} {what} ({request!r})", self._executor, self.transport, request,
                           time.monotonic() + limit, result)
        return work if async_op else work.wait()

    def _user_tag(self, what: str, tag: object) -> int:
        limit = self.transport.user_tag_limit
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not 0 <= tag < limit:
            raise self._check.fail(what, f"tag={tag!r} must be an int in 0..{limit - 1} "
                                         f"(the {self.transport.name} transport's range)")
        return int(tag)

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

    def _source(self, x, given: np.ndarray | None, async_op: bool) -> Callable[[], np.ndarray]:
        """What a call's body reads as its input, flat: `given` where it is not None, else a copy of
        `x`, made now for an asynchronous call (its caller may change `x` before the body runs, as
        before), else in the scratch when the body runs (`_scratch`)."""
        if given is not None:
            flat = given.reshape(-1)
            return lambda: flat
        if async_op:
            made = x.copy().reshape(-1)
            return lambda: made
        return lambda: self._scratch(x)

    def _scratch(self, like: np.ndarray) -> np.ndarray:
        """A flat work buffer of `like`'s dtype and size, for a blocking call's body only (bodies run
        one at a time, in issue order): kept from call to call and grown to the largest asked for, so a
        schedule that folds into its input costs a copy but no allocation per call. On a transport
        whose peers can map registered memory (shm) it is registered (`colls.alloc`): its big
        messages are read out of a mapping instead of page by page. Device arrays get a fresh copy."""
        if not isinstance(like, np.ndarray):
            return like.copy().reshape(-1)
        held = self._scratch_bytes
        if held is None or held.nbytes < like.nbytes:
            held = None
            if getattr(self.transport, "mappable", False):   # (shm: imported where it is used)
                from transports.shm import MAPPED_BYTES
                if like.nbytes >= MAPPED_BYTES:
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
