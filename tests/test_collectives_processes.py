"""The matrix on real processes: `shm` through `colls.spawn` (forked ranks, POSIX shared memory),
`mpi` under a real `mpiexec` (tests/matrix_worker.py, also checked against mpi4py's own
collectives), and `shm` bootstrapped by mpiexec. On 2 cores the 5- and 8-rank jobs keep their
2**20-element work to float32 all_reduce and reduce_scatter.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import reference

import colls

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKER = REPO_ROOT / "tests" / "matrix_worker.py"
SIZES = (1, 2, 3, 4, 5, 8)
SMALL_BIG = ("--big-dtypes", "float32", "--big-collectives", "all_reduce,reduce_scatter")
MIN_CHECKS_PER_RANK = 2900


def find_mpiexec() -> str | None:
    """mpiexec beside this Python (pip's mpich), else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


def need_mpi() -> str:
    """The mpiexec to use, or skip: the mpi tests need mpi4py and mpiexec."""
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install 'colls[mpi]')")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec beside sys.executable or on PATH (pip install mpich)")
    return mpiexec


def child_env(**extra: str) -> dict[str, str]:
    """Our environment, the repo importable, no inherited COLLS_* choices, a short call timeout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["COLLS_TIMEOUT"] = "60"
    env["COLLS_JOB"] = "test" + secrets.token_hex(4)   # segments are named colls-<job>-...
    env.update(extra)
    return env


def mpiexec_run(mpiexec: str, size: int, args: list[str], timeout: float, **env: str):
    """Run `mpiexec -n size python args...`, output captured."""
    return subprocess.run([mpiexec, "-n", str(size), sys.executable, *args], cwd=REPO_ROOT,
                          env=child_env(**env), capture_output=True, text=True, timeout=timeout)


def parse_matrix(done: subprocess.CompletedProcess) -> dict[str, object]:
    """The worker's `MATRIX {json}` line, or a failure showing what the job printed."""
    lines = [line for line in done.stdout.splitlines() if line.startswith("MATRIX ")]
    assert lines, f"no MATRIX line (exit {done.returncode})\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1][len("MATRIX "):])


def assert_clean(report: dict[str, object], size: int, transport: str, mpi_reference: bool) -> None:
    assert report["transport"] == transport and report["size"] == size
    assert not report["failures"], "\n".join(report["failures"][:20])
    assert report["checks"] >= MIN_CHECKS_PER_RANK * size
    if mpi_reference:
        assert report["mpi_checks"] >= 300 * size


# -- shm through colls.spawn -----------------------------------------------------------------------

def _shm_matrix(comm, small_big: bool) -> dict[str, object]:
    if small_big:
        return reference.run_matrix(comm, 1, big_dtypes=("float32",),
                                    big_collectives=("all_reduce", "reduce_scatter"))
    return reference.run_matrix(comm, 1)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("size", SIZES)
def test_shm_matrix(size: int) -> None:
    """Forked ranks over POSIX shared memory: the whole matrix, exactly, on every rank."""
    summaries = colls.spawn(_shm_matrix, size, transport="shm", timeout=60.0, args=(size >= 5,))
    failures = [f for s in summaries for f in s["failures"]]
    assert not failures, "\n".join(failures[:20])
    assert min(s["checks"] for s in summaries) >= MIN_CHECKS_PER_RANK


# -- mpiexec ---------------------------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.timeout(200)
@pytest.mark.parametrize("size", SIZES)
def test_mpi_matrix(size: int) -> None:
    """`mpiexec -n N python tests/matrix_worker.py`: the matrix plus the mpi4py comparison."""
    mpiexec = need_mpi()
    args = [str(WORKER), *(SMALL_BIG if size >= 5 else ())]
    done = mpiexec_run(mpiexec, size, args, timeout=180)
    report = parse_matrix(done)
    assert_clean(report, size, "mpi", mpi_reference=True)
    assert done.returncode == 0, done.stderr[-4000:]


UNCLOSED_GROUPS = """
import atexit, numpy as np
# registered first, so it runs last: after colls has closed what the program left open
atexit.register(lambda: print(f"rank {comm.rank} groups left open: "
                              f"{[i for i, g in enumerate((comm, pair, alone)) if not g.transport.closed]}",
                              flush=True))
import colls
comm = colls.init()
pair = comm.split(0)
alone = comm.split(comm.rank)
total = pair.all_reduce(np.full(4, comm.rank + 1, np.int64))
print(f"rank {comm.rank} sum {total[0]} {alone.all_reduce(np.ones(2))[0]:.0f}", flush=True)
"""


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_groups_a_program_never_closes_are_closed_before_mpi_finalizes(tmp_path: Path) -> None:
    """Sub-groups left open (as torch programs leave theirs) are closed at exit, before mpi4py
    finalizes MPI: each keeps two notice receives posted, which UCX otherwise reports at
    MPI_Finalize ("was not returned to mpool"), one warning per receive per rank."""
    mpiexec = need_mpi()
    script = tmp_path / "unclosed.py"
    script.write_text(UNCLOSED_GROUPS)
    done = mpiexec_run(mpiexec, 2, [str(script)], timeout=50)
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in range(2):
        assert f"rank {rank} sum 3 1" in done.stdout, done.stdout
        assert f"rank {rank} groups left open: []" in done.stdout, done.stdout
    output = done.stdout + done.stderr   # UCX writes its warnings to stdout
    assert "not returned to mpool" not in output, output[-4000:]


@pytest.mark.mpi
@pytest.mark.timeout(200)
@pytest.mark.parametrize("size", (2, 5))
def test_mpiexec_with_shm_transport(size: int) -> None:
    """COLLS_TRANSPORT=shm under mpiexec: MPI only swaps segment names, shared memory moves bytes."""
    mpiexec = need_mpi()
    done = mpiexec_run(mpiexec, size, [str(WORKER), *SMALL_BIG], timeout=180, COLLS_TRANSPORT="shm")
    report = parse_matrix(done)
    assert_clean(report, size, "shm", mpi_reference=True)
    assert done.returncode == 0, done.stderr[-4000:]


# -- the other ways of starting a job ---------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ("local", "shm", "mpi"))
def test_plain_python_is_a_group_of_one(transport: str) -> None:
    """`COLLS_TRANSPORT=... python tests/matrix_worker.py` with no launcher: colls.init() gives a
    world of one rank over that transport, and the whole matrix holds on it."""
    if transport == "mpi":
        pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    done = subprocess.run([sys.executable, str(WORKER)], cwd=REPO_ROOT, capture_output=True, text=True,
                          env=child_env(COLLS_TRANSPORT=transport), timeout=100)
    assert_clean(parse_matrix(done), 1, transport, mpi_reference=False)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("transport", ("shm", pytest.param("mpi", marks=pytest.mark.mpi)))
def test_colls_run_launcher(transport: str) -> None:
    """`colls run -n 3 [--transport mpi] tests/matrix_worker.py`: the launcher's [rank]-prefixed lines."""
    if transport == "mpi":
        need_mpi()
    done = subprocess.run([sys.executable, "-m", "colls.cli", "run", "-n", "3", "--transport", transport,
                           "--timeout", "120", str(WORKER), *SMALL_BIG], cwd=REPO_ROOT, capture_output=True,
                          text=True, env=child_env(), timeout=140)
    lines = [line for line in done.stdout.splitlines() if line.startswith("[0] MATRIX ")]
    assert lines, f"no MATRIX line (exit {done.returncode})\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    # raw_decode: under --transport mpi a stray "[0] " can follow the JSON (see the test below)
    report, _ = json.JSONDecoder().raw_decode(lines[-1][len("[0] MATRIX "):])
    assert_clean(report, 3, transport, mpi_reference=transport == "mpi")
    assert done.returncode == 0, done.stderr[-4000:]


LINES_SCRIPT = """
    import sys, time
    sys.stdout.write("first half, ")
    sys.stdout.flush()
    time.sleep(0.3)
    sys.stdout.write("second half\\n")
    sys.stdout.flush()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", (
    "shm",
    pytest.param("mpi", marks=[pytest.mark.mpi])))
def test_colls_run_prefixes_whole_lines(transport: str, tmp_path: Path) -> None:
    """A line a rank writes in two pieces comes out whole, once, behind its rank prefix."""
    if transport == "mpi":
        need_mpi()
    script = tmp_path / "halves.py"
    script.write_text(textwrap.dedent(LINES_SCRIPT))
    done = subprocess.run([sys.executable, "-m", "colls.cli", "run", "-n", "2", "--transport", transport,
                           str(script)], cwd=REPO_ROOT, capture_output=True, text=True, env=child_env(),
                          timeout=45)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(done.stdout.splitlines()) == ["[0] first half, second half", "[1] first half, second half"]


# -- point to point on real processes (each once a bug) ------------------------------------------------

P2P_SCRIPT = """
    import sys
    import numpy as np
    import colls

    comm = colls.init()
    what = sys.argv[1]
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    if what == "isend_ring":
        mine = np.full(1 << 20, float(comm.rank))          # 8 MiB: beyond any eager buffering
        got = np.empty_like(mine)
        work = comm.send(mine, right, tag=3, async_op=True)
        comm.recv(got, left, tag=3)
        work.wait()
        assert (got == left).all()
    elif what == "subset_then_collective":
        if comm.rank == 0:
            comm.send(np.ones(3), 1, tag=7)
        elif comm.rank == 1:
            comm.recv(np.empty(3), 0, tag=7)
        assert comm.all_reduce(np.ones(2)).tolist() == [comm.size] * 2
    elif what == "max_tag":
        tag = comm.transport.user_tag_limit - 1            # the largest tag this transport documents
        if comm.rank == 0:
            comm.send(np.ones(3), 1, tag=tag)
        else:
            got = np.empty(3)
            comm.recv(got, 0, tag=tag)
            assert (got == 1).all()
        # one past it is refused on each rank by validation, before any byte moves
        try:
            comm.send(np.ones(3), 1 - comm.rank, tag=tag + 1)
        except colls.InvalidArgument as error:
            assert f"rank {comm.rank}" in str(error) and "tag" in str(error)
        else:
            raise AssertionError("a tag past the transport's range was accepted")
    print("P2P OK", comm.rank, flush=True)
"""


@pytest.fixture(scope="module")
def p2p_script(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("p2p") / "p2p.py"
    path.write_text(textwrap.dedent(P2P_SCRIPT))
    return str(path)


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_isend_ring_large_mpi(p2p_script: str) -> None:
    """isend right, recv left, wait: MPI's standard ring, with 8 MiB messages."""
    done = mpiexec_run(need_mpi(), 3, [p2p_script, "isend_ring"], timeout=45, COLLS_TIMEOUT="5")
    assert done.returncode == 0, done.stderr[-2000:]


def _isend_ring_large(comm) -> bool:
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    mine = np.full(1 << 20, float(comm.rank))
    got = np.empty_like(mine)
    work = comm.send(mine, right, tag=3, async_op=True)
    comm.recv(got, left, tag=3)
    work.wait()
    return bool((got == left).all())


@pytest.mark.timeout(60)
def test_isend_ring_large_shm() -> None:
    """isend right, recv left, wait, with messages larger than the shared-memory FIFO."""
    assert all(colls.spawn(_isend_ring_large, 3, transport="shm", timeout=5.0))


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_point_to_point_among_some_ranks_then_collective_mpi(p2p_script: str) -> None:
    """Ranks 0 and 1 exchange a message, then all three all-reduce."""
    done = mpiexec_run(need_mpi(), 3, [p2p_script, "subset_then_collective"], timeout=45,
                       COLLS_TIMEOUT="5")
    assert done.returncode == 0, done.stderr[-2000:]


def _subset_then_collective(comm) -> list[float]:
    if comm.rank == 0:
        comm.send(np.ones(3), 1, tag=7)
    elif comm.rank == 1:
        comm.recv(np.empty(3), 0, tag=7)
    return comm.all_reduce(np.ones(2)).tolist()


@pytest.mark.timeout(60)
def test_point_to_point_among_some_ranks_then_collective_shm() -> None:
    """Ranks 0 and 1 exchange a message, then all three all-reduce."""
    assert colls.spawn(_subset_then_collective, 3, transport="shm", timeout=5.0) == [[3.0, 3.0]] * 3


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_largest_documented_tag_mpi(p2p_script: str) -> None:
    """The largest tag the transport documents works; one more is an InvalidArgument on the rank."""
    done = mpiexec_run(need_mpi(), 2, [p2p_script, "max_tag"], timeout=45, COLLS_TIMEOUT="5")
    assert done.returncode == 0, done.stderr[-2000:]
