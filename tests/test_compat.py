"""The mpi4py facade (`colls.compat`): namespace, buffer specs, datatypes, ops, refusals, the runner.

Collectives run on real ranks: threads through `colls.compat.spawn` (MPI.COMM_WORLD bound per
rank), processes through `colls run --as-mpi4py` and `mpiexec python -m colls.compat.run`.
"""

from __future__ import annotations

import array
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from colls.compat import MPI, spawn
from colls.compat import buffers as compat_buffers

REPO_ROOT = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, COLLS_TIMEOUT="60",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("COLLS_TRANSPORT", None)
    env.update(extra)
    return env


# -- namespace ---------------------------------------------------------------------------------------

def test_environment_queries() -> None:
    assert MPI.get_vendor()[0] == "colls"
    assert MPI.Get_version() == (4, 1)
    assert MPI.Query_thread() in (MPI.THREAD_SINGLE, MPI.THREAD_FUNNELED, MPI.THREAD_SERIALIZED,
                                  MPI.THREAD_MULTIPLE)
    assert isinstance(MPI.Get_processor_name(), str) and MPI.Get_processor_name()
    assert MPI.Wtime() < MPI.Wtime() + 1e-9 and MPI.Wtick() > 0
    assert MPI.IN_PLACE != MPI.BOTTOM
    assert "colls" in MPI.Get_library_version()


@pytest.mark.parametrize(("name", "dtype"), [
    ("INT", np.intc), ("DOUBLE", np.double), ("FLOAT", np.single), ("C_BOOL", np.bool_), ("BYTE", np.uint8),
    ("INT64_T", np.int64), ("UNSIGNED", np.uintc), ("UNSIGNED_LONG_LONG", np.ulonglong),
    ("C_DOUBLE_COMPLEX", np.cdouble), ("C_FLOAT_COMPLEX", np.csingle), ("LONG_DOUBLE", np.longdouble),
    ("SHORT", np.short), ("SIGNED_CHAR", np.byte), ("UINT16_T", np.uint16)])
def test_datatypes_map_to_numpy(name: str, dtype: type) -> None:
    datatype = getattr(MPI, name)
    assert datatype.dtype == np.dtype(dtype)
    assert datatype.Get_size() == datatype.extent == np.dtype(dtype).itemsize
    assert datatype.Get_extent() == (0, np.dtype(dtype).itemsize)


def test_pair_datatypes_have_c_layout() -> None:
    assert MPI.DOUBLE_INT.Get_size() == 16 and MPI.TWOINT.Get_size() == 8 and MPI.FLOAT_INT.Get_size() == 8


# -- buffer specifications ---------------------------------------------------------------------------

def test_buffer_forms() -> None:
    x = np.arange(10, dtype="i")
    whole = compat_buffers.simple(x, writable=True)
    assert whole.datatype is MPI.INT and whole.count == 10
    assert compat_buffers.simple([x, MPI.INT], True).count == 10
    assert compat_buffers.simple([x, 4, MPI.INT], True).typed().tolist() == [0, 1, 2, 3]
    assert compat_buffers.simple([x, (3, 2), MPI.INT], True).typed().tolist() == [2, 3, 4]
    assert compat_buffers.simple([x, "i"], True).datatype is MPI.INT
    assert compat_buffers.simple(x, True, blocks=5).count == 2
    typed = compat_buffers.simple(array.array("d", [1.0, 2.0]), True)
    assert typed.datatype is MPI.DOUBLE and typed.typed().tolist() == [1.0, 2.0]
    spec = compat_buffers.vector([x, ([1, 2], [5, 0]), MPI.INT], True, blocks=2)
    assert spec.block(0).view("i").tolist() == [5] and spec.block(1).view("i").tolist() == [0, 1]
    inferred = compat_buffers.vector(np.arange(5, dtype="d"), True, blocks=2)
    assert inferred.counts == (3, 2) and inferred.displs == (0, 3)


def test_buffer_errors() -> None:
    x = np.arange(10, dtype="i")
    with pytest.raises(ValueError, match="need 44 bytes"):
        compat_buffers.simple([x, 11, MPI.INT], True)
    with pytest.raises(ValueError, match="not a multiple"):
        compat_buffers.simple(x, True, blocks=3)
    with pytest.raises(BufferError, match="read-only"):
        compat_buffers.simple(b"abcd", writable=True)
    with pytest.raises(BufferError, match="not contiguous"):
        compat_buffers.simple(x[::2], True)
    fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3))   # contiguous in Fortran's order
    assert compat_buffers.simple(fortran, True).data().view("d").tolist() == fortran.ravel("F").tolist()
    with pytest.raises(ValueError, match="2 to 4 items"):
        compat_buffers.simple([x], True)
    with pytest.raises(KeyError, match="cannot map"):
        compat_buffers.simple([x, "?!"], True)


def test_reduce_local_and_op_create() -> None:
    inout = np.arange(4.0)
    MPI.SUM.Reduce_local(np.ones(4), inout)
    assert inout.tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError):
        MPI.SUM.Reduce_local([np.ones(4, "i"), MPI.INT], [np.ones(4, "h"), MPI.SHORT])

    def minus(inbuf, inoutbuf, datatype):   # inoutbuf = inbuf - inoutbuf: order matters
        np.frombuffer(inoutbuf, datatype.dtype)[...] = (np.frombuffer(inbuf, datatype.dtype)
                                                         - np.frombuffer(inoutbuf, datatype.dtype))

    op = MPI.Op.Create(minus, commute=False)
    assert not op.Is_commutative() and not op.is_predefined
    target = np.full(3, 2.0)
    op.Reduce_local(np.full(3, 10.0), target)
    assert target.tolist() == [8.0, 8.0, 8.0]
    op.Free()   # (a process may hold 32 user operations at once, as in mpi4py)
    assert MPI.MAX(np.array([1, 5]), np.array([3, 2])).tolist() == [3, 5]


@pytest.mark.parametrize(("call", "feature"), [
    (lambda: MPI.Win.Create(np.zeros(1)), "one-sided"),
    (lambda: MPI.File.Open(MPI.COMM_SELF, "x"), "MPI I/O"),
    (lambda: MPI.Intercomm.Create_from_groups(MPI.GROUP_EMPTY, 0, MPI.GROUP_EMPTY, 0),
     "inter-communicators"),
    (lambda: MPI.COMM_SELF.Spawn("python", maxprocs=1), "dynamic processes"),
])
def test_unsupported_features_name_themselves(call, feature: str) -> None:
    with pytest.raises(NotImplementedError, match=feature):
        call()


# -- collectives on thread ranks ---------------------------------------------------------------------

def mixed_program():
    """A little of everything, checked against numpy on each rank."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    total = np.empty(3, "i")
    comm.Allreduce(np.full(3, rank + 1, "i"), total, op=MPI.SUM)
    assert total.tolist() == [size * (size + 1) // 2] * 3
    prefix = np.empty(2)
    comm.Scan(np.full(2, float(rank + 1)), prefix)
    assert prefix.tolist() == [(rank + 1) * (rank + 2) / 2] * 2
    counts = [r + 1 for r in range(size)]
    gathered = np.zeros(sum(counts), "i")
    comm.Allgatherv(np.full(rank + 1, rank, "i"), [gathered, counts, MPI.INT])
    assert gathered.tolist() == [r for r in range(size) for _ in range(r + 1)]
    request = comm.Iallreduce(MPI.IN_PLACE, total, op=MPI.MAX)
    request.Wait()
    assert not request and total.tolist() == [size * (size + 1) // 2] * 3
    sub = comm.Split(rank % 2, rank)
    assert sub.Get_size() == len(range(rank % 2, size, 2))
    sub.Free()
    assert sub == MPI.COMM_NULL
    if size > 1:
        incoming = np.empty(2, "d")
        MPI.Request.Waitall([comm.Irecv(incoming, (rank - 1) % size, 4),
                             comm.Isend(np.full(2, float(rank)), (rank + 1) % size, 4)])
        assert incoming.tolist() == [float((rank - 1) % size)] * 2
    self_copy = np.empty(1, "i")
    MPI.COMM_SELF.Allreduce(np.array([rank], "i"), self_copy)
    assert self_copy.tolist() == [rank]
    return rank


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_threads_bind_comm_world_per_rank(size: int) -> None:
    assert spawn(mixed_program, size, transport="local", timeout=60) == list(range(size))


def test_shm_processes_via_spawn() -> None:
    assert spawn(mixed_program, 3, transport="shm", timeout=60) == [0, 1, 2]


def test_free_of_world_is_refused() -> None:
    def free_world():
        with pytest.raises(MPI.Exception):
            MPI.COMM_WORLD.Free()
        return True

    assert spawn(free_world, 1, transport="local") == [True]


# -- running unmodified mpi4py scripts ---------------------------------------------------------------

SCRIPT = """
    import sys
    import numpy as np
    from mpi4py import MPI
    import mpi4py

    comm = MPI.COMM_WORLD
    halves = comm.Split(comm.Get_rank() % 2)
    got = np.empty(2)
    halves.Allreduce(np.full(2, 1.0), got)
    line = (f"vendor {MPI.get_vendor()[0]} size {comm.Get_size()} half {int(got[0])} args {sys.argv[1:]} "
            f"module {mpi4py.MPI.__name__}")
    print(line, flush=True)   # one write, so lines of ranks sharing mpiexec's pipe do not interleave
"""


def test_colls_run_as_mpi4py(tmp_path: Path) -> None:
    script = tmp_path / "unmodified.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run([sys.executable, "-m", "colls.cli", "run", "--as-mpi4py", "-n", "3", str(script),
                           "--flag", "x"], env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if "vendor" in line)
    assert len(lines) == 3
    assert not any(line.startswith("[") for line in lines), "printed as mpiexec does: no [rank] prefix"
    assert all("vendor colls size 3" in line and "['--flag', 'x']" in line and "colls.compat.MPI" in line
               for line in lines)
    assert sum("half 2" in line for line in lines) == 2 and sum("half 1" in line for line in lines) == 1


@pytest.mark.mpi
@pytest.mark.parametrize("transport", ["shm", "mpi"])
def test_mpiexec_runner(tmp_path: Path, transport: str) -> None:
    pytest.importorskip("mpi4py")
    launcher = Path(sys.executable).parent / "mpiexec"
    if not launcher.exists():
        pytest.skip("no mpiexec beside this Python (pip install mpich)")
    script = tmp_path / "unmodified.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run([str(launcher), "-n", "2", sys.executable, "-m", "colls.compat.run", str(script)],
                          env=child_env(COLLS_TRANSPORT=transport), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("vendor colls size 2 half 1") == 2, done.stdout


def _own_block_mismatch(collective: str):
    """Rank 1 gives a block to itself that does not fit its own receive; the others are right."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    send = np.arange(2 * size, dtype="i") + 100 * rank
    recv = np.full(2 * size, -1, "i")
    counts = [2] * size
    bad = [2] * size
    bad[1] = 1
    try:
        if collective == "Alltoallv":
            comm.Alltoallv([send, counts, MPI.INT], [recv, bad if rank == 1 else counts, MPI.INT])
        elif collective == "Gatherv":   # the root's 2 elements, with room for 1 of its own
            comm.Gatherv(send[:2], [recv, bad, MPI.INT] if rank == 1 else None, root=1)
        else:                           # the root's block of 2, into its receive of 1
            comm.Scatterv([send, counts, MPI.INT] if rank == 1 else None, recv[:1 if rank == 1 else 2],
                          root=1)
        outcome = "ok"
    except Exception as error:   # noqa: BLE001 - the test reads its type
        outcome = type(error).__name__
    return outcome, recv.tolist()


@pytest.mark.parametrize("collective", ["Alltoallv", "Gatherv", "Scatterv"])
def test_a_rank_whose_own_block_does_not_fit_raises_before_anything_moves(collective):
    """Found by review: the rank's own block was checked after its sends and receives
    were posted, so the others got its blocks and returned as if the call had worked."""
    results = spawn(lambda: _own_block_mismatch(collective), 3, timeout=2)
    assert results[1] == ("ValueError", [-1] * 6)          # refused, and nothing landed
    for outcome, recv in (results[0], results[2]):
        # rank 1 never took part (a Gatherv's small sends end once they leave: no wait on it)
        assert outcome == ("ok" if collective == "Gatherv" else "CollectiveTimeout")
        assert recv[2:4] == [-1, -1]                        # and it sent them nothing


def _bad_send_spec_then_sendrecv() -> list[float]:
    """A Sendrecv whose send buffer is bad raises before its receive is posted: the next Sendrecv
    gets its own message (a stale receive would take it and leave this one waiting)."""
    comm = MPI.COMM_WORLD
    with pytest.raises(ValueError, match="need 40 bytes"):
        comm.Sendrecv([np.zeros(3), 5, MPI.DOUBLE], 0, 1, np.zeros(3), 0, 1)
    got = np.zeros(3)
    comm.Sendrecv(np.arange(3.0), 0, 1, got, 0, 1)
    return got.tolist()


def test_a_bad_send_buffer_in_sendrecv_posts_nothing() -> None:
    assert spawn(_bad_send_spec_then_sendrecv, 1, transport="local", timeout=20) == [[0.0, 1.0, 2.0]]
