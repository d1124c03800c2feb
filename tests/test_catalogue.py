"""Every algorithm of every collective, forced by name, on every transport, checked exactly.

The catalogue is read from `colls.algorithms`, so an algorithm registered later is covered without
touching this file. One job per (transport, world size) runs the whole catalogue, to pay for process
start once: threads (`local`) at 1-9, 11 and 16 ranks, forked processes (`shm`) and `mpiexec`
(`mpi`, this file run as a script) at 1-5. Inputs are small integers, so every answer is exact;
a 2x2 integer matrix product catches any algorithm that claims rank order and breaks it. The byte
counters are held to the textbook volume of each schedule.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import traceback

import numpy as np
import pytest

import colls
from algorithms.registry import lookup

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
               "all_to_all_v", "gather", "scatter", "barrier")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
PER_RANK_BLOCKS = ("reduce_scatter", "all_to_all", "all_to_all_v", "scatter")   # input is n blocks
COUNTS = {0: "int64", 1: "int64", 7: "float64", 1001: "int32"}                   # rows -> dtype
BIG_ROWS = 2**18 + 3                                     # int64 rows: 2 MiB of input per rank
BIG_MATRICES = 2**15 + 3                                 # 2x2 int64 matrices: 1 MiB per rank
MATRIX = np.dtype([("m", np.int64, (2, 2))])
LOCAL_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 16)
PROCESS_SIZES = (1, 2, 3, 4, 5)
BIG_SIZES = {"local": (2, 3, 5, 8, 11), "shm": (2, 3, 4, 5), "mpi": (2, 3, 5)}
TIMEOUT_S = 60.0


def matmul(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Elementwise 2x2 integer matrix product: associative, not commutative."""
    result = np.empty(left.shape, MATRIX)
    result["m"] = left["m"] @ right["m"]
    return result


MATMUL = colls.Op(matmul, commutative=False, name="matmul")


def data(rank: int, rows: int, dtype) -> np.ndarray:
    """Rank `rank`'s input: small integers (entries 0..2 for matrices), different on every rank."""
    if np.dtype(dtype) == MATRIX:
        # pseudo-random, so that no two ranks share matrices (a residue of the rank would repeat)
        x = np.empty(rows, MATRIX)
        x["m"] = np.random.default_rng([rank, rows]).integers(0, 3, (rows, 2, 2))
        return x
    return ((np.arange(rows, dtype=np.int64) * 7 + rank * 13) % 23 - 11).astype(dtype)


def fold(arrays: list[np.ndarray]) -> np.ndarray:
    """The numpy oracle: rank 0's operand leftmost (sum, or ordered matrix product)."""
    if arrays[0].dtype == MATRIX:
        result = arrays[0].copy()
        for x in arrays[1:]:
            result["m"] = result["m"] @ x["m"]
        return result
    return np.sum(arrays, axis=0, dtype=np.int64).astype(arrays[0].dtype)


def v_counts(rank: int, size: int, rows: int) -> list[int]:
    """all_to_all_v rows from `rank` to each peer: 0, rows or 2 rows, zeros on every rank for n > 2."""
    return [rows * ((rank + 2 * peer) % 3) for peer in range(size)]


def call(comm, collective: str, algorithm: str, rows: int, dtype, op, root) -> tuple:
    """Run one collective forced to `algorithm`; (what it returned, what numpy says it must)."""
    rank, size = comm.rank, comm.size
    length = size * rows if collective in PER_RANK_BLOCKS else rows
    x = data(rank, length, dtype)
    mine = slice(rank * rows, (rank + 1) * rows)
    everyone = [data(q, length, dtype) for q in range(size)]
    if collective == "all_reduce":
        return comm.all_reduce(x, op=op, algorithm=algorithm), fold(everyone)
    if collective == "broadcast":
        return comm.broadcast(x, root=root, algorithm=algorithm), everyone[root]
    if collective == "reduce":
        return comm.reduce(x, root=root, op=op, algorithm=algorithm), fold(everyone) if rank == root else None
    if collective == "all_gather":
        return comm.all_gather(x, algorithm=algorithm), np.concatenate(everyone)
    if collective == "reduce_scatter":
        return comm.reduce_scatter(x, op=op, algorithm=algorithm), fold(everyone)[mine]
    if collective == "all_to_all":
        return comm.all_to_all(x, algorithm=algorithm), np.concatenate([y[mine] for y in everyone])
    if collective == "all_to_all_v":
        counts = [v_counts(q, size, rows) for q in range(size)]
        sent = [data(q, sum(counts[q]), dtype) for q in range(size)]
        parts = [sent[q][sum(counts[q][:rank]):sum(counts[q][:rank + 1])] for q in range(size)]
        got, recv_counts = comm.all_to_all_v(sent[rank], counts[rank], algorithm=algorithm)
        assert recv_counts == [counts[q][rank] for q in range(size)], recv_counts
        return got, np.concatenate(parts)
    if collective == "gather":
        want = np.concatenate(everyone) if rank == root else None
        return comm.gather(x, root=root, algorithm=algorithm), want
    if collective == "scatter":
        return comm.scatter(x, root=root, algorithm=algorithm), everyone[root][mine]
    assert collective == "barrier"
    return comm.barrier(algorithm=algorithm), None


def cases(collective: str, size: int, big: bool):
    """(rows, dtype, op, root) for one collective: every count, a few roots, the matrix op."""
    roots = sorted({0, size // 2, size - 1}) if collective in ROOTED else [None]
    if collective == "barrier":
        yield 0, "int64", None, None
        return
    for rows, dtype in COUNTS.items():
        for root in roots:
            yield rows, dtype, colls.SUM, root
            if collective in REDUCING:
                yield rows, MATRIX, MATMUL, root
    if big:
        # a few MiB in all (blocks of it for the per-block collectives): many shm chunks per message
        per_block = collective in PER_RANK_BLOCKS + ("all_gather", "gather")
        yield BIG_ROWS // size if per_block else BIG_ROWS, "int64", colls.SUM, roots[-1]
        if collective in REDUCING:
            yield BIG_MATRICES // size if per_block else BIG_MATRICES, MATRIX, MATMUL, roots[-1]


def same(got, want) -> bool:
    """Bitwise equality, shape and dtype included (None only where None is due)."""
    if want is None or got is None:
        return got is None and want is None
    return got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes()


def run_catalogue(comm, big: bool = False) -> list[str]:
    """Every collective x every algorithm x every case on `comm`; this rank's failures, as text."""
    failures: list[str] = []
    for collective in COLLECTIVES:
        for name in colls.algorithms(collective):
            order_keeping = not lookup(collective, name).commutative_only
            for rows, dtype, op, root in cases(collective, comm.size, big):
                label = (f"rank {comm.rank}/{comm.size}: {collective} {name} rows={rows} "
                         f"dtype={np.dtype(dtype).str} op={op!r} root={root}")
                if op is MATMUL and not order_keeping:
                    try:
                        call(comm, collective, name, rows, dtype, op, root)
                        failures.append(f"{label}: accepted a non-commutative op despite commutative_only")
                    except colls.InvalidArgument:
                        pass
                    continue
                try:
                    got, want = call(comm, collective, name, rows, dtype, op, root)
                except Exception as error:
                    raise AssertionError(f"{label}: raised {error!r}") from error
                if not same(got, want):
                    failures.append(f"{label}: got {_head(got)}, want {_head(want)}")
    return failures


def _head(x) -> str:
    return "None" if x is None else f"{x.shape} {x.dtype.str} {x.reshape(-1)[:4].tolist()}..."


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("transport", "size"),
                         [("local", n) for n in LOCAL_SIZES] + [("shm", n) for n in PROCESS_SIZES])
def test_catalogue(transport, size):
    big = size in BIG_SIZES[transport]
    _no_failures(colls.spawn(run_catalogue, size, transport=transport, args=(big,), timeout=TIMEOUT_S))


def _no_failures(per_rank: list[list[str]]) -> None:
    found = [failure for failures in per_rank for failure in failures]
    assert not found, f"{len(found)} failures:\n" + "\n".join(found[:40])


def _mpiexec() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")


@pytest.mark.mpi
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", PROCESS_SIZES)
def test_catalogue_mpi(size):
    pytest.importorskip("mpi4py")
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found")
    big = ["--big"] if size in BIG_SIZES["mpi"] else []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLS_", "PMI_", "OMPI_"))}
    done = subprocess.run([mpiexec, "-n", str(size), sys.executable, os.path.abspath(__file__), *big],
                          capture_output=True, text=True, timeout=170, env=env)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-6000:]}\nstderr:\n{done.stderr[-6000:]}"
    assert done.stdout.count("CATALOGUE OK") == size, done.stdout[-3000:]


VOLUME_ROWS = 5     # int64 rows per block: 40 B, so every count below is exact


def _subtree(relative: int, size: int) -> int:
    """Blocks under relative rank `relative` in a binomial tree (its lowest set bit, capped)."""
    return min(relative & -relative, size - relative) if relative else size


def expected_volume(collective: str, name: str, size: int, rank: int, root: int) -> tuple[int, int] | None:
    """(blocks sent, blocks received) by `rank` in the textbook schedule, or None if not modelled."""
    power = 1 << (size.bit_length() - 1)
    extra, lacking = size - power, size - 1
    folded_out = rank < 2 * extra and rank % 2 == 0
    relative = (rank - root) % size
    if (collective, name) in {("all_gather", "ring"), ("all_gather", "bruck"), ("reduce_scatter", "ring"),
                              ("reduce_scatter", "pairwise"), ("all_to_all", "pairwise"),
                              ("all_to_all", "direct")}:
        return lacking, lacking                # (n-1)/n of the buffer each way, for any n
    if (collective, name) == ("all_to_all", "bruck"):
        moved = sum(bin(j).count("1") for j in range(size))   # block j hops once per bit of j
        return moved, moved
    if (collective, name) == ("all_gather", "recursive_doubling"):
        if folded_out:
            return 1, lacking
        virtual = rank // 2 if rank < 2 * extra else rank - extra
        doubling = 0
        for bit in range(power.bit_length() - 1):
            low = virtual >> bit << bit        # my group: 2^bit virtual ranks, those below `extra` hold 2
            doubling += (1 << bit) + max(0, min(low + (1 << bit), extra) - low)
        return doubling + (lacking if rank < 2 * extra else 0), lacking
    if (collective, name) == ("reduce_scatter", "recursive_halving") and extra == 0:
        return lacking, lacking                # n/2 + n/4 + ... + 1 blocks each way
    if (collective, name) == ("gather", "binomial"):
        return (0 if rank == root else _subtree(relative, size)), _subtree(relative, size) - 1
    if (collective, name) == ("scatter", "binomial"):
        return _subtree(relative, size) - 1, (0 if rank == root else _subtree(relative, size))
    if (collective, name) == ("gather", "direct"):
        return (0, lacking) if rank == root else (1, 0)
    if (collective, name) == ("scatter", "direct"):
        return (lacking, 0) if rank == root else (0, 1)
    return None


def measure_volumes(comm) -> dict[str, dict[str, object]]:
    """Bytes each algorithm of the block collectives sent and received on this rank, int64 blocks."""
    rank, size, rows = comm.rank, comm.size, VOLUME_ROWS
    root = size // 2
    measured = {}
    for collective in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter", "all_to_all_v"):
        for name in colls.algorithms(collective):
            comm.reset_stats()
            if collective == "all_to_all_v":
                # the counts exchange is the same whatever the counts: measure it with empty rows
                comm.all_to_all_v(np.empty(0, np.int64), [0] * size, algorithm=name)
                overhead = comm.stats()["all_to_all_v"]
                comm.reset_stats()
                counts = v_counts(rank, size, rows)
                _, recv_counts = comm.all_to_all_v(np.zeros(sum(counts), np.int64), counts, algorithm=name)
                stats = comm.stats()["all_to_all_v"]
                want = (8 * (sum(counts) - counts[rank]), 8 * (sum(recv_counts) - recv_counts[rank]))
                if name == "bruck":
                    # every block padded to the largest count of any pair, forwarded once per set bit
                    largest = max(max(v_counts(r, size, rows)) for r in range(size))
                    hops = sum(bin(j).count("1") for j in range(size))
                    want = (8 * largest * hops, 8 * largest * hops)
                measured[f"{collective} {name}"] = {
                    "sent": stats["bytes_sent"] - overhead["bytes_sent"],
                    "received": stats["bytes_received"] - overhead["bytes_received"],
                    "want": want}
                continue
            call(comm, collective, name, rows, "int64", colls.SUM, root)
            stats = comm.stats()[collective]
            schedule = name
            if name == "hierarchical":
                # all ranks here share one host: the flat schedule chosen inside it is all that runs
                schedule = colls.explain(collective, size * rows * 8, comm).chosen
            want = expected_volume(collective, schedule, size, rank, root)
            measured[f"{collective} {name}"] = {
                "sent": stats["bytes_sent"], "received": stats["bytes_received"],
                "want": None if want is None else (want[0] * rows * 8, want[1] * rows * 8)}
    return measured


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", LOCAL_SIZES)
def test_byte_counters_match_the_textbook(size):
    per_rank = colls.spawn(measure_volumes, size, transport="local", timeout=TIMEOUT_S)
    block = VOLUME_ROWS * 8
    for key in per_rank[0]:
        sent = [r[key]["sent"] for r in per_rank]
        received = [r[key]["received"] for r in per_rank]
        assert sum(sent) == sum(received), key                    # every byte sent is received
        for rank, r in enumerate(per_rank):
            # a block-collective algorithm without a volume model here is a gap in this test
            assert r[key]["want"] is not None or key == "reduce_scatter recursive_halving", key
            if r[key]["want"] is not None:
                assert (r[key]["sent"], r[key]["received"]) == r[key]["want"], (key, rank)
        if key == "reduce_scatter recursive_halving":
            # folding n - p even ranks into p: they send n blocks and get 1 back; the halving among
            # p ranks moves (p-1) buffers in all (half the window per pair and step)
            power = 1 << (size.bit_length() - 1)
            extra = size - power
            assert sum(sent) == block * (extra * size + (power - 1) * size + extra), key
            for rank in range(0, 2 * extra, 2):
                assert (sent[rank], received[rank]) == (size * block, block), (key, rank)


def test_matrix_operator_catches_reordering():
    """The oracle's teeth: the matrix product of the ranks' inputs depends on their order."""
    inputs = [data(q, 7, MATRIX) for q in range(16)]
    for size in (2, 3, 4, 8, 16):
        ordered = fold(inputs[:size]).tobytes()
        assert ordered != fold(inputs[:size][::-1]).tobytes()
        swapped = [inputs[q ^ (size // 2)] if q in (0, size // 2) else inputs[q] for q in range(size)]
        assert ordered != fold(swapped).tobytes()    # the halving-by-top-bit order, say


if __name__ == "__main__":
    # the mpi job: mpiexec -n N python tests/test_catalogue.py [--big]
    world = colls.init(timeout=TIMEOUT_S)
    try:
        found = run_catalogue(world, big="--big" in sys.argv)
    except Exception:
        found = [traceback.format_exc()]
    print("\n".join(found) if found else f"CATALOGUE OK rank {world.rank}", flush=True)
    world.close()
    sys.exit(1 if found else 0)
