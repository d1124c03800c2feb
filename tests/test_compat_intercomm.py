"""Inter-communicators through the mpi4py facade (`Intracomm.Create_intercomm`, `MPI.Intercomm`).

`program` splits the world into a low and a high half, joins them by an inter-communicator and runs
what scripts do with one: point-to-point to remote ranks (statuses and probes name remote ranks),
barriers, the rooted object collectives with MPI.ROOT / MPI.PROC_NULL, allgather, alltoall,
reductions, Merge, Dup, Split, Free, Create_from_groups; `buffer_program` the blocking buffer
collectives (Bcast, Gather, Scatter, Allgather with blocks of another size each way, Alltoall,
Allreduce). Both check
each result against values computed from world ranks, and return them; under `mpiexec` each rank
also runs them with the real mpi4py (MPICH) and compares (shm and mpi transports). Thread ranks run
them too, and the errors: groups that share processes, groups that are not all of peer_comm's
processes (NotImplementedError, as documented), Reduce and the I... forms (NotImplementedError
naming inter-communicators), ranks outside the remote group.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def program(MPI, world) -> list[tuple]:   # noqa: N803 - the MPI module under test
    """Everyday inter-communicator use; every result is checked, and returned for comparison."""
    rank, size = world.Get_rank(), world.Get_size()
    half = size // 2
    color = 0 if rank < half else 1
    mine = list(range(half)) if color == 0 else list(range(half, size))
    theirs = list(range(half, size)) if color == 0 else list(range(half))
    local = world.Split(color, key=rank)
    inter = MPI.Intracomm.Create_intercomm(local, 0, world, half if color == 0 else 0, tag=7)
    lr, ls, rs = inter.Get_rank(), inter.Get_size(), inter.Get_remote_size()
    assert (type(inter).__name__, inter.Is_inter(), inter.is_intra) == ("Intercomm", True, False)
    assert (lr, ls, rs) == (mine.index(rank), len(mine), len(theirs))
    assert inter.Get_group().Get_size() == ls and inter.Get_remote_group().Get_size() == rs
    assert MPI.Comm.fromint(inter.toint()) == inter
    out: list[tuple] = [("sizes", lr, ls, rs)]
    if lr < rs:   # rank i of each group with rank i of the other
        partner = theirs[lr]
        got, status = np.zeros(5, "i"), MPI.Status()
        inter.Sendrecv(np.full(3, rank, "i"), lr, 11, got, MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        assert got.tolist() == [partner] * 3 + [0, 0]
        assert (status.Get_source(), status.Get_tag(), status.Get_count(MPI.INT)) == (lr, 11, 3)
        request = inter.isend({"from": rank, "a": np.arange(4)}, lr, 12)
        probed = MPI.Status()
        inter.Probe(MPI.ANY_SOURCE, 12, probed)
        obj = inter.recv(None, MPI.ANY_SOURCE, 12)
        request.wait()
        assert (obj["from"], obj["a"].tolist(), probed.Get_source()) == (partner, [0, 1, 2, 3], lr)
        out.append(("p2p", got.tolist(), status.Get_source(), obj["from"]))
    inter.Barrier()
    inter.barrier()
    for root_side in (0, 1):
        if color == root_side:
            root = MPI.ROOT if lr == 0 else MPI.PROC_NULL
            results = (inter.bcast(("b", rank), root=root), inter.gather(None, root=root),
                       inter.scatter([("s", i) for i in range(rs)] if lr == 0 else None, root=root),
                       inter.reduce(None, op=MPI.SUM, root=root))
            expected = (None, [("g", r) for r in theirs], None, sum(theirs)) if lr == 0 else (None,) * 4
        else:
            results = (inter.bcast(None, root=0), inter.gather(("g", rank), root=0),
                       inter.scatter(None, root=0), inter.reduce(rank, op=MPI.SUM, root=0))
            expected = (("b", theirs[0]), None, ("s", lr), None)
        assert results == expected, (results, expected)
        out.append(("rooted", root_side, *results))
    assert inter.allgather(rank) == theirs
    assert inter.alltoall([(rank, i) for i in range(rs)]) == [(r, lr) for r in theirs]
    assert inter.allreduce(rank, op=MPI.MAX) == max(theirs)
    try:
        inter.bcast(None, root=rs + 5)
        raise AssertionError("a root outside the remote group was accepted")
    except MPI.Exception as error:
        assert error.Get_error_class() == MPI.ERR_ROOT
    merged = inter.Merge(high=(color == 0))   # the high half first
    assert merged.allgather(rank) == list(range(half, size)) + list(range(half))
    dup = inter.Dup()
    assert (dup.Get_remote_size(), MPI.Comm.Compare(dup, inter), dup.allgather(rank)) == (rs, MPI.CONGRUENT,
                                                                                          theirs)
    joined = MPI.Intercomm.Create_from_groups(inter.Get_group(), 0, inter.Get_remote_group(), 0)
    assert (MPI.Comm.Compare(joined, inter), joined.allgather(rank)) == (MPI.CONGRUENT, theirs)
    joined.Free()
    split = inter.Split(lr % 2, -lr)
    same = [r for r in theirs if theirs.index(r) % 2 == lr % 2]
    if split != MPI.COMM_NULL:
        assert split.allgather(rank) == sorted(same, reverse=True)
        out.append(("split", split.Get_rank(), split.Get_size(), split.Get_remote_size()))
        split.Free()
    else:
        assert not same
    for comm in (dup, merged, inter, local):
        comm.Free()
    assert inter == MPI.COMM_NULL
    return out


def buffer_program(MPI, world) -> list[tuple]:   # noqa: N803 - the MPI module under test
    """The blocking buffer collectives over an inter-communicator, checked and returned."""
    rank, size = world.Get_rank(), world.Get_size()
    half = size // 2
    color = 0 if rank < half else 1
    theirs = list(range(half, size)) if color == 0 else list(range(half))
    local = world.Split(color, key=rank)
    inter = MPI.Intracomm.Create_intercomm(local, 0, world, half if color == 0 else 0)
    lr, rs = inter.Get_rank(), inter.Get_remote_size()
    out: list[tuple] = []
    for side in (0, 1):
        if color == side:
            root = MPI.ROOT if lr == 0 else MPI.PROC_NULL
            inter.Bcast([np.arange(4, dtype="i") + 100 * rank, MPI.INT] if lr == 0 else None, root=root)
            gathered = np.zeros(2 * rs) if lr == 0 else None
            inter.Gather(None, [gathered, MPI.DOUBLE] if lr == 0 else None, root=root)
            sent = np.arange(3 * rs, dtype="i") + rank
            inter.Scatter([sent, MPI.INT] if lr == 0 else None, None, root=root)
            if lr == 0:
                assert gathered.tolist() == [r + 0.5 for r in theirs for _ in range(2)]
                out.append(("Gather", gathered.tolist()))
        else:
            got, part = np.zeros(4, "i"), np.zeros(3, "i")
            inter.Bcast(got, root=0)
            inter.Gather(np.full(2, rank + 0.5), None, root=0)
            inter.Scatter(None, part, root=0)
            assert got.tolist() == [100 * theirs[0] + i for i in range(4)]
            assert part.tolist() == [theirs[0] + 3 * lr + i for i in range(3)]
            out.append(("Bcast, Scatter", got.tolist(), part.tolist()))
    gathered = np.zeros(rs * (1 + color), "i")   # the low half sends 2 items, the high half 1
    inter.Allgather(np.full(2 - color, rank, "i"), gathered)
    assert gathered.tolist() == [r for r in theirs for _ in range(1 + color)]
    exchanged = np.zeros(rs, "l")
    inter.Alltoall(np.array([10 * rank + i for i in range(rs)], "l"), exchanged)
    assert exchanged.tolist() == [10 * r + lr for r in theirs]
    total, highest = np.zeros(3), np.zeros(2, "i")
    inter.Allreduce(np.array([rank, -rank, 1.5]), total, op=MPI.SUM)
    inter.Allreduce(np.array([rank, -rank], "i"), highest, op=MPI.MAX)
    assert total.tolist() == [sum(theirs), -sum(theirs), 1.5 * len(theirs)]
    assert highest.tolist() == [max(theirs), -min(theirs)]
    out.append(("all", gathered.tolist(), exchanged.tolist(), total.tolist(), highest.tolist()))
    inter.Free()
    local.Free()
    return out


def thread_checks() -> None:
    """`program`, then the errors, on one thread rank."""
    from colls.compat import MPI

    world = MPI.COMM_WORLD
    program(MPI, world)
    buffer_program(MPI, world)
    rank = world.Get_rank()
    with pytest.raises(MPI.Exception, match="disjoint"):   # both groups are this process
        MPI.COMM_SELF.Create_intercomm(0, MPI.COMM_SELF, 0)
    if rank < 2:   # ranks 0 and 1 join, rank 2 is left out of the two groups
        with pytest.raises(NotImplementedError, match="inter-communicators"):
            MPI.COMM_SELF.Create_intercomm(0, world, 1 - rank)
    world.Barrier()
    local = world.Split(rank % 2, rank)
    inter = local.Create_intercomm(0, world, 1 - rank % 2, tag=3)
    with pytest.raises(NotImplementedError, match="inter-communicators"):
        inter.Reduce(np.zeros(2), None, root=0)
    with pytest.raises(NotImplementedError, match="inter-communicators"):
        inter.Ibcast(np.zeros(2), root=0)
    with pytest.raises(Exception, match="remote group"):
        inter.send(1, inter.Get_remote_size())
    with pytest.raises(TypeError):
        MPI.Intracomm(inter)
    with pytest.raises(TypeError):
        MPI.Intercomm(local)
    inter.Free()
    local.Free()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [2, 3])
def test_intercomm_on_thread_ranks(size: int) -> None:
    from colls.compat import spawn

    if size == 3:
        spawn(thread_checks, 3, timeout=30)
    else:
        from colls.compat import MPI

        spawn(lambda: (program(MPI, MPI.COMM_WORLD), buffer_program(MPI, MPI.COMM_WORLD)), 2, timeout=30)


def compare() -> str:
    """Under mpiexec: `program` with the real mpi4py and with the facade, on this rank."""
    from mpi4py import MPI as real

    from colls.compat import MPI as facade

    expected = program(real, real.COMM_WORLD) + buffer_program(real, real.COMM_WORLD)
    got = program(facade, facade.COMM_WORLD) + buffer_program(facade, facade.COMM_WORLD)
    return "same" if expected == got else f"differ: mpi4py {expected} facade {got}"


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("transport", "size"), [("shm", 4), ("mpi", 3)])
def test_intercomm_matches_mpi4py(transport: str, size: int) -> None:
    pytest.importorskip("mpi4py")
    launcher = Path(sys.executable).parent / "mpiexec"
    if not launcher.exists():
        pytest.skip("no mpiexec beside this Python (pip install mpich)")
    env = dict(os.environ, COLLS_TRANSPORT=transport, COLLS_TIMEOUT="30",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([str(launcher), "-n", str(size), sys.executable, __file__], env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.count("same") == size, done.stdout[-4000:]


if __name__ == "__main__":
    print(compare(), flush=True)
