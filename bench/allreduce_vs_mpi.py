"""First timing: colls all_reduce (shm and mpi transports) beside MPI's own Allreduce, same ranks.

Run: mpiexec -n 2 python bench/allreduce_vs_mpi.py [--sizes 8,1048576,16777216] [--iters 20]
(colls bench, with every collective and Gloo, is the full tool; this is the quick check.)
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

from colls.communicator import Communicator
from transports.mpi import MpiTransport
from transports.shm import ShmTransport


def median_time(fn, iters: int, world) -> float:
    """Median over iterations of the slowest rank's time for one call."""
    times = []
    for _ in range(iters):
        world.Barrier()
        start = time.perf_counter()
        fn()
        elapsed = np.array([time.perf_counter() - start])
        world.Allreduce(MPI.IN_PLACE, elapsed, op=MPI.MAX)
        times.append(elapsed[0])
    return float(np.median(times))


def measure(nbytes: int, world, shm: Communicator, mpi: Communicator, options) -> None:
    """One table row: the three implementations on the same buffers, checked against each other."""
    n = world.Get_size()
    x = np.ones(max(1, nbytes // 4), np.float32)
    y = np.empty_like(x)
    out = np.empty_like(x)
    algorithm = options.algorithm
    for _ in range(3):  # warm up every path
        world.Allreduce(x, y)
        shm.all_reduce(x, out=out, algorithm=algorithm)
        mpi.all_reduce(x, out=out, algorithm=algorithm)
    t_native = median_time(lambda: world.Allreduce(x, y), options.iters, world)
    t_shm = median_time(lambda: shm.all_reduce(x, out=out, algorithm=algorithm), options.iters, world)
    t_mpi = median_time(lambda: mpi.all_reduce(x, out=out, algorithm=algorithm), options.iters, world)
    assert np.array_equal(out, y), "colls and MPI disagree"
    busbw = x.nbytes / t_shm * 2 * (n - 1) / n / 1e9 if n > 1 else 0.0
    if world.Get_rank() == 0:
        print(f"{x.nbytes:>10} {t_native * 1e6:>12.1f}us {t_shm * 1e6:>10.1f}us {t_mpi * 1e6:>10.1f}us "
              f"{busbw:>8.2f}GB/s {t_native / t_shm:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="8,1024,65536,1048576,16777216")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--algorithm", default=None)
    options = parser.parse_args()
    world = MPI.COMM_WORLD
    n = world.Get_size()
    shm = Communicator(ShmTransport(world.Get_rank(), n, world.allgather))
    mpi = Communicator(MpiTransport())
    if world.Get_rank() == 0:
        print(f"# all_reduce float32 SUM, {n} ranks, median of {options.iters}, time of the slowest rank")
        print(f"{'bytes':>10} {'MPI Allreduce':>14} {'colls shm':>12} {'colls mpi':>12} "
              f"{'shm busbw':>10} {'shm/MPI':>8}")
    for nbytes in (int(s) for s in options.sizes.split(",")):
        measure(nbytes, world, shm, mpi, options)
    shm.close()
    mpi.close()



if __name__ == "__main__":
    main()
