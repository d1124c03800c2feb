"""One rank's part of a program: issue every step on real communicators, check each result.

A wrong result is recorded and the rank goes on (every rank still makes the same calls, so the
program stays in step); an exception ends this rank's run, since its peers may now wait forever.
Every call's timeout is what is left of the program's deadline, so a hang becomes a
`CollectiveTimeout` naming the call. The report is plain data, so it can cross a pipe or MPI.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import numpy as np

import colls
from transports.errors import CollectiveTimeout, CommunicatorAborted, PeerLost

from .. import config
from ..communicator import Communicator
from .oracle import OPS, call_problem, digest, expected, inputs, same_everywhere, send_counts, sentinel_like
from .program import INVALID, Program, Step, split_colors, split_groups

REGISTERED_VARIABLE = "COLLS_FUZZ_REGISTERED"   # `colls fuzz --registered`: "1" puts buffers in colls.alloc's


def own(array: np.ndarray, fresh: bool = False) -> np.ndarray:
    """A copy of `array` for a call to use (`fresh`: `array` itself, made for the call), in
    registered memory under `colls fuzz --registered`."""
    if not config.get(REGISTERED_VARIABLE):
        return array if fresh else array.copy()
    copy = colls.alloc(array.shape, array.dtype)
    copy[...] = array
    return copy


MAX_FAILURES = 8   # per rank and program: the first ones say it all


class _Abort(Exception):
    """This rank cannot go on with the program."""


class _Member:
    """A communicator of the program as this rank sees it, with its members as program ranks."""

    def __init__(self, comm: Communicator | None, members: list[int] | None, owned: bool) -> None:
        self.comm = comm
        self.members = members
        self.owned = owned   # made by the program, so closed at its end


class RankRun:
    """The state of one rank running one program."""

    def __init__(self, program: Program, rank: int, deadline_s: float) -> None:
        self.program = program
        self.rank = rank
        self.end = time.monotonic() + deadline_s
        self.deadline_s = deadline_s
        self.failures: list[dict[str, Any]] = []
        self.digests: dict[str, str] = {}
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.pending: list[tuple[int, int, Any, Any]] = []   # (wait key, step, work, finish)
        self.aborted = False
        self.current = -1

    # -- bookkeeping -----------------------------------------------------------------------------

    def fail(self, index: int, kind: str, message: str, detail: str = "") -> None:
        """Record one failure of step `index` on this rank."""
        if len(self.failures) < MAX_FAILURES:
            step = self.program.steps[index] if 0 <= index < len(self.program.steps) else None
            self.failures.append({"rank": self.rank, "step": index, "kind": kind, "message": message,
                                  "label": step.label() if step else "", "detail": detail})

    def remaining(self, index: int) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            self.fail(index, "timeout", f"the program's deadline of {self.deadline_s:g} s passed")
            raise _Abort
        return left

    def report(self) -> dict[str, Any]:
        """What this rank did, as plain data."""
        return {"rank": self.rank, "failures": self.failures, "aborted": self.aborted,
                "digests": self.digests, "calls": self.calls, "bytes": self.bytes}

    # -- running ---------------------------------------------------------------------------------

    def run(self, base: Communicator | None) -> dict[str, Any]:
        """Run every step with `base` as the program's group (None: this rank sits the program out)."""
        members = list(range(self.program.size)) if base is not None else None
        comms = [_Member(base, members, owned=False)]
        try:
            for index, step in enumerate(self.program.steps):
                self.current = index
                if step.kind == "split":
                    comms.append(self.split(index, step, comms[step.comm]))
                elif step.kind == "wait":
                    self.finish_pending()
                elif comms[step.comm].comm is None:
                    continue
                elif step.kind == "p2p":
                    self.point_to_point(index, step, comms[step.comm].comm)
                elif step.kind == "invalid":
                    self.invalid(index, step, comms[step.comm].comm)
                else:
                    self.collective(index, step, comms[step.comm])
            self.current = len(self.program.steps)
            self.finish_pending()
            for member in reversed(comms):
                if member.owned and member.comm is not None:
                    member.comm.close()
        except _Abort:
            self.aborted = True
        except BaseException as error:   # anything else is a crash of this rank at the current step
            self.aborted = True
            self.record_error(self.current, error)
        if self.aborted:
            self.errors_of_pending()
        return self.report()

    def errors_of_pending(self) -> None:
        """Record the errors of async calls that had already failed when the run stopped: an async
        call that hung is the cause of whatever timed out after it."""
        for _, index, work, _ in self.pending:
            if hasattr(work, "is_completed") and work.is_completed():
                try:
                    work.wait(0)
                except BaseException as error:
                    self.record_error(index, error)

    def record_error(self, index: int, error: BaseException) -> None:
        if isinstance(error, (CollectiveTimeout, TimeoutError)):
            kind = "timeout"
        elif isinstance(error, PeerLost):
            kind = "peer lost"
        elif isinstance(error, CommunicatorAborted):   # a peer failed first and aborted the call
            kind = "aborted"
        else:
            kind = "crash"
        detail = "" if kind != "crash" else "".join(traceback.format_exception(error)[-6:])
        self.fail(index, kind, f"{type(error).__name__}: {error}".splitlines()[0][:400], detail)

    def split(self, index: int, step: Step, parent: _Member) -> _Member:
        comm, members = parent.comm, parent.members
        if comm is None or members is None:
            return _Member(None, None, owned=False)
        color, key = split_colors(step.coloring, step.reverse, comm.size)[comm.rank]
        comm.timeout = self.remaining(index)
        try:
            child = comm.split(color, key)
        except BaseException as error:
            self.record_error(index, error)
            raise _Abort from None
        self.count(step, 0)
        group = split_groups(step.coloring, step.reverse, comm.size)[comm.rank]
        if group is None:
            if child is not None:
                self.fail(index, "wrong result", f"split gave color {color} a communicator; expected None")
            return _Member(None, None, owned=False)
        if child is None or child.size != len(group) or child.rank != group.index(comm.rank):
            got = "None" if child is None else f"rank {child.rank} of {child.size}"
            self.fail(index, "wrong result", f"split gave {got}; expected rank {group.index(comm.rank)} "
                                             f"of {len(group)}")
            raise _Abort
        return _Member(child, [members[p] for p in group], owned=True)

    def collective(self, index: int, step: Step, member: _Member) -> None:
        comm = member.comm
        assert comm is not None and member.members is not None
        kind, rank, seed = step.kind, comm.rank, self.program.seed
        kwargs: dict[str, Any] = {"async_op": step.async_op, "timeout": self.remaining(index)}
        if step.algorithm is not None:
            kwargs["algorithm"] = step.algorithm
        if kind == "barrier":
            result = comm.barrier(**kwargs)
            self.later(index, step, result, lambda got: self.count(step, 0))
            return
        xs = inputs(seed, index, comm.size, kind, step.rows, step.dtype, step.tail, step.op)
        root = step.root % comm.size
        counts = send_counts(seed, index, xs) if kind == "all_to_all_v" else None
        want = expected(kind, xs, rank, step.op, root, counts)
        x = own(xs[rank])
        out = None
        if step.mode == "out" and want is not None:
            out = own(sentinel_like(want), fresh=True)
        elif step.mode == "inplace" and kind == "all_gather":
            # MPI_IN_PLACE's form: the input is this rank's block of the output
            out = own(sentinel_like(want), fresh=True)
            rows = len(xs[rank])
            x = out[rank * rows:(rank + 1) * rows]
            x[...] = xs[rank]
        elif step.mode == "inplace":
            if kind == "broadcast" and rank != root:
                x = own(sentinel_like(x), fresh=True)   # a receiver's bytes must all be replaced
            out = x
        op = OPS[step.op] if step.op else None
        if kind in ("all_reduce", "reduce_scatter"):
            result = getattr(comm, kind)(x, op=op, out=out, **kwargs)
        elif kind == "reduce":
            result = comm.reduce(x, root=root, op=op, out=out, **kwargs)
        elif kind in ("broadcast", "gather"):
            result = getattr(comm, kind)(x, root=root, out=out, **kwargs)
        elif kind == "scatter":
            given = None if step.mode == "out" and rank != root else x   # receivers may give out only
            result = comm.scatter(given, root=root, out=out, **kwargs)
        elif kind == "all_to_all_v":
            result = comm.all_to_all_v(x, counts[rank], **kwargs)
        else:
            result = getattr(comm, kind)(x, out=out, **kwargs)

        def finish(got: Any) -> None:
            problem = call_problem(got, want, x, xs[rank], out)
            if problem:
                self.fail(index, "wrong result", f"{kind} on group rank {rank} of {comm.size}: {problem}")
            if same_everywhere(kind):
                self.digests[f"{index}/{min(member.members)}"] = digest(got)
            self.count(step, got[0].nbytes if isinstance(got, tuple) else getattr(got, "nbytes", 0))

        self.later(index, step, result, finish)

    def point_to_point(self, index: int, step: Step, comm: Communicator) -> None:
        """Every rank sends its input to rank + k and receives rank - k's: the first call posted
        async, the second blocking unless the step is async; checked when both are done."""
        size, rank = comm.size, comm.rank
        if size == 1:
            self.count(step, 0)
            return
        shift = 1 + (step.root - 1) % (size - 1)
        dst, src = (rank + shift) % size, (rank - shift) % size
        xs = inputs(self.program.seed, index, size, "p2p", step.rows, step.dtype, step.tail)
        x, buf = own(xs[rank]), own(sentinel_like(xs[src]), fresh=True)
        timeout = self.remaining(index)

        def send(async_op: bool) -> Any:
            return comm.send(x, dst, tag=step.tag, async_op=async_op, timeout=timeout)

        def recv(async_op: bool) -> Any:
            return comm.recv(buf, src, tag=step.tag, async_op=async_op, timeout=timeout)

        if step.mode == "out":   # the receive is posted first
            first = recv(True)
            second = send(step.async_op)
        else:
            first = send(True)
            second = recv(step.async_op)

        def finish(_: Any) -> None:
            got_first = first.wait(self.remaining(index) + 1.0)
            got_second = second.wait(self.remaining(index) + 1.0) if step.async_op else second
            got = got_first if step.mode == "out" else got_second
            problem = call_problem(got, xs[src], x, xs[rank], buf)
            if problem:
                self.fail(index, "wrong result", f"p2p recv on group rank {rank} of {size} from rank "
                                                 f"{src}: {problem}")
            self.count(step, buf.nbytes)

        self.later(index, step, _Posted(), finish)

    def invalid(self, index: int, step: Step, comm: Communicator) -> None:
        """Make the step's bad call: it must raise at once, naming the argument and this rank, and
        move no byte (the communicator goes on with the next step)."""
        if step.bad == "blocks" and comm.size == 1:   # every length splits into one block
            self.count(step, 0)
            return
        before = comm.stats()
        try:
            bad_call(step.bad, comm, step.root)
        except (ValueError, TypeError) as error:
            message = str(error)
            named = INVALID[step.bad]
            if f"rank {comm.rank}" not in message or named not in message:
                self.fail(index, "wrong result", f"the error does not name {named!r} and rank {comm.rank}: "
                                                 f"{type(error).__name__}: {message}"[:400])
        except BaseException as error:
            self.record_error(index, error)
            raise _Abort from None
        else:
            self.fail(index, "wrong result", f"invalid call ({step.bad}) raised nothing")
        if not self.pending and comm.stats() != before:   # (async calls still running move bytes)
            self.fail(index, "wrong result", f"invalid call ({step.bad}) moved bytes before failing")
        self.count(step, 0)

    def later(self, index: int, step: Step, result: Any, finish: Any) -> None:
        """Check a blocking call's result now, an async one's when it is waited for."""
        if step.async_op:
            self.pending.append((step.wait, index, result, finish))
        else:
            finish(result)

    def finish_pending(self) -> None:
        """Wait for the pending async calls in (wait key, step) order and check their results."""
        self.pending.sort(key=lambda p: (p[0], p[1]))
        while self.pending:   # the ones not yet waited stay listed, for errors_of_pending
            _, index, work, finish = self.pending[0]
            self.current = index
            got = work.wait(self.remaining(index) + 1.0)
            self.pending.pop(0)
            finish(got)

    def count(self, step: Step, nbytes: int) -> None:
        self.calls[step.kind] = self.calls.get(step.kind, 0) + 1
        self.bytes[step.kind] = self.bytes.get(step.kind, 0) + int(nbytes)


class _Posted:
    """The handle of a p2p step: its own `finish` waits for the requests."""

    def wait(self, timeout: float | None = None) -> None:
        return None

    def is_completed(self) -> bool:
        return True


def bad_call(bad: str, comm: Communicator, salt: int) -> None:
    """One deliberately invalid call (the same on every rank, so no rank is left waiting)."""
    size = comm.size
    x = np.arange(2 * size, dtype=np.float32)
    if bad == "root":
        comm.broadcast(x, root=size + salt)
    elif bad == "op_dtype":
        comm.all_reduce(x, op=colls.BAND)
    elif bad == "out_shape":
        comm.all_reduce(x, out=np.empty(x.size + 1 + salt, x.dtype))
    elif bad == "send_counts":
        comm.all_to_all_v(x, [2] * size + [salt] if salt % 2 else [x.size + 1] + [0] * (size - 1))
    elif bad == "negative_counts":
        comm.all_to_all_v(x, [-1] + [0] * (size - 2) + [x.size + 1] if size > 1 else [-1])
    elif bad == "algorithm":
        comm.all_reduce(x, algorithm=f"no_such_algorithm_{salt}")
    elif bad == "dst":
        comm.send(x, size + salt)
    elif bad == "src":
        comm.recv(x, colls.ANY_SOURCE - 1 - salt)   # negative, and never the wildcard
    elif bad == "tag":
        comm.send(x, (comm.rank + 1) % size, tag=-1 - salt)
    elif bad == "blocks":
        comm.reduce_scatter(np.arange(size * (salt + 1) + 1, dtype=np.int64))
    elif bad == "object":
        comm.all_gather(np.array([None, salt], dtype=object))
    elif bad == "recv_readonly":
        x.setflags(write=False)
        comm.recv(x, (comm.rank - 1) % size)
    else:
        raise ValueError(f"unknown invalid call {bad!r}")


def run_on_rank(base: Communicator | None, program: Program, rank: int, deadline_s: float) -> dict[str, Any]:
    """Run `program` as program rank `rank` over `base` (None: sit it out); returns the report."""
    return RankRun(program, rank, deadline_s).run(base)
