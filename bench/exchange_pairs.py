"""Two steps of a 2-rank collective, alone and back to back: why 1 MiB calls cost more than their parts.

Run: mpiexec -n 2 python bench/exchange_pairs.py [--bytes 1048576] [--iters 40]

Each rank holds x and out of `--bytes`. The steps, on halves of them (shm transport):
- reduce: Rabenseifner's halving step, a reducing exchange of x's other half into out's own half;
- gather: its all-gather step, a plain exchange of out's own half into out's other half;
- copy: all_to_all's local step, np.copyto of x's own half into out's own half;
- swap: all_to_all's exchange, x's other half into out's other half.
Printed: the median, over iterations started after a barrier, of the slowest rank's time for each
step alone, for the pairs the collectives make, and for the whole collectives beside MPI's.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

from algorithms import SUM
from colls.communicator import Communicator
from transports.shm import ShmTransport


def median_us(world, fn, iters: int) -> float:
    """Median over iterations of the slowest rank's time for `fn()`, in microseconds."""
    times = np.empty(iters)
    for i in range(iters):
        world.Barrier()
        start = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - start
    world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return float(np.median(times[iters // 8:])) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--iters", type=int, default=40)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        raise SystemExit("run on 2 ranks: mpiexec -n 2 python bench/exchange_pairs.py")
    comm = Communicator(ShmTransport(world.Get_rank(), 2, world.allgather))
    rank, peer = comm.rank, 1 - comm.rank
    x = np.ones(args.bytes // 4, np.float32)
    out = np.empty_like(x)
    half = x.size // 2
    mine, other = (slice(0, half), slice(half, None)) if rank == 0 else (slice(half, None), slice(0, half))
    channel = comm.channel("exchange pairs", timeout=60)
    steps = {
        "reduce": lambda: channel.exchange(x[other], peer, out[mine], peer, SUM.into_left),
        "gather": lambda: channel.exchange(out[mine], peer, out[other], peer),
        "copy": lambda: np.copyto(out[mine], x[mine]),
        "swap": lambda: channel.exchange(x[other], peer, out[other], peer),
    }
    rows = {name: median_us(world, step, args.iters) for name, step in steps.items()}
    for first, second in (("reduce", "gather"), ("copy", "swap"), ("swap", "swap")):
        pair = (steps[first], steps[second])
        rows[f"{first} then {second}"] = median_us(world, lambda pair=pair: (pair[0](), pair[1]()),
                                                   args.iters)
    rows["colls all_reduce (rabenseifner)"] = median_us(
        world, lambda: comm.all_reduce(x, out=out, algorithm="rabenseifner"), args.iters)
    rows["MPI Allreduce"] = median_us(world, lambda: world.Allreduce(x, out), args.iters)
    rows["colls all_to_all (pairwise)"] = median_us(
        world, lambda: comm.all_to_all(x, out=out, algorithm="pairwise"), args.iters)
    rows["MPI Alltoall"] = median_us(world, lambda: world.Alltoall(x, out), args.iters)
    if rank == 0:
        print(f"# {args.bytes} B per rank, halves of {args.bytes // 2} B, medians of {args.iters}")
        for name, micros in rows.items():
            print(f"{name:<34} {micros:9.1f} us")
    comm.close()


if __name__ == "__main__":
    main()
