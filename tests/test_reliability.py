"""Fault injection: mismatched calls, skipped calls, killed ranks, full /dev/shm, foreign segments, abort.

Every failure must surface as an error of our own type that names the ranks involved, within seconds,
and leave nothing behind in /dev/shm.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import colls
from colls.launcher import job_environment
from transports import segment
from transports.errors import TransportError

MPIEXEC = Path(sys.executable).parent / "mpiexec"
# SIGKILLs per kill test: 20 by default, to keep the suite under CI's 20 minutes (each costs a job's
# start, ~1.4 s); COLLS_KILL_RUNS=50 for the 50 the reliability issue asked for
KILL_RUNS = int(os.environ.get("COLLS_KILL_RUNS", "20"))


def _mismatch(kind: str):
    """A function for spawn in which rank 1 calls something other than the rest, by `kind`."""

    def body(comm):
        odd = comm.rank == 1
        x = np.ones(6, np.float32)
        start = time.monotonic()
        try:
            if kind == "op":
                comm.all_reduce(x, op=colls.MAX if odd else colls.SUM)
            elif kind == "count":
                comm.all_reduce(np.ones(7 if odd else 6, np.float32))
            elif kind == "dtype":
                comm.all_reduce(x.astype(np.float64) if odd else x)
            elif kind == "root":
                comm.broadcast(x, root=1 if odd else 0)
            elif kind == "collective":
                comm.broadcast(x) if odd else comm.all_reduce(x)
        except colls.CollectiveMismatch as error:
            return {"error": str(error), "seconds": time.monotonic() - start}
        return {"error": None}

    return body


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("kind", ["op", "count", "dtype", "root", "collective"])
def test_mismatch_raises_on_every_rank_naming_both_sides(kind, transport, monkeypatch):
    monkeypatch.setenv("COLLS_DEBUG", "1")
    monkeypatch.setenv("COLLS_TIMEOUT", "20")
    results = colls.spawn(_mismatch(kind), 3, transport=transport, timeout=30)
    for rank, result in enumerate(results):
        assert result["error"] is not None, f"rank {rank} did not notice the {kind} mismatch"
        assert result["seconds"] < 5
        assert f"rank {rank}:" in result["error"]
        assert "ranks [0, 2] called" in result["error"] and "ranks [1] called" in result["error"]


MPI_MISMATCH = """
import os, numpy as np, colls
comm = colls.init()
say = lambda text: os.write(1, (text + "\\n").encode())   # one write per line: ranks share stdout
odd = comm.rank == 1
x = np.ones(4, np.int32)
calls = {
    "op": lambda: comm.all_reduce(x, op=colls.MAX if odd else colls.SUM),
    "count": lambda: comm.all_reduce(np.ones(5 if odd else 4, np.int32)),
    "dtype": lambda: comm.all_reduce(x.astype(np.int64) if odd else x),
    "root": lambda: comm.broadcast(x, root=1 if odd else 0),
    "collective": lambda: comm.broadcast(x) if odd else comm.all_reduce(x),
}
for kind, call in calls.items():   # no data moved on a mismatch, so the next call starts clean
    try:
        call()
        say(f"NOERROR {kind} {comm.rank}")
    except colls.CollectiveMismatch as error:
        say(f"MISMATCH {kind} {comm.rank} {'ranks [1] called' in str(error)}")
assert comm.all_reduce(x).tolist() == [comm.size] * 4
"""


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_mismatch_under_mpiexec(tmp_path):
    if not MPIEXEC.exists():
        pytest.skip("mpiexec is not installed (pip install 'colls[mpi]')")
    script = tmp_path / "mismatch.py"
    script.write_text(MPI_MISMATCH)
    env = dict(os.environ, COLLS_DEBUG="1", COLLS_TIMEOUT="20")
    done = subprocess.run([str(MPIEXEC), "-n", "3", sys.executable, str(script)], env=env,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith(("MISMATCH", "NOERROR")))
    kinds = ("op", "count", "dtype", "root", "collective")
    assert lines == sorted(f"MISMATCH {kind} {r} True" for kind in kinds for r in range(3)), done.stdout


def _skipper(comm):
    """Rank 2 skips the all-reduce the others make; they must time out naming it."""
    if comm.rank == 2:
        time.sleep(3)
        return None
    start = time.monotonic()
    try:
        comm.all_reduce(np.ones(4), timeout=1.0)
    except colls.CollectiveTimeout as error:
        return {"seconds": time.monotonic() - start, "message": str(error), "peers": list(error.peers)}
    return None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_skipped_collective_times_out_naming_the_silent_rank(transport):
    results = colls.spawn(_skipper, 3, transport=transport, timeout=30)
    for rank in (0, 1):
        result = results[rank]
        assert result is not None, f"rank {rank} did not time out"
        assert 1.0 <= result["seconds"] < 2.0            # within the deadline + 1 s
        assert "all_reduce #0" in result["message"] and f"rank {rank}" in result["message"]
        assert 2 in result["peers"] or 1 - rank in result["peers"]  # the ring waits on a neighbour


def _tiny_deadline(comm):
    if comm.rank == 0:
        start = time.monotonic()
        try:
            comm.all_reduce(np.ones(4), timeout=0.01)
        except colls.CollectiveTimeout:
            return time.monotonic() - start
        return None
    time.sleep(1.5)
    return None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_ten_millisecond_deadline_raises_in_under_a_second(transport):
    elapsed = colls.spawn(_tiny_deadline, 2, transport=transport, timeout=20)[0]
    assert elapsed is not None and elapsed < 1.0


KILL_SCRIPT = """
import json, os, signal, sys, time
import numpy as np
import colls

victim, delay = int(sys.argv[1]), float(sys.argv[2])
memory = sys.argv[3] if len(sys.argv) > 3 else "plain"
comm = colls.init(timeout=60)
if memory == "registered":   # in place: every message goes out of a mapping of the sender's region
    x = colls.alloc(4 << 20, np.float32)
    x[:] = 1
    out = x
else:
    x, out = np.ones(4 << 20, np.float32), None      # 16 MiB: long enough to be killed inside
comm.barrier()
start = time.monotonic()
if comm.rank == victim:
    import threading
    threading.Timer(delay, os.kill, args=(os.getpid(), signal.SIGKILL)).start()
try:
    while True:
        comm.all_reduce(x, out=out)
except colls.PeerLost as error:
    killed_at = start + delay
    print(json.dumps({"rank": comm.rank, "peer": error.peer, "after": time.monotonic() - killed_at}))
"""


def _job_segments(job: str) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"colls-{job}-")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("memory", ["plain", "registered"])
def test_killed_rank_is_named_by_every_survivor_within_seconds(tmp_path, memory):
    """KILL_RUNS times: SIGKILL a random rank mid all-reduce; survivors raise PeerLost naming it
    (`registered`: the buffers from `colls.alloc`, read by the peers out of their mappings)."""
    script = tmp_path / "kill.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT))
    rng = random.Random(20261202)
    detections = []
    for run in range(KILL_RUNS):
        size = rng.choice([2, 3])
        victim, delay = rng.randrange(size), rng.uniform(0.05, 0.3)
        job = f"kill{run}x{os.getpid()}"
        rendezvous = tempfile.mkdtemp(prefix="colls-rdv-")
        environments = [dict(os.environ, **job_environment(rank, size, "shm", rendezvous, job))
                        for rank in range(size)]
        children = [subprocess.Popen([sys.executable, str(script), str(victim), str(delay), memory], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for env in environments]
        outputs = [child.communicate(timeout=60) for child in children]
        shutil.rmtree(rendezvous)
        assert children[victim].returncode == -signal.SIGKILL
        for rank, (out, err) in enumerate(outputs):
            if rank == victim:
                continue
            assert children[rank].returncode == 0, err
            report = json.loads(out.strip().splitlines()[-1])
            assert report["peer"] == victim
            assert report["after"] < 3.0, report
            detections.append(report["after"])
        assert _job_segments(job) == []                 # unlinked at setup: a SIGKILL leaks nothing
    assert len(detections) >= KILL_RUNS
    print(f"\n{KILL_RUNS} kills, detection median {np.median(detections):.2f} s, max {max(detections):.2f} s")


@pytest.mark.timeout(60)
def test_colls_run_reports_the_killed_rank_and_leaves_nothing(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT))
    done = subprocess.run([sys.executable, "-m", "colls.cli", "run", "-n", "3", str(script), "1", "0.2"],
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 128 + signal.SIGKILL
    assert "rank 1" in done.stderr and "SIGKILL" in done.stderr
    leftovers = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""
    # (no segment of the job is left: conftest checks /dev/shm after the session)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("variable", ["COLLS_SHM_MAPPED_BYTES", "COLLS_TIMEOUT", "COLLS_SHM_SLOTS",
                                      "COLLS_SHM_CHUNK_BYTES"])
def test_a_tuning_variable_set_empty_is_unset_and_a_bad_one_is_named(variable):
    """A shm variable set empty (`COLLS_SHM_SLOTS=`) used to stop `import colls` with int()'s bare message."""
    script = ("import colls; from colls.communicator import default_timeout; default_timeout(); "
              "print(colls.spawn(lambda c: int(c.all_reduce(1)), 2, transport='shm', timeout=20))")
    env = {**os.environ, variable: ""}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0 and done.stdout.strip() == "[2, 2]", done.stderr[-2000:]
    env[variable] = "lots"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=50)
    assert done.returncode != 0 and f"{variable}='lots'" in done.stderr, done.stderr[-2000:]


def test_full_dev_shm_gives_a_clear_error(monkeypatch):
    from transports.shm import ShmTransport

    monkeypatch.setattr(segment, "free_bytes", lambda directory=segment.SHM_DIR: 1000)
    with pytest.raises(TransportError, match=r"need \d+ B in /dev/shm but only 1000 B are free.*--shm-size"):
        ShmTransport(0, 1, lambda data: [data])


def test_segments_are_owner_only_and_foreign_ones_refused():
    made = segment.Segment.create(8192, job="permtest")
    try:
        info = os.stat(os.path.join(segment.SHM_DIR, made.name))
        assert info.st_mode & 0o777 == 0o600 and info.st_uid == os.getuid()
    finally:
        made.close()
    assert not os.path.exists(os.path.join(segment.SHM_DIR, made.name))
    # a segment with a looser mode (as another user's, or a planted one) is refused
    name = "colls-permtest-planted"
    path = os.path.join(segment.SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.fchmod(fd, 0o644)
        os.ftruncate(fd, 8192)
        with pytest.raises(TransportError, match="mode 644; expected owner .* mode 600"):
            segment.Segment.attach(name, 8192)
        with pytest.raises(TransportError, match="refusing segment name"):
            segment.Segment.attach("../etc/passwd", 8192)
    finally:
        os.close(fd)
        os.unlink(path)


def _aborter(comm):
    if comm.rank == 0:
        import threading

        threading.Timer(0.3, comm.abort, args=("watchdog",)).start()
        time.sleep(2)
        return None
    start = time.monotonic()
    try:
        comm.all_reduce(np.ones(8))
    except colls.CommunicatorAborted as error:
        return {"seconds": time.monotonic() - start, "message": str(error)}
    return None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_abort_releases_every_blocked_rank(transport):
    results = colls.spawn(_aborter, 3, transport=transport, timeout=20)
    for rank in (1, 2):
        assert results[rank] is not None and results[rank]["seconds"] < 1.5
        assert "rank 0" in results[rank]["message"]


def _failing_inside(comm):
    """Rank 1's reduction raises half-way through a ring all_reduce; the others are waiting on it."""
    def add_or_fail(left, right):
        if comm.rank == 1:
            raise RuntimeError("a bug in rank 1's reduction")
        return left + right

    start = time.monotonic()
    try:
        comm.all_reduce(np.ones(1 << 16), op=colls.Op(add_or_fail, commutative=True), algorithm="ring",
                        timeout=30)
    except Exception as error:   # noqa: BLE001 - the test looks at whatever each rank raised
        return {"seconds": time.monotonic() - start, "type": type(error).__name__, "message": str(error)}
    return None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_rank_failing_inside_a_collective_releases_its_peers(transport):
    """Not a 30 s hang: the failing rank aborts the communicator and every peer names it at once."""
    results = colls.spawn(_failing_inside, 3, transport=transport, timeout=40)
    assert results[1]["type"] == "RuntimeError"
    for rank in (0, 2):
        assert results[rank]["type"] == "CommunicatorAborted", results[rank]
        assert results[rank]["seconds"] < 2.0, results[rank]
        assert "rank 1 failed in world all_reduce #0" in results[rank]["message"]
        assert "RuntimeError: a bug in rank 1's reduction" in results[rank]["message"]


MPI_FAILING_INSIDE = """
import json, sys
sys.path.insert(0, {tests!r})
import colls
from test_reliability import _failing_inside
comm = colls.init()
with open(f"{out}/rank{{comm.rank}}.json", "w") as handle:   # ranks' stdout lines may interleave
    json.dump({{"rank": comm.rank, **_failing_inside(comm)}}, handle)
"""


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_rank_failing_inside_a_collective_releases_its_peers_under_mpiexec(tmp_path):
    if not MPIEXEC.exists():
        pytest.skip("mpiexec is not installed (pip install 'colls[mpi]')")
    script = tmp_path / "failing.py"
    script.write_text(MPI_FAILING_INSIDE.format(tests=str(Path(__file__).parent), out=str(tmp_path)))
    done = subprocess.run([str(MPIEXEC), "-n", "3", sys.executable, str(script)],
                          env=dict(os.environ, COLLS_TRANSPORT="mpi"), capture_output=True, text=True,
                          timeout=50)
    results = {r["rank"]: r for r in (json.loads(path.read_text()) for path in tmp_path.glob("rank*.json"))}
    assert sorted(results) == [0, 1, 2], done.stdout + done.stderr[-2000:]
    assert results[1]["type"] == "RuntimeError"
    for rank in (0, 2):
        assert results[rank]["type"] == "CommunicatorAborted", results[rank]
        assert results[rank]["seconds"] < 2.0, results[rank]
        assert "RuntimeError: a bug in rank 1's reduction" in results[rank]["message"]


MPI_KILL_SCRIPT = """
import json, os, signal, sys, threading, time
import numpy as np
import colls

victim, delay, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
comm = colls.init(timeout=60)
with open("/proc/self/maps") as maps:   # MPICH's segments of this job, to look for them afterwards
    segments = sorted({line.split()[5] for line in maps if "/dev/shm/" in line and len(line.split()) > 5})
with open(f"{out}/start{comm.rank}.json", "w") as handle:
    json.dump({"pid": os.getpid(), "segments": segments}, handle)
x = np.ones(4 << 20, np.float32)                     # 16 MiB: long enough to be killed inside
comm.barrier()
killed_at = time.monotonic() + delay
if comm.rank == victim:
    threading.Timer(delay, os.kill, args=(os.getpid(), signal.SIGKILL)).start()
try:
    while True:
        comm.all_reduce(x)
except colls.PeerLost as error:
    with open(f"{out}/rank{comm.rank}.json", "w") as handle:   # ranks' stdout lines may interleave
        json.dump({"peer": error.peer, "after": time.monotonic() - killed_at, "message": str(error)}, handle)
    raise
"""


def _kill_under_mpi(command: list[str], script: Path, out: Path, size: int):
    """Run one job of MPI_KILL_SCRIPT; return it and each survivor's report, after checking that no
    process of it and no /dev/shm segment it mapped is left."""
    done = subprocess.run(command, env=dict(os.environ, COLLS_TRANSPORT="mpi"), capture_output=True,
                          text=True, timeout=40)
    leftovers = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout
    assert len(list(out.glob("start*.json"))) == size, done.stdout + done.stderr[-2000:]
    starts = [json.loads((out / f"start{rank}.json").read_text()) for rank in range(size)]
    segments = {name for start in starts for name in start["segments"]}
    assert not [name for name in segments if os.path.exists(name)], segments   # SIGKILL leaks nothing
    reports = {int(path.stem[4:]): json.loads(path.read_text()) for path in out.glob("rank*.json")}
    return done, reports


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_killed_rank_is_named_by_every_survivor_under_colls_run_mpi(tmp_path):
    """KILL_RUNS times under `colls run --transport mpi` (Hydra,
    with the rank guard and -disable-auto-cleanup): SIGKILL a random rank mid all-reduce; every
    survivor raises PeerLost naming it within 3 s, the job exits 128 + SIGKILL naming it, nothing
    is left behind."""
    if not MPIEXEC.exists():
        pytest.skip("mpiexec is not installed (pip install 'colls[mpi]')")
    script = tmp_path / "kill.py"
    script.write_text(MPI_KILL_SCRIPT)
    rng = random.Random(20261203)
    detections = []
    runs = KILL_RUNS
    for run in range(runs):
        size = rng.choice([2, 3, 4])
        victim, delay = rng.randrange(size), rng.uniform(0.05, 0.3)
        out = tmp_path / f"run{run}"
        out.mkdir()
        command = [sys.executable, "-m", "colls.cli", "run", "--transport", "mpi", "-n", str(size),
                   str(script), str(victim), f"{delay:.3f}", str(out)]
        done, reports = _kill_under_mpi(command, script, out, size)
        assert done.returncode == 128 + signal.SIGKILL, done.stderr[-2000:]
        assert f"rank {victim} killed by signal SIGKILL" in done.stderr, done.stderr[-2000:]
        survivors = sorted(set(range(size)) - {victim})
        assert sorted(reports) == survivors, (run, size, victim, done.stderr[-2000:])
        for rank in survivors:
            assert reports[rank]["peer"] == victim, reports[rank]
            assert f"rank {victim} (pid " in reports[rank]["message"], reports[rank]
            assert reports[rank]["after"] < 3.0, reports[rank]
            detections.append(reports[rank]["after"])
    print(f"\n{runs} kills under colls run --transport mpi, detection median {np.median(detections):.2f} s, "
          f"max {max(detections):.2f} s")


HANGING_SURVIVOR = """
import os, signal, time
import numpy as np, colls
comm = colls.init()
if comm.rank == 1:
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    while True:
        comm.all_reduce(np.ones(1 << 20, np.float32))
except colls.PeerLost:
    print(f"rank {comm.rank} raised PeerLost", flush=True)
    if comm.rank == 0:
        time.sleep(1000)   # a survivor that never exits (as one stuck in MPI_Finalize would)
"""


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_colls_run_mpi_stops_a_survivor_that_hangs_after_a_death(tmp_path):
    """Once a rank has died, survivors get DEATH_GRACE_S to report and exit; then colls run stops
    the rest and exits with the dead rank's status, leaving no process."""
    from colls.launcher import DEATH_GRACE_S

    if not MPIEXEC.exists():
        pytest.skip("mpiexec is not installed (pip install 'colls[mpi]')")
    script = tmp_path / "hang.py"
    script.write_text(HANGING_SURVIVOR)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "colls.cli", "run", "--transport", "mpi", "-n", "3",
                           str(script)], capture_output=True, text=True, timeout=80)
    elapsed = time.monotonic() - start
    assert done.returncode == 128 + signal.SIGKILL, done.stderr[-2000:]
    assert "rank 1 killed by signal SIGKILL" in done.stderr and "stopping the ranks left" in done.stderr
    assert done.stdout.count("raised PeerLost") == 2, done.stdout
    assert DEATH_GRACE_S <= elapsed < DEATH_GRACE_S + 30, elapsed
    leftovers = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_killed_rank_under_plain_mpiexec_ends_the_job_and_leaves_nothing(tmp_path):
    """Plain `mpiexec -n 3 python script.py`: Hydra's proxy SIGKILLs the survivors as soon as it reaps
    a rank killed by a signal (they rarely get to raise PeerLost), but the job still exits non-zero
    and leaves no process and none of MPICH's /dev/shm segments (each rank unlinks them at init)."""
    if not MPIEXEC.exists():
        pytest.skip("mpiexec is not installed (pip install 'colls[mpi]')")
    script = tmp_path / "kill.py"
    script.write_text(MPI_KILL_SCRIPT)
    command = [str(MPIEXEC), "-n", "3", sys.executable, str(script), "1", "0.2", str(tmp_path)]
    done, reports = _kill_under_mpi(command, script, tmp_path, 3)
    assert done.returncode != 0
    assert all(report["peer"] == 1 for report in reports.values()), reports


def _closed_under_async_work(comm) -> list:
    """Rank 0 starts an asynchronous all_reduce whose own timeout (30 s) outlasts the communicator's
    (2 s), then closes the communicator while rank 1 stays away: the close aborts that work (which
    raises CommunicatorAborted on `wait`) instead of closing the transport under it."""
    if comm.rank == 1:
        time.sleep(4)
        return []
    work = comm.all_reduce(np.ones(1 << 18), async_op=True, timeout=30)
    began = time.monotonic()
    comm.close()
    closed_after = time.monotonic() - began
    with pytest.raises(colls.CommunicatorAborted, match="closed world with asynchronous work"):
        work.wait()
    return [closed_after]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_closing_with_asynchronous_work_running_aborts_it(transport):
    """Found by review: `close` went on to close the transport when asynchronous work
    outlasted its wait, and that work then failed with whatever the closed transport raised (a
    TypeError from a released FIFO here)."""
    (closed_after,), _ = colls.spawn(_closed_under_async_work, 2, transport=transport, timeout=2)
    assert 1.5 < closed_after < 4.0
