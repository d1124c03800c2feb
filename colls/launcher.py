"""`colls run`: start N ranks of a Python program, prefix their output, fail all if one fails, clean up.

Like torchrun's elastic agent reduced to one machine and one try: the launcher gives every rank its
identity through the environment, relays each line of output tagged `[rank]`, and, as soon as one
rank exits non-zero, terminates the rest (SIGTERM, then SIGKILL after a grace) so a job never hangs
on a dead peer. Whatever happens, the rendezvous directory and any shared-memory segment named after
the job are removed at the end.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO

from transports.base import process_alive
from transports.segment import SHM_DIR, mpich_segments, remove_job_segments, remove_orphaned_mpich_segments

from . import config

DEFAULT_TRANSPORT = "shm"
GRACE_SECONDS = 3.0
POLL_SECONDS = 0.02
EXIT_TIMEOUT = 124

# Variables that an outer MPI launcher sets; a rank that inherited them would try to join that outer
# job (MPICH's PMI_FD, Open MPI's world rank) instead of ours, so they are not passed on.
_FOREIGN_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_COMM_WORLD_", "MV2_COMM_WORLD_")


def without_outer_launcher(environment) -> dict[str, str]:
    """`environment` less the variables by which an outer mpiexec names its ranks (`colls.init`
    would take a rank that kept them for one of that job's)."""
    return {key: value for key, value in environment.items()
            if not key.startswith(_FOREIGN_LAUNCHER_PREFIXES)}


def job_environment(rank: int, size: int, transport: str, rendezvous: str, job: str) -> dict[str, str]:
    """The variables that tell one rank who it is and where to meet its peers."""
    return {
        "COLLS_RANK": str(rank),
        "COLLS_WORLD_SIZE": str(size),
        "COLLS_LOCAL_RANK": str(rank),  # one machine: the local rank is the rank
        "COLLS_TRANSPORT": transport,
        "COLLS_RENDEZVOUS": rendezvous,
        "COLLS_JOB": job,
        "PYTHONUNBUFFERED": "1",  # so a rank's lines reach us as it prints them, not at exit
    }


def threads_per_rank(nprocs: int) -> int:
    """The OpenMP threads each of `nprocs` ranks gets unless OMP_NUM_THREADS says otherwise: the
    CPUs this process may use, shared out (at least 1). torch, MKL and OpenBLAS otherwise each start
    a thread per CPU in every rank, and with N ranks the cores run N times as many threads as they
    have (torchrun sets 1 for the same reason)."""
    return max(1, len(os.sched_getaffinity(0)) // nprocs)


def cleanup_job_segments(job: str) -> int:
    """Remove every /dev/shm entry named `colls-<job>-*` (left by a rank that crashed); return how many."""
    return remove_job_segments(job)


def describe_exit(returncode: int) -> str:
    """'exited with code 3' or 'killed by signal SIGKILL', for a Popen return code."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = str(-returncode)
    return f"killed by signal {name}"


def shell_exit_code(returncode: int) -> int:
    """The exit status a shell would report: the code itself, or 128 + signal number."""
    return returncode if returncode >= 0 else 128 - returncode


def _note(message: str) -> None:
    """One line from the launcher itself on stderr."""
    print(f"colls run: {message}", file=sys.stderr, flush=True)


class _LineRelay(threading.Thread):
    """Copy one child's pipe to our stream line by line, each line prefixed with the rank (or not)."""

    def __init__(self, rank: int, source: IO[bytes], target: IO[str], lock: threading.Lock,
                 prefix: bool = True) -> None:
        super().__init__(name=f"colls-relay-{rank}", daemon=True)
        self.prefix = f"[{rank}] ".encode() if prefix else b""
        self.source = source
        self.target = target
        self.lock = lock

    def run(self) -> None:
        # Whole lines under one lock: ranks interleave by line, never mid-line.
        for line in iter(self.source.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"  # a last line without newline still ends cleanly
            with self.lock:
                try:
                    self._write(self.prefix + line)
                except (BrokenPipeError, ValueError, OSError):
                    pass  # our reader went away (`| head`); keep draining so the child never blocks
        self.source.close()

    def _write(self, data: bytes) -> None:
        buffer = getattr(self.target, "buffer", None)
        if buffer is not None:
            self.target.flush()  # text written before us must come out first
            buffer.write(data)
            buffer.flush()
        else:
            self.target.write(data.decode(errors="replace"))
            self.target.flush()


class _SignalCatcher:
    """Turn SIGINT/SIGTERM/SIGHUP to the launcher into a flag the monitor loop reads (main thread
    only). The ranks lead sessions of their own, so a closed terminal's SIGHUP reaches only us."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _SignalCatcher:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(signum) is signal.SIG_IGN:
                    continue   # ignored by whoever started us (`nohup`, a background job): kept so
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    """Send `signum` to a child and everything it started (it leads its own session)."""
    try:
        os.killpg(child.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _child_environment(extra: dict[str, str] | None) -> dict[str, str]:
    """Our environment plus `extra`, minus the variables of an outer MPI launcher."""
    base = without_outer_launcher(os.environ)
    base.update(extra or {})
    return base


def _stop_all(children: list[subprocess.Popen], catcher: _SignalCatcher, grace: float) -> None:
    """SIGTERM every live child, then SIGKILL whoever is still there after `grace` s (or a 2nd Ctrl-C)."""
    signals_before = len(catcher.received)
    for child in children:
        if child.poll() is None:
            _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(child.poll() is None for child in children):
        if time.monotonic() > deadline or len(catcher.received) > signals_before:
            break
        time.sleep(POLL_SECONDS)
    for child in children:
        # The whole group, even for a rank that exited: its own children may still be running.
        _signal_group(child, signal.SIGKILL)
    for child in children:
        child.wait()


def _monitor(children: list[subprocess.Popen], catcher: _SignalCatcher, timeout: float | None) -> int:
    """Wait for the job to end; on the first failure, signal or timeout, stop everyone; return the status."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if catcher.received:
            signum = catcher.received[0]
            _note(f"received {signal.Signals(signum).name}; terminating all ranks")
            _stop_all(children, catcher, GRACE_SECONDS)
            return 128 + signum
        for rank, child in enumerate(children):
            returncode = child.poll()
            if returncode is not None and returncode != 0:
                _note(f"rank {rank} {describe_exit(returncode)}; terminating the other ranks")
                _stop_all(children, catcher, GRACE_SECONDS)
                return shell_exit_code(returncode)
        if all(child.poll() == 0 for child in children):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            _note(f"timed out after {timeout:g} s; killing all ranks")
            _stop_all(children, catcher, GRACE_SECONDS)
            return EXIT_TIMEOUT
        time.sleep(POLL_SECONDS)


# `python`, `python3`, `python3.11`, `/usr/bin/python3`, `pypy3`: the first word of an mpiexec habit,
# `colls run -n 4 python script.py`
_INTERPRETER = re.compile(r"(python|pypy)[0-9.]*")


def interpreter_and_program(argv_of_program: list[str]) -> tuple[str, list[str]]:
    """(the Python to run, its arguments) for `argv_of_program`: `script.py args` or `-m module args`
    run under this Python; `python script.py args` (as under mpiexec) under the Python it names.

    Args:
        argv_of_program: what follows the launcher's own options.

    Returns:
        The interpreter's path and the arguments to give it.

    Raises:
        ValueError: the interpreter named is not found, or it is given nothing to run.
    """
    first = argv_of_program[0] if argv_of_program else ""
    if first != sys.executable and not _INTERPRETER.fullmatch(os.path.basename(first)):
        return sys.executable, argv_of_program
    found = shutil.which(first)
    if found is None:
        raise ValueError(f"{first}: no such Python on PATH (give the script alone to run it under "
                         f"{sys.executable})")
    if len(argv_of_program) == 1:
        raise ValueError(f"nothing to run: give {first} a script (or -m module) and its arguments")
    return found, argv_of_program[1:]


def virtual_host(rank: int, nprocs: int, hosts: int) -> str:
    """The COLLS_HOST of `rank` when `nprocs` ranks are split into `hosts` virtual hosts, in order."""
    return f"vhost{rank * hosts // nprocs}"


def launch(argv_of_program: list[str], nprocs: int, transport: str | None = None,
           timeout: float | None = None, env: dict | None = None, hosts: int | None = None,
           prefix: bool = True) -> int:
    """Run `python <argv_of_program>` as `nprocs` ranks, relay their output, and stop them all
    as soon as one fails (`colls run`).

    Args:
        argv_of_program: `script.py args` or `-m module args`, optionally after the Python to run
            them under, as under mpiexec (`python script.py args`).
        nprocs: the number of ranks.
        transport: `shm`, `cuda_ipc` or `mpi` (handed over to mpiexec); None: COLLS_TRANSPORT (in
            `env`, else ours), else shm.
        timeout: seconds after which every rank is killed (status 124); None: no limit.
        env: variables every rank gets on top of ours. OMP_NUM_THREADS, where neither sets it, is
            `threads_per_rank(nprocs)`.
        hosts: split the ranks into that many virtual hosts (COLLS_HOST), consecutive ranks together.
        prefix: start each line of a rank's output with `[rank] `; False: print it as it is, as
            mpiexec does (`--as-mpi4py`), still a whole line at a time.

    Returns:
        The job's exit status by the shell's rules: 0, the first failing rank's code (128 + signal
        for one killed by a signal), 124 on timeout, 128 + signal when the launcher was signalled.

    Raises:
        ValueError: an argument it does not take (InvalidArgument for a bad COLLS_TRANSPORT),
            before any rank starts.
    """
    if hosts is not None and not 1 <= hosts <= nprocs:
        raise ValueError(f"hosts must be between 1 and nprocs ({nprocs}), not {hosts}")
    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, not {nprocs}")
    if not argv_of_program:
        raise ValueError("nothing to run: give a script (or -m module) and its arguments")
    if timeout is not None and not timeout > 0:   # (NaN too)
        raise ValueError(f"timeout must be positive, not {timeout}")
    python, argv_of_program = interpreter_and_program(argv_of_program)
    base = _child_environment(env)
    base.setdefault("OMP_NUM_THREADS", str(threads_per_rank(nprocs)))
    # An explicit choice wins; otherwise what `env` or the user's environment says, else the default.
    transport = (transport or (env or {}).get("COLLS_TRANSPORT") or config.get("COLLS_TRANSPORT")
                 or DEFAULT_TRANSPORT)
    if transport == "mpi":
        return _launch_with_mpiexec([python, *argv_of_program], nprocs, base, timeout, hosts, prefix)
    job = secrets.token_hex(6)
    rendezvous = tempfile.mkdtemp(prefix="colls-rdv-")  # mode 0700: only we can plant files in it
    children: list[subprocess.Popen] = []
    relays: list[_LineRelay] = []
    output_lock = threading.Lock()
    # Signals are caught for the whole call, so a Ctrl-C during cleanup cannot cut it short.
    with _SignalCatcher() as catcher:
        try:
            for rank in range(nprocs):
                child_env = dict(base, **job_environment(rank, nprocs, transport, rendezvous, job))
                if hosts is not None:
                    child_env["COLLS_HOST"] = virtual_host(rank, nprocs, hosts)
                child = subprocess.Popen(
                    [python, *argv_of_program], env=child_env,
                    stdin=None if rank == 0 else subprocess.DEVNULL,  # only rank 0 may read the terminal
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True)  # its own group, so stopping a rank stops its children too
                children.append(child)
                for source, target in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
                    relays.append(_LineRelay(rank, source, target, output_lock, prefix))
                    relays[-1].start()
            status = _monitor(children, catcher, timeout)
        finally:
            for child in children:
                if child.poll() is None:  # only after an exception in the launcher itself
                    _signal_group(child, signal.SIGKILL)
                    child.wait()
            relay_deadline = time.monotonic() + 1.0  # a grandchild holding a pipe must not hang us
            for relay in relays:
                relay.join(timeout=max(0.0, relay_deadline - time.monotonic()))
            shutil.rmtree(rendezvous, ignore_errors=True)
            removed = cleanup_job_segments(job)
    if removed:
        _note(f"removed {removed} shared-memory segment(s) the ranks left in {SHM_DIR}")
    return status


def find_mpiexec() -> str | None:
    """The mpiexec of this Python's environment (the mpich wheel puts it beside python), or PATH's."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")


# Hydra (MPICH's mpiexec) SIGKILLs every rank of a host as soon as one dies by a signal: its proxy
# reaps the dead rank and, seeing WIFSIGNALED, signals all the others (hydra_pmi_proxy's main loop,
# whatever the options), and with auto-cleanup on it does so as soon as a rank's PMI socket closes.
# So under Hydra each rank runs below a one-line sh that turns its death into an exit status
# (128 + signal) and names it, with auto-cleanup off: the survivors live on to raise PeerLost
# (transports/mpi.py). The sh ignores the SIGUSR1 that Hydra then sends to every rank (MPICH
# installs its own handler for it).
# It also leaves the status of a rank that ended badly (a signal or a non-zero exit) in
# $COLLS_DEATHS/<rank>, so that the launcher can stop survivors that still hang once they have had
# time to report: in MPI_Finalize waiting for the dead rank, or in MPI_Init for one that exited
# before it got there (MPI_Init has no deadline).
RANK_GUARD = ('trap "" USR1; "$0" "$@"; status=$?; [ $status -gt 128 ] && '
              'echo "colls run: rank $PMI_RANK killed by signal SIG$(kill -l $status)" >&2; '
              '[ $status -ne 0 ] && echo $status > "$COLLS_DEATHS/$PMI_RANK"; exit $status')
DEATH_GRACE_S = 10.0   # after a rank's death, how long the survivors get to raise, report and exit
STRAGGLER_WAIT_S = 30.0   # how long killed ranks may take to go (a busy machine runs them late)


def _stop_stragglers(marker: str) -> None:
    """SIGKILL every process still running with `marker` ("COLLS_DEATHS=<dir>", unique to one job)
    in its environment, and wait until they are gone: under mpiexec the ranks and MPI's proxies
    lead sessions of their own, and once mpiexec has ended (or been killed) the proxies stop them
    in their own time, which on a busy machine may be seconds later. `colls run` returns only when
    its ranks are gone, so their MPICH segments can be removed."""
    needle, mine = marker.encode(), os.getpid()
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == mine:
            continue
        try:
            handle = os.pidfd_open(int(entry))   # the process itself, whatever pid reuse follows
        except OSError:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if needle in environ.read().split(b"\0"):
                    signal.pidfd_send_signal(handle, signal.SIGKILL)
                    killed.append(int(entry))
        except OSError:
            pass   # gone meanwhile, or not ours to read
        finally:
            os.close(handle)
    deadline = time.monotonic() + STRAGGLER_WAIT_S
    while any(process_alive(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)


def survivable_under_hydra(mpiexec: str, program: list[str]) -> tuple[list[str], list[str]]:
    """(mpiexec options, program) with which one rank's death leaves the others alive to report it."""
    if not os.path.exists(os.path.join(os.path.dirname(os.path.realpath(mpiexec)), "hydra_pmi_proxy")):
        return [], program   # not Hydra: keep its own behaviour
    return ["-disable-auto-cleanup"], ["sh", "-c", RANK_GUARD, *program]


def _launch_with_mpiexec(command_of_rank: list[str], nprocs: int, env: dict[str, str],
                         timeout: float | None, hosts: int | None = None, prefix: bool = True) -> int:
    """`colls run --transport mpi`: MPI ranks must come from MPI's own launcher, so hand over to it.
    `command_of_rank` is the Python to run and its arguments; `prefix`: as for `launch`."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        _note("--transport mpi needs mpiexec: pip install 'colls[mpi]'")
        return 2
    # each rank prefixes its own output a whole line at a time (see colls.linebuffered)
    python, *argv_of_program = command_of_rank
    relay = ["-m", "colls.linebuffered"] if prefix else []
    options, program = survivable_under_hydra(mpiexec, [python, *relay, *argv_of_program])
    command = [mpiexec, *options, "-n", str(nprocs), *program]
    if hosts is not None:
        # MPMD: one block of ranks per virtual host, each with its own COLLS_HOST
        command = [mpiexec, *options]
        for host in range(hosts):
            count = sum(virtual_host(r, nprocs, hosts) == f"vhost{host}" for r in range(nprocs))
            command += [*([":"] if host else []), "-n", str(count), "-env", "COLLS_HOST", f"vhost{host}",
                        *program]
    deaths = tempfile.mkdtemp(prefix="colls-deaths-")
    segments_before = mpich_segments()   # ranks killed in MPI_Init or aborted leave MPICH's behind
    # mpiexec leads a session of its own: a signal to us reaches it only through the catcher
    with _SignalCatcher() as catcher:
        child = subprocess.Popen(command, env=dict(env, COLLS_TRANSPORT="mpi", COLLS_DEATHS=deaths),
                                 start_new_session=True)
        try:
            status = _wait_for_mpiexec(child, timeout, deaths, catcher)
            if status is not None:
                return status
        except subprocess.TimeoutExpired:
            _note(f"timed out after {timeout:g} s; killing all ranks")
            _signal_group(child, signal.SIGKILL)
            child.wait()
            return EXIT_TIMEOUT
        finally:
            if child.poll() is None:   # only after an exception in the launcher itself
                _signal_group(child, signal.SIGKILL)
                child.wait()
            _stop_stragglers(f"COLLS_DEATHS={deaths}")
            shutil.rmtree(deaths, ignore_errors=True)
            remove_orphaned_mpich_segments(segments_before)
    if child.returncode:
        _note(f"mpiexec {describe_exit(child.returncode)}")
    return shell_exit_code(child.returncode)


def _wait_for_mpiexec(child: subprocess.Popen, timeout: float | None, deaths: str,
                      catcher: _SignalCatcher) -> int | None:
    """Wait for mpiexec; None once it exits. If a rank ends badly and the job is still running
    DEATH_GRACE_S later (a survivor stuck in MPI_Finalize on the dead rank, or in MPI_Init), stop
    every rank and return that rank's status; on a signal to us, stop them and return 128 + it.
    TimeoutExpired past `timeout`."""
    limit = None if timeout is None else time.monotonic() + timeout
    stop_at = None
    while child.poll() is None:
        now = time.monotonic()
        if catcher.received:
            signum = catcher.received[0]
            _note(f"received {signal.Signals(signum).name}; terminating all ranks")
            _stop_all([child], catcher, GRACE_SECONDS)
            return 128 + signum
        if limit is not None and now >= limit:
            raise subprocess.TimeoutExpired(child.args, timeout)
        if stop_at is None and os.listdir(deaths):
            stop_at = now + DEATH_GRACE_S
        if stop_at is not None and now >= stop_at:
            # the first to end (survivors that raised and exited leave theirs after it)
            first = min(os.listdir(deaths), key=lambda name: (os.stat(os.path.join(deaths, name)).st_mtime_ns,
                                                              int(name)))
            with open(os.path.join(deaths, first)) as handle:
                status = int(handle.read().strip() or 128 + signal.SIGKILL)
            how = describe_exit(128 - status if status > 128 else status)   # (a shell's 128 + signal)
            _note(f"rank {first} {how} and the job was still running {DEATH_GRACE_S:g} s later; "
                  f"stopping the ranks left")
            _signal_group(child, signal.SIGKILL)
            child.wait()
            return status
        time.sleep(0.05)
    return None
