"""Run the collective matrix on `colls.init()`'s world; rank 0 prints `MATRIX {json}`.

    mpiexec -n 4 python tests/matrix_worker.py [--big-dtypes float32] [--big-collectives all_reduce]

Under the mpi transport (or shm bootstrapped by mpiexec) it also checks all_reduce, broadcast,
all_gather, reduce_scatter and all_to_all against mpi4py's own `MPI.COMM_WORLD.Allreduce`, `Bcast`,
`Allgather`, `Reduce_scatter_block` and `Alltoall` on the same inputs: an independent reference.
Exits 1 if any rank saw a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference  # noqa: E402

import colls  # noqa: E402
from colls.bootstrap import under_mpiexec  # noqa: E402

# dtypes and ops MPI defines for these collectives (MPI has no float16, no AVG, no SUM on C_BOOL)
MPI_DTYPES = ("int8", "uint8", "int32", "int64", "uint64", "float32", "float64", "complex64", "complex128")
MPI_OPS = ("SUM", "PROD", "MIN", "MAX", "BAND", "BOR", "BXOR")


def compare_with_mpi(comm, checker: reference.Checker, seed: int) -> None:
    """The same inputs through colls and through mpi4py's collectives: the bytes must agree."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    mpi_ops = {name: getattr(MPI, name) for name in MPI_OPS}
    for dtype in MPI_DTYPES + ("bool",):
        for count in (0, 1, 7, 1000):
            label = f"vs mpi4py {dtype} count={count}"
            if dtype != "bool":
                for op in reference.valid_ops(dtype):
                    if op not in mpi_ops:
                        continue
                    x = reference.make_input(seed, rank, count, dtype, op=op)
                    theirs = np.empty_like(x)
                    world.Allreduce(x, theirs, op=mpi_ops[op])
                    # complex products with zero parts may sign those zeros by operand order
                    checker.expect(f"{label} Allreduce {op}", comm.all_reduce(x, op=reference.OPS[op]),
                                   theirs, signed_zeros=op == "PROD" and dtype.startswith("complex"))
                x = reference.make_input(seed, rank, count * size, dtype, op="SUM")
                theirs = np.empty(count, x.dtype)
                world.Reduce_scatter_block(x, theirs, op=MPI.SUM)
                checker.expect(f"{label} Reduce_scatter_block", comm.reduce_scatter(x), theirs)
            x = reference.make_input(seed, rank, count, dtype)
            root = count % size
            theirs = x.copy()
            world.Bcast(theirs, root=root)
            checker.expect(f"{label} Bcast root {root}", comm.broadcast(x, root=root), theirs)
            theirs = np.empty(count * size, x.dtype)
            world.Allgather(x, theirs)
            checker.expect(f"{label} Allgather", comm.all_gather(x), theirs)
            x = reference.make_input(seed, rank, count * size, dtype)
            theirs = np.empty_like(x)
            world.Alltoall(x, theirs)
            checker.expect(f"{label} Alltoall", comm.all_to_all(x), theirs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--big-dtypes", default=",".join(reference.BIG_DTYPES))
    parser.add_argument("--big-collectives", default=",".join(reference.BIG_COLLECTIVES))
    parser.add_argument("--no-mpi-reference", action="store_true")
    args = parser.parse_args()
    split = lambda text: tuple(t for t in text.split(",") if t)  # noqa: E731
    comm = colls.init()
    summary = reference.run_matrix(comm, seed=args.seed, big_dtypes=split(args.big_dtypes),
                                   big_collectives=split(args.big_collectives))
    mpi_checks = 0
    if under_mpiexec() and not args.no_mpi_reference and not summary["failures"]:
        checker = reference.Checker(comm.rank)
        try:
            compare_with_mpi(comm, checker, args.seed)
        except Exception:
            checker.failures.append(f"rank {comm.rank}: mpi4py comparison raised\n{traceback.format_exc()}")
        mpi_checks = checker.checks
        summary = {"checks": summary["checks"] + checker.checks,
                   "failures": summary["failures"] + checker.failures}
    try:
        checks, failures = reference.gather_failures(comm, summary)
    except Exception:
        # the ranks fell out of step after a failure: report this rank's own view and fail
        print(json.dumps(summary), file=sys.stderr, flush=True)
        traceback.print_exc()
        return 1
    if comm.rank == 0:
        report = {"transport": comm.transport.name, "size": comm.size, "checks": checks,
                  "mpi_checks": mpi_checks * comm.size, "failures": failures}
        print("MATRIX " + json.dumps(report), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
