"""Hierarchical collectives checked against numpy on one rank of a job spread over virtual hosts.

Imported by tests/test_hierarchical.py (threads and forked ranks) and run as a script under
mpiexec, where it also checks against MPI's own collectives: `python tests/hier_worker.py [DIR]`
(each rank writes its report to DIR/<rank>.json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import colls  # noqa: E402

COUNTS = (0, 1, 7, 1000, 40_003)   # 40 003 float32: past the leader threshold, blocks of unequal size
ROWS = 3                           # all_to_all rows per destination


def values(rank: int, count: int, dtype) -> np.ndarray:
    """Rank `rank`'s input: integers that make any misplaced or missing element show."""
    return ((np.arange(count, dtype=np.int64) * 7 + rank * 1000) % 4099 - 2000).astype(dtype)


def check(comm, mpi=None) -> dict:
    """Every hierarchical schedule on this communicator; returns what ran and what went wrong."""
    rank, size = comm.rank, comm.size
    wrong: list[str] = []
    for dtype in (np.int64, np.float32):
        for count in COUNTS:
            everyone = [values(r, count, dtype) for r in range(size)]
            for op, fold in ((colls.SUM, np.sum), (colls.MAX, np.max)):
                got = comm.all_reduce(everyone[rank], op=op)
                want = fold(np.stack(everyone).astype(np.float64), axis=0) if count else np.zeros(0)
                if not np.allclose(got, want, rtol=1e-6, atol=1e-3 * size) or \
                        (dtype is np.int64 and not np.array_equal(got, want.astype(np.int64))):
                    wrong.append(f"all_reduce {op.name} {np.dtype(dtype)} x{count}")
                # identical on every rank, floats too: each element is reduced once
                table = comm.all_gather(got.reshape(1, -1))
                if not (table == table[0]).all():
                    wrong.append(f"all_reduce {op.name} {np.dtype(dtype)} x{count} differs between ranks")
                if mpi is not None and count:
                    native = np.empty_like(everyone[rank])
                    mpi_op = mpi.SUM if op is colls.SUM else mpi.MAX
                    mpi.COMM_WORLD.Allreduce(everyone[rank], native, op=mpi_op)
                    if not np.allclose(got, native, rtol=1e-6, atol=1e-3 * size):
                        wrong.append(f"all_reduce {op.name} {np.dtype(dtype)} x{count} vs MPI_Allreduce")
            for root in sorted({0, size - 1, size // 2}):
                got = comm.broadcast(everyone[rank].copy(), root=root)
                if not np.array_equal(got, everyone[root]):
                    wrong.append(f"broadcast root {root} {np.dtype(dtype)} x{count}")
        blocks = [values(r, size * ROWS, dtype).reshape(size, ROWS) for r in range(size)]
        got = comm.all_to_all(blocks[rank])
        want = np.stack([blocks[r][rank] for r in range(size)])
        if not np.array_equal(got, want):
            wrong.append(f"all_to_all {np.dtype(dtype)}")
    chosen = {c: colls.explain(c, 1 << 20, comm).chosen for c in ("all_reduce", "broadcast", "all_to_all")}
    levels = comm._levels
    return {"rank": rank, "wrong": wrong, "chosen": chosen, "layout": comm.layout.describe(),
            "levels": [levels.local.name, levels.cross.name] if levels is not None else None}


if __name__ == "__main__":
    from colls.bootstrap import under_mpiexec

    world = colls.init()
    mpi = None
    if under_mpiexec():
        from mpi4py import MPI as mpi
    report = check(world, mpi)
    if len(sys.argv) > 1:   # a folder for the reports: ranks' stdout lines may interleave
        (Path(sys.argv[1]) / f"{world.rank}.json").write_text(json.dumps(report))
    print("HIER " + json.dumps(report), flush=True)
    world.close()
