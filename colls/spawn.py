"""`colls.spawn(fn, nprocs)`: run `fn(comm)` on every rank from a script or a notebook.

With `transport="local"` the ranks are threads of this process; with `shm` they are forked
processes (so a function defined in a notebook works) that rendezvous like `colls run`'s children.
Either way the per-rank return values come back as a list, and a failure on any rank raises
`SpawnError` naming the ranks and their tracebacks, after the others have been stopped.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from transports.errors import CollsError, InvalidArgument

from .communicator import Communicator
from .hierarchy import Layout
from .launcher import cleanup_job_segments, job_environment


class SpawnError(CollsError):
    """One or more spawned ranks failed; `failures` maps rank to its traceback text."""

    def __init__(self, failures: dict[int, str]) -> None:
        ranks = sorted(failures)
        detail = "\n".join(f"--- rank {rank} ---\n{failures[rank]}" for rank in ranks)
        super().__init__(f"ranks {ranks} failed:\n{detail}")
        self.failures = failures


def spawn(fn: Callable[..., Any], nprocs: int, transport: str = "shm", args: tuple = (),
          timeout: float | None = None, hosts: Sequence[str] | None = None) -> list[Any]:
    """Run `fn(comm, *args)` on `nprocs` ranks and return their results in rank order.

    Args:
        fn: called on every rank with that rank's world communicator and `args`; with `shm` or
            `cuda_ipc` in a forked process, so a function defined in a notebook works.
        nprocs: the number of ranks.
        transport: `local` (threads of this process), `shm` or `cuda_ipc` (processes).
        args: more positional arguments for `fn`.
        timeout: seconds a collective may wait (as `colls.init(timeout=)`); the whole run is given
            up a few seconds after it. None: COLLS_TIMEOUT's.
        hosts: a (virtual) host name per rank, as COLLS_HOST would give, so that collectives run
            across hosts (hierarchically) on one machine.

    Returns:
        What `fn` returned on each rank, in rank order (sent back by pickle from processes).

    Raises:
        InvalidArgument: `nprocs`, `transport` or `hosts` is not one spawn takes.
        SpawnError: a rank raised, died or outlived the timeout; the others were stopped first.
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise InvalidArgument(f"spawn: nprocs must be a positive int, got {nprocs!r}")
    if hosts is not None and (isinstance(hosts, str) or len(hosts) != nprocs
                              or not all(isinstance(h, str) and h for h in hosts)):
        raise InvalidArgument(f"spawn: hosts must be {nprocs} non-empty host names, one per rank, "
                              f"got {hosts!r}")
    if transport == "local":
        return _spawn_threads(fn, nprocs, args, timeout, hosts)
    if transport in ("shm", "cuda_ipc"):
        return _spawn_processes(fn, nprocs, args, timeout, hosts, transport)
    raise InvalidArgument(f"spawn: transport={transport!r}; spawn runs 'local', 'shm' or 'cuda_ipc' "
                          f"(for mpi, start the script with mpiexec)")


def _spawn_threads(fn, nprocs: int, args: tuple, timeout: float | None,
                   hosts: Sequence[str] | None) -> list[Any]:
    from transports.local import LocalWorld

    world = LocalWorld(nprocs)
    layout = None if hosts is None else Layout.from_names(hosts)   # threads share one environment
    results: list[Any] = [None] * nprocs
    failures: dict[int, str] = {}

    def rank_main(rank: int) -> None:
        comm = Communicator(world.transport(rank), timeout, layout=layout)
        try:
            results[rank] = fn(comm, *args)
        except BaseException:
            failures[rank] = traceback.format_exc()
            world.mark_lost(rank, "its function raised")

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"colls-rank-{r}", daemon=True)
               for r in range(nprocs)]
    for thread in threads:
        thread.start()
    limit = None if timeout is None else time.monotonic() + timeout + 5
    for rank, thread in enumerate(threads):
        thread.join(None if limit is None else max(0.0, limit - time.monotonic()))
        if thread.is_alive():
            failures.setdefault(rank, "still running after the timeout")
    if failures:
        raise SpawnError(failures)
    return results


def _child(fn, rank: int, args: tuple, env: dict[str, str], timeout: float | None, pipe) -> None:
    from .launcher import without_outer_launcher

    # a rank of its own job, not of an mpiexec the parent runs under (`colls.init` would join that)
    outer = set(os.environ) - set(without_outer_launcher(os.environ))
    for name in outer:
        del os.environ[name]
    os.environ.update(env)
    from . import bootstrap

    bootstrap._world = None   # a fork copies the parent's world; this rank needs its own
    try:
        comm = bootstrap.init(timeout=timeout)
        result = fn(comm, *args)
        comm.close()
        pipe.send(("ok", result))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
    finally:
        pipe.close()


def _spawn_processes(fn, nprocs: int, args: tuple, timeout: float | None,
                     hosts: Sequence[str] | None, transport: str = "shm") -> list[Any]:
    """Fork the ranks (cuda_ipc: the parent must not have initialised CUDA, which a fork cannot
    inherit)."""
    context = multiprocessing.get_context("fork")
    job = secrets.token_hex(6)
    rendezvous = tempfile.mkdtemp(prefix="colls-rdv-")
    processes, pipes = [], []
    try:
        for rank in range(nprocs):
            env = job_environment(rank, nprocs, transport, rendezvous, job)
            if hosts is not None:
                env["COLLS_HOST"] = hosts[rank]
            parent_end, child_end = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(fn, rank, args, env, timeout, child_end),
                                      name=f"colls-rank-{rank}", daemon=True)
            process.start()
            child_end.close()
            processes.append(process)
            pipes.append(parent_end)
        return _collect(processes, pipes, timeout)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join(5)
        shutil.rmtree(rendezvous, ignore_errors=True)
        cleanup_job_segments(job)


def _collect(processes, pipes, timeout: float | None) -> list[Any]:
    """Results in rank order; on the first failure stop everyone and raise SpawnError."""
    results: list[Any] = [None] * len(processes)
    waiting = set(range(len(processes)))
    failures: dict[int, str] = {}
    limit = None if timeout is None else time.monotonic() + timeout + 10
    while waiting and not failures:
        for rank in list(waiting):
            if pipes[rank].poll(0.01):
                try:
                    status, value = pipes[rank].recv()
                except EOFError:
                    status, value = "error", "the process ended without a result"
                if status == "ok":
                    results[rank] = value
                else:
                    failures[rank] = value
                waiting.discard(rank)
            elif not processes[rank].is_alive() and not pipes[rank].poll(0):
                failures[rank] = f"the process died with exit code {processes[rank].exitcode}"
                waiting.discard(rank)
        if limit is not None and time.monotonic() > limit:
            failures.update({rank: "still running after the timeout" for rank in waiting})
    if failures:
        for process in processes:
            if process.is_alive():
                process.terminate()
        raise SpawnError(failures)
    return results
