"""Where programs run: a group of real ranks per transport, and the verdict from their reports.

- `local`: a fresh `LocalWorld` of threads per program (cheap; nothing carries over).
- `shm`: one long-lived set of forked processes (`colls.spawn`) that take programs from pipes, so a
  program costs no fork or segment setup; after any failure the set is killed and started afresh.
- `mpi`: the ranks of `mpiexec`; rank 0 runs the fuzzer and sends each program to the others over
  a duplicate of MPI_COMM_WORLD that colls never touches, so a broken collective cannot garble it.

A program on n ranks runs over a sub-communicator of the first n (made once per n by `split`).
Only the control plane (programs out, reports back) bypasses colls; every checked byte goes through it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

from ..communicator import Communicator
from ..spawn import SpawnError, spawn
from .execute import run_on_rank
from .program import Program

SLACK_S = 5.0          # beyond the program deadline before a silent rank counts as hung
ABORT_GRACE_S = 0.3    # after one rank aborts, how long to wait for the others' reports
START_TIMEOUT_S = 60.0
PROGRAM_TAG, REPORT_TAG = 1, 2   # on the mpi control communicator


class Worker:
    """One rank's long-lived side: the world communicator and a sub-communicator per program size."""

    def __init__(self, world: Communicator) -> None:
        self.world = world
        self.bases: dict[int, Communicator | None] = {world.size: world}

    def run(self, program_json: str, deadline_s: float) -> dict[str, Any]:
        """Run one program (as JSON) and return this rank's report."""
        program = Program.from_json(program_json)
        rank = self.world.rank
        if program.size not in self.bases:
            self.world.timeout = deadline_s
            try:
                self.bases[program.size] = self.world.split(0 if rank < program.size else None)
            except Exception as error:   # the group itself cannot be made: report, do not die
                failure = {"rank": rank, "step": -1, "kind": "crash", "label": "", "detail": "",
                           "message": f"splitting off the first {program.size} ranks: "
                                      f"{type(error).__name__}: {error}"}
                return {"rank": rank, "failures": [failure], "aborted": True}
        base = self.bases[program.size]
        if base is None:
            return {"rank": rank, "idle": True}
        base.timeout = deadline_s
        return run_on_rank(base, program, rank, deadline_s)

    def close(self, drain: bool = True) -> None:
        """Release every communicator this worker made (MPI complains at exit otherwise); after a
        failure (`drain=False`) only the transports, since a failed call may never finish."""
        for comm in [c for c in self.bases.values() if c is not None and c is not self.world] + [self.world]:
            if drain:
                comm.close()
            else:
                comm.transport.close()


def _serve(comm: Communicator, pipes: list) -> None:
    """A shm worker: run the programs that arrive on this rank's pipe until told to stop (None)."""
    pipe = pipes[comm.rank]
    pipe.send(("ready", os.getpid()))
    worker = Worker(comm)
    while True:
        message = pipe.recv()
        if message is None:
            return
        pipe.send(worker.run(*message))


class LocalGroup:
    """Ranks as threads of this process, a fresh world for every program."""

    transport = "local"

    def __init__(self, max_ranks: int) -> None:
        self.max_ranks = max_ranks

    def run(self, program: Program, deadline_s: float) -> list[dict[str, Any] | None]:
        """Every rank's report (None for a rank that never reported: a hang)."""
        from transports.local import LocalWorld

        world = LocalWorld(program.size)
        reports: list[dict[str, Any] | None] = [None] * program.size

        def rank_main(rank: int) -> None:
            report = run_on_rank(Communicator(world.transport(rank), deadline_s), program, rank, deadline_s)
            reports[rank] = report
            if report["aborted"]:
                # its peers fail fast (PeerLost) instead of waiting for the deadline
                world.mark_lost(rank, "it stopped after a failure")

        threads = [threading.Thread(target=rank_main, args=(r,), name=f"colls-fuzz-{r}", daemon=True)
                   for r in range(program.size)]
        for thread in threads:
            thread.start()
        end = time.monotonic() + deadline_s + SLACK_S
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))
        return reports

    def close(self) -> None:
        """Nothing outlives a program."""


class ShmGroup:
    """`max_ranks` forked processes over shared memory, fed programs through pipes."""

    transport = "shm"

    def __init__(self, max_ranks: int) -> None:
        self.max_ranks = max_ranks
        self.pipes: list = []
        self.pids: list[int] = []
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        """Fork the ranks and wait until each has said hello."""
        context = multiprocessing.get_context("fork")
        pairs = [context.Pipe(duplex=True) for _ in range(self.max_ranks)]
        self.pipes = [parent for parent, _ in pairs]
        children = [child for _, child in pairs]
        self.error = None

        def keep() -> None:
            try:
                spawn(_serve, self.max_ranks, transport="shm", args=(children,))
            except (SpawnError, OSError) as error:
                self.error = error

        self.thread = threading.Thread(target=keep, name="colls-fuzz-shm", daemon=True)
        self.thread.start()
        self.pids = []
        for rank, pipe in enumerate(self.pipes):
            if not pipe.poll(START_TIMEOUT_S):
                raise RuntimeError(f"shm rank {rank} did not start in {START_TIMEOUT_S:g} s: {self.error}")
            self.pids.append(pipe.recv()[1])

    def stop(self, kill: bool = False) -> None:
        """End the ranks (politely unless `kill`) and wait until spawn has cleaned up."""
        if self.thread is None:
            return
        for pid, pipe in zip(self.pids, self.pipes, strict=False):
            try:
                if kill:
                    os.kill(pid, signal.SIGKILL)
                else:
                    pipe.send(None)
            except (OSError, BrokenPipeError):
                pass
        self.thread.join(30)
        for pipe in self.pipes:
            pipe.close()
        self.thread = None

    def run(self, program: Program, deadline_s: float) -> list[dict[str, Any] | None]:
        """Every rank's report, the idle ones included (None for a rank that never reported)."""
        if self.thread is None or not self.thread.is_alive():
            self.stop(kill=True)
            self.start()
        message = (program.to_json(), deadline_s)
        for pipe in self.pipes:
            pipe.send(message)
        reports: list[dict[str, Any] | None] = [None] * self.max_ranks
        end = time.monotonic() + deadline_s + SLACK_S
        waiting = set(range(self.max_ranks))
        next_liveness = time.monotonic() + 0.1
        while waiting and time.monotonic() < end:
            for rank in list(waiting):
                if self.pipes[rank].poll(0.001 if len(waiting) > 1 else 0.01):
                    reports[rank] = self.pipes[rank].recv()
                    waiting.discard(rank)
                    if reports[rank].get("aborted"):
                        end = min(end, time.monotonic() + ABORT_GRACE_S)
            if time.monotonic() > next_liveness:
                next_liveness = time.monotonic() + 0.1
                for rank in [r for r in waiting if not _alive(self.pids[r])]:
                    reports[rank] = died(rank)   # no report will come: say so, not "hang"
                    waiting.discard(rank)
                    end = min(end, time.monotonic() + ABORT_GRACE_S)
        if waiting or any(r is not None and r.get("aborted") for r in reports):
            self.stop(kill=True)   # its state is suspect: start afresh for the next program
        return reports[:program.size]

    def close(self) -> None:
        """Stop the ranks."""
        self.stop()


def died(rank: int) -> dict[str, Any]:
    """The report of a rank whose process ended in the middle of a program."""
    failure = {"rank": rank, "step": -1, "kind": "crash", "label": "", "detail": "",
               "message": "its process died in the middle of the program"}
    return {"rank": rank, "failures": [failure], "aborted": True}


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


class MpiGroup:
    """The ranks of an mpiexec job; call `serve()` on every rank but 0, `run()` on rank 0."""

    transport = "mpi"

    def __init__(self) -> None:
        from transports.mpi import import_mpi

        self.MPI = import_mpi()
        self.control = self.MPI.COMM_WORLD.Dup()   # programs and reports only; colls never sees it
        self.rank = self.control.Get_rank()
        self.max_ranks = self.control.Get_size()
        self.worker: Worker | None = None
        self.fresh = True

    def _fresh_worker(self) -> Worker:
        from transports.mpi import MpiTransport

        return Worker(Communicator(MpiTransport(self.MPI.COMM_WORLD)))

    def _one(self, message: tuple[str, float, bool]) -> dict[str, Any]:
        program_json, deadline_s, fresh = message
        if fresh or self.worker is None:
            if self.worker is not None:
                self.worker.close(drain=False)
            self.worker = self._fresh_worker()   # a new context: stray messages of a failure stay behind
        self.fresh = fresh
        return self.worker.run(program_json, deadline_s)

    def _send_all(self, message: object) -> None:
        for rank in range(1, self.max_ranks):
            self.control.send(message, dest=rank, tag=PROGRAM_TAG)

    def _await(self, source: int, tag: int, deadline: float | None = None) -> Any:
        """Receive one control message, sleeping between probes: MPI's blocking calls spin, and a
        spinning idle rank takes a core from the ranks that run the program."""
        pause = 1e-5
        while not self.control.Iprobe(source=source, tag=tag):
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"colls fuzz: mpi rank {source} sent no report within its program's "
                                   f"deadline and slack; it is stuck beyond any colls timeout, so the "
                                   f"job cannot go on (the last program hung)")
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
        return self.control.recv(source=source, tag=tag)

    def run(self, program: Program, deadline_s: float) -> list[dict[str, Any] | None]:
        """Rank 0: run `program` on every rank and collect the reports."""
        message = (program.to_json(), deadline_s, self.fresh)
        self._send_all(message)
        reports = [self._one(message)]
        end = time.monotonic() + deadline_s + SLACK_S
        reports += [self._await(rank, REPORT_TAG, end) for rank in range(1, self.max_ranks)]
        self.fresh = any(r.get("aborted") for r in reports)
        return reports[:program.size]

    def _closing(self, fresh: bool) -> None:
        if self.worker is not None:
            self.worker.close(drain=not fresh)
        self.control.Free()

    def serve(self) -> None:
        """Every other rank: run what rank 0 sends until it says stop."""
        while True:
            message = self._await(0, PROGRAM_TAG)
            if not isinstance(message, tuple):
                self._closing(bool(message))
                return
            self.control.send(self._one(message), dest=0, tag=REPORT_TAG)

    def close(self) -> None:
        """Rank 0: release the other ranks, then every rank's communicators."""
        if self.rank == 0:
            self._send_all(self.fresh)   # a bool, not a program: stop
            self._closing(self.fresh)


def make_group(transport: str, max_ranks: int):
    """The group for `transport` (for mpi, the mpiexec job this process belongs to)."""
    if transport == "local":
        return LocalGroup(max_ranks)
    if transport == "shm":
        return ShmGroup(max_ranks)
    if transport == "mpi":
        return MpiGroup()
    raise ValueError(f"transport {transport!r}: choose local, shm or mpi")
