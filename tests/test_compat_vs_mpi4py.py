"""Every function of the facade against real mpi4py (MPICH) on the same inputs, under mpiexec.

Each case below is written once against an `MPI` module and a communicator; under `mpiexec -n N`
every rank runs it with real mpi4py on MPI.COMM_WORLD and with `colls.compat.MPI` on colls' world
(COLLS_TRANSPORT=shm, or mpi), then compares the output buffers byte for byte. Inputs are small
integers (also for floats), so every order of summation gives the same bits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def data(comm, n, dtype="i", salt=0):
    """Small integer-valued inputs that differ by rank and by case."""
    rng = np.random.default_rng(1000 * comm.Get_rank() + salt)
    return rng.integers(-4, 5, n).astype(dtype)


def uneven(size):
    """Per-rank counts 0, 1, 2, ... with gaps between blocks."""
    counts = [(r * 2 + 1) % 4 for r in range(size)]
    displs = [sum(counts[:r]) + r for r in range(size)]
    return counts, displs, sum(counts) + size


# -- data movement -----------------------------------------------------------------------------------

@case
def bcast(MPI, comm):
    out = []
    for root in range(comm.Get_size()):
        buf = data(comm, 7, "d", root)
        comm.Bcast([buf, MPI.DOUBLE], root=root)
        out.append(buf)
    return out


@case
def gather_scatter(MPI, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    root = size - 1
    recv = np.full(size * 3, -1, "i")
    comm.Gather(data(comm, 3), [recv, MPI.INT] if rank == root else None, root=root)
    block = np.full(3, -1, "i")
    comm.Scatter([data(comm, 3 * size, "i", 5), MPI.INT] if rank == root else None, block, root=root)
    inplace = data(comm, 3 * size, "i", 6)
    comm.Gather(MPI.IN_PLACE if rank == 0 else inplace[3 * rank:3 * rank + 3], inplace, root=0)
    return [recv if rank == root else np.zeros(0), block, inplace if rank == 0 else np.zeros(0)]


@case
def gatherv_scatterv(MPI, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    counts, displs, total = uneven(size)
    recv = np.full(total, -1, "q")
    comm.Gatherv(data(comm, counts[rank], "q"), [recv, (counts, displs), MPI.LONG_LONG], root=0)
    mine = np.full(counts[rank], -1, "q")
    comm.Scatterv([data(comm, total, "q", 3), (counts, displs), MPI.LONG_LONG], mine, root=size // 2)
    return [recv if rank == 0 else np.zeros(0), mine]


@case
def allgather_alltoall(MPI, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    gathered = np.empty(2 * size, "h")
    comm.Allgather([data(comm, 2, "h"), MPI.SHORT], [gathered, MPI.SHORT])
    inplace = np.where(np.arange(2 * size) // 2 == rank, data(comm, 2 * size, "h"), 0).astype("h")
    comm.Allgather(MPI.IN_PLACE, inplace)
    exchanged = np.empty(3 * size, "f")
    comm.Alltoall(data(comm, 3 * size, "f"), exchanged)
    exchanged_in_place = data(comm, 3 * size, "f", 9)
    comm.Alltoall(MPI.IN_PLACE, exchanged_in_place)
    return [gathered, inplace, exchanged, exchanged_in_place]


@case
def allgatherv_alltoallv(MPI, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    counts, displs, total = uneven(size)
    gathered = np.full(total, -1, "d")
    comm.Allgatherv(data(comm, counts[rank], "d"), [gathered, (counts, displs), MPI.DOUBLE])
    send_counts = [(rank + peer) % 3 for peer in range(size)]
    recv_counts = [(peer + rank) % 3 for peer in range(size)]
    send_displs = [sum(send_counts[:p]) for p in range(size)]
    recv_displs = [sum(recv_counts[:p]) + 2 * p for p in range(size)]
    received = np.full(sum(recv_counts) + 2 * size, -1, "i")
    comm.Alltoallv([data(comm, sum(send_counts)), (send_counts, send_displs), MPI.INT],
                   [received, (recv_counts, recv_displs), MPI.INT])
    nbytes = np.dtype("i").itemsize
    wreceived = np.full(sum(recv_counts) + 2 * size, -1, "i")
    comm.Alltoallw([data(comm, sum(send_counts), "i", 4), (send_counts, [d * nbytes for d in send_displs]),
                    [MPI.INT] * size],
                   [wreceived, (recv_counts, [d * nbytes for d in recv_displs]), [MPI.INT] * size])
    return [gathered, received, wreceived]


# -- reductions --------------------------------------------------------------------------------------

INTEGER_OPS = ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR")


@case
def reductions(MPI, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    out = []
    for name in INTEGER_OPS:
        op = getattr(MPI, name)
        for code, datatype in (("i", MPI.INT), ("B", MPI.UNSIGNED_CHAR), ("q", MPI.INT64_T)):
            x = data(comm, 6, code, len(out))
            result = np.full(6, 7, code)
            comm.Allreduce([x, datatype], [result, datatype], op=op)
            rooted = np.full(6, 7, code)
            comm.Reduce([x, datatype], [rooted, datatype], op=op, root=size - 1)
            out += [result, rooted if rank == size - 1 else np.zeros(0)]
    for name in ("SUM", "PROD", "MAX", "MIN"):
        x = data(comm, 5, "d", 40)
        comm.Allreduce(MPI.IN_PLACE, [x, MPI.DOUBLE], op=getattr(MPI, name))
        out.append(x)
    z = (data(comm, 4, "d", 41) + 1j * data(comm, 4, "d", 42)).astype("D")
    comm.Allreduce(MPI.IN_PLACE, [z, MPI.C_DOUBLE_COMPLEX], op=MPI.PROD)
    flags = data(comm, 8, "i", 43) > 0
    for op in (MPI.LAND, MPI.LOR, MPI.LXOR):
        result = np.empty(8, "?")
        comm.Allreduce([flags, MPI.C_BOOL], [result, MPI.C_BOOL], op=op)
        out.append(result)
    return out + [z]


@case
def maxloc_minloc(MPI, comm):
    pairs = np.zeros(4, MPI.DOUBLE_INT.dtype if hasattr(MPI.DOUBLE_INT, "dtype") else
                     np.dtype([("value", "d"), ("index", "i")], align=True))
    pairs["value"] = data(comm, 4, "d")
    pairs["index"] = comm.Get_rank()
    out = []
    for op in (MPI.MAXLOC, MPI.MINLOC):
        result = np.zeros_like(pairs)
        comm.Allreduce([pairs, MPI.DOUBLE_INT], [result, MPI.DOUBLE_INT], op=op)
        out.append(result.view(np.uint8).reshape(4, -1)[:, :12].copy())   # no padding bytes
    return out


def matrix_product(inbuf, inoutbuf, datatype):
    """A non-commutative user op: 2x2 matrix products, inoutbuf = inbuf @ inoutbuf."""
    left = np.frombuffer(inbuf, "d").reshape(-1, 2, 2)
    right = np.frombuffer(inoutbuf, "d").reshape(-1, 2, 2)
    right[...] = left @ right


@case
def user_op_and_scans(MPI, comm):
    rank = comm.Get_rank()
    op = MPI.Op.Create(matrix_product, commute=False)
    x = data(comm, 12, "d") % 3
    out = []
    result = np.zeros(12)
    comm.Allreduce(x, result, op=op)
    rooted = np.zeros(12)
    comm.Reduce(x, rooted, op=op, root=0)
    scanned = np.zeros(12)
    comm.Scan(x, scanned, op=op)
    out += [result, rooted if rank == 0 else np.zeros(0), scanned]
    for name in ("SUM", "PROD", "MAX", "BXOR"):
        y = data(comm, 5, "i", 7)
        inclusive, exclusive = np.full(5, 9, "i"), np.full(5, 9, "i")
        comm.Scan(y, inclusive, op=getattr(MPI, name))
        comm.Exscan(y, exclusive, op=getattr(MPI, name))
        comm.Scan(MPI.IN_PLACE, y, op=getattr(MPI, name))
        out += [inclusive, exclusive if rank > 0 else np.zeros(0), y]
    op.Free()
    return out


@case
def reduce_scatters(MPI, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    block = np.empty(3, "l")
    comm.Reduce_scatter_block(data(comm, 3 * size, "l"), block, op=MPI.SUM)
    counts = [(r % 3) + 1 for r in range(size)]
    mine = np.empty(counts[rank], "l")
    comm.Reduce_scatter(data(comm, sum(counts), "l", 2), mine, counts, op=MPI.MAX)
    inplace = data(comm, sum(counts), "l", 3)
    comm.Reduce_scatter(MPI.IN_PLACE, inplace, counts, op=MPI.SUM)
    return [block, mine, inplace[:counts[rank]]]


@case
def nonblocking(MPI, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    a, b, c = np.empty(4), data(comm, 3, "i"), np.empty(2 * size, "i")
    counts, displs, total = uneven(size)
    d = np.full(total, -1, "i")
    requests = [comm.Iallreduce(data(comm, 4, "d"), a, op=MPI.SUM), comm.Ibcast(b, root=0),
                comm.Iallgather(data(comm, 2), c), comm.Iallgatherv(data(comm, counts[rank]),
                                                                    [d, (counts, displs), MPI.INT]),
                comm.Ibarrier()]
    e = np.empty(3, "i")
    requests.append(comm.Iscan(data(comm, 3, "i", 1), e))
    MPI.Request.Waitall(requests)
    f = np.empty(size, "i")
    request = comm.Ialltoall(data(comm, size), f)
    while not request.Test():
        pass
    return [a, b, c, d, e, f]


# -- point to point, groups --------------------------------------------------------------------------

@case
def point_to_point(MPI, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    right, left = (rank + 1) % size, (rank - 1) % size
    got = np.empty(5, "i")
    status = MPI.Status()
    comm.Sendrecv(data(comm, 5), right, 3, got, left, 3, status)
    count = np.array([status.Get_source(), status.Get_tag(), status.Get_count(MPI.INT)], "i")
    incoming = np.empty(4)
    requests = [comm.Irecv([incoming, MPI.DOUBLE], left, 8), comm.Isend(data(comm, 4, "d"), right, 8)]
    MPI.Request.Waitall(requests)
    blocking = np.zeros(2, "i")
    partner = rank ^ 1   # pairs (0, 1), (2, 3), ...: blocking Send/Recv in opposite orders
    if partner < size and rank % 2 == 0:
        comm.Send(data(comm, 2, "i", 5), partner, tag=1)
        comm.Recv(blocking, partner, tag=2)
    elif partner < size:
        comm.Recv(blocking, partner, tag=1)
        comm.Send(data(comm, 2, "i", 5), partner, tag=2)
    return [got, count, incoming, blocking]


@case
def groups(MPI, comm):
    rank = comm.Get_rank()
    dup = comm.Dup()
    total = np.empty(3, "i")
    dup.Allreduce(data(comm, 3), total)
    dup.Free()
    half = comm.Split(rank % 2, key=-rank)
    sub = np.empty(3, "i")
    half.Allreduce(data(comm, 3), sub)
    info = np.array([half.Get_rank(), half.Get_size()], "i")
    half.Free()
    none = comm.Split(MPI.UNDEFINED if rank == 0 else 1, 0)
    flag = np.array([none == MPI.COMM_NULL], "?")
    # Compare by members and order (found by review: any two of one size were CONGRUENT)
    halves, pairs = comm.Split(rank % 2, key=rank), comm.Split(rank // 2, key=rank)
    reversed_, again, alone = comm.Split(0, key=-rank), comm.Dup(), comm.Split(rank, 0)
    compared = np.array([comm.Compare(comm), comm.Compare(again), comm.Compare(reversed_),
                         halves.Compare(pairs), MPI.COMM_SELF.Compare(alone),
                         MPI.COMM_SELF.Compare(halves)], "i")
    return [total, sub, info, flag, compared]


# -- running under mpiexec ---------------------------------------------------------------------------

def compare_all() -> int:
    """Run every case with both MPIs on this rank; print mismatches; return how many there were."""
    from mpi4py import MPI as real

    from colls.compat import MPI as facade

    failures = 0
    for name, fn in CASES.items():
        expected = fn(real, real.COMM_WORLD)
        got = fn(facade, facade.COMM_WORLD)
        for index, (want, have) in enumerate(zip(expected, got, strict=True)):
            if want.dtype != have.dtype or want.tobytes() != have.tobytes():
                failures += 1
                print(f"rank {real.COMM_WORLD.Get_rank()}: {name}[{index}]: mpi4py {want!r} "
                      f"facade {have!r}", flush=True)
    print(f"rank {real.COMM_WORLD.Get_rank()}: {len(CASES)} cases, {failures} mismatches", flush=True)
    return failures


def mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else None


@pytest.mark.mpi
@pytest.mark.parametrize("transport", ["shm", "mpi"])
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_facade_matches_mpi4py(size: int, transport: str) -> None:
    pytest.importorskip("mpi4py")
    launcher = mpiexec()
    if launcher is None:
        pytest.skip("no mpiexec beside this Python (pip install mpich)")
    if transport == "mpi" and size not in (2, 3):
        pytest.skip("the mpi transport runs at sizes 2 and 3 (the shm runs cover the rest)")
    env = dict(os.environ, COLLS_TRANSPORT=transport, COLLS_TIMEOUT="60",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([launcher, "-n", str(size), sys.executable, __file__], env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.count(f"{len(CASES)} cases, 0 mismatches") == size, done.stdout[-3000:]


if __name__ == "__main__":
    sys.exit(1 if compare_all() else 0)
