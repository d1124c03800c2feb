"""Where a small all-reduce's time goes, layer by layer, beside MPI's Allreduce.

Run: COLLS_TRANSPORT=shm mpiexec -n 2 python bench/latency_layers.py [--bytes 8] [--calls 2000]

Each layer is timed alone in a loop of `--calls` back-to-back calls, the layers taking turns in 15
rounds (medians over rounds, rank 0's clock):
- full: `comm.all_reduce(x, out=out)`, the public call (planned after its first call);
- planned: the communicator's planned path alone (`_run_planned`), without the argument checks;
- algorithm: recursive doubling on the communicator's channel, without the communicator;
- MPI: mpi4py's `Allreduce` on the same buffers.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import colls
from algorithms import SUM


def per_call(fn, calls: int) -> float:
    """Seconds per call of `fn` over `calls` calls in a row."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = colls.init()
    x = np.zeros(max(1, args.bytes // 4), np.float32)   # zeros: sums stay exact call after call
    out, theirs = np.empty_like(x), np.empty_like(x)
    comm.all_reduce(x, out=out)   # the first call makes the plan the later ones take
    plan = comm._check.plans[(SUM, x.dtype, x.shape)]
    channel = comm._channel

    def algorithm() -> None:
        channel.deadline = time.monotonic() + 60
        plan.algorithm.run(channel, out, SUM)

    layers = {"full": lambda: comm.all_reduce(x, out=out),
              "planned": lambda: comm._run_planned(plan, x, out, None),
              "algorithm": algorithm,
              "MPI": lambda: world.Allreduce(x, theirs)}
    times: dict[str, list[float]] = {name: [] for name in layers}
    for _ in range(15):
        for name, fn in layers.items():
            world.Barrier()
            times[name].append(per_call(fn, args.calls))
    if world.Get_rank() == 0:
        print(f"# {x.nbytes} B all-reduce, {world.Get_size()} ranks over {comm.transport.name}, "
              f"medians of 15 rounds of {args.calls} calls")
        for name, values in times.items():
            print(f"{name:<10} {np.median(values) * 1e6:6.2f} us")
    comm.close()


if __name__ == "__main__":
    main()
