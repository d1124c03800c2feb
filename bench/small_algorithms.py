"""Every algorithm of every collective at one small size against MPI's own, any number of ranks:
where a small call's time goes when ranks outnumber cores (4 on 2 here), and which algorithm the
selector should not pick there.

Run: COLLS_TRANSPORT=shm mpiexec -n 4 python bench/small_algorithms.py [--bytes 16] [--calls 300]

Each row is one collective: MPI's time, then each algorithm's, forced (`algorithm=`, so the
unplanned path), the slower rank's median of `--calls` calls, each after a barrier, us. `--bytes`
is each rank's input (the gathered blocks' for all_gather).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import colls
from algorithms.registry import names
from colls.bench.spec import parse_size


def median_us(fn, calls: int) -> float:
    """The slower rank's median time of `fn`, each call after a barrier."""
    world = MPI.COMM_WORLD
    times = np.empty(calls)
    for i in range(calls):
        world.Barrier()
        start = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - start
    return float(np.median(np.max(world.allgather(times), axis=0))) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=parse_size, default=16)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = colls.init()
    rank, size = comm.rank, comm.size
    count = max(1, args.bytes // 4 // size) * size   # float32s, a multiple of the group
    x = np.ones(count, np.float32)
    block = np.ones(count // size, np.float32)
    out, theirs = np.empty_like(x), np.empty_like(x)
    cases = {
        "all_reduce": (lambda a: comm.all_reduce(x, out=out, algorithm=a),
                       lambda: world.Allreduce(x, theirs)),
        "broadcast": (lambda a: comm.broadcast(out, root=0, out=out, algorithm=a),
                      lambda: world.Bcast(theirs, root=0)),
        "reduce": (lambda a: comm.reduce(x, root=0, out=out if rank == 0 else None, algorithm=a),
                   lambda: world.Reduce(x, theirs if rank == 0 else None, root=0)),
        "all_gather": (lambda a: comm.all_gather(block, out=out, algorithm=a),
                       lambda: world.Allgather(block, theirs)),
        "reduce_scatter": (lambda a: comm.reduce_scatter(x, out=block, algorithm=a),
                           lambda: world.Reduce_scatter_block(x, theirs[:count // size])),
        "all_to_all": (lambda a: comm.all_to_all(x, out=out, algorithm=a), lambda: world.Alltoall(x, theirs)),
    }
    if rank == 0:
        print(f"# {size} ranks, {x.nbytes} B a rank, slower rank's median of {args.calls} (us)")
    for collective, (ours, mpi) in cases.items():
        row = [f"MPI {median_us(mpi, args.calls):.1f}"]
        for name in names(collective):
            try:
                row.append(f"{name} {median_us(lambda name=name, ours=ours: ours(name), args.calls):.1f}")
            except colls.CollsError as error:   # (every rank refuses alike: before any byte moves)
                row.append(f"{name} refused ({str(error).splitlines()[0][:40]})")
        if rank == 0:
            print(f"{collective:15s} " + "  ".join(row), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
