"""Where a small collective's time goes, layer by layer, beside MPI's own.

Run: COLLS_TRANSPORT=shm mpiexec -n 2 python bench/latency_layers.py [--bytes 8] [--calls 2000]
     [--collective all_reduce|all_to_all|all_gather|broadcast]

Each layer is timed alone in a loop of `--calls` back-to-back calls, the layers taking turns in 15
rounds (medians over rounds, rank 0's clock):
- full: `comm.all_reduce(x, out=out)` (or all_to_all, all_gather, broadcast from rank 0), the
  public call (planned after its first call);
- planned (all_reduce): the communicator's planned path alone (`_run_planned`), without the
  argument checks;
- schedule (all_to_all, all_gather, where the algorithm has one): the plan's copy and exchanges
  (`run_block_schedule`) on the communicator's channel, without the communicator;
- algorithm: the planned algorithm's function on the communicator's channel;
- MPI: mpi4py's `Allreduce` (`Alltoall`, `Allgather`, `Bcast`) on the same buffers.
`--bytes` is the per-rank buffer (all_gather: the output, as in colls bench).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import colls
from algorithms import SUM
from algorithms.blocks import run_block_schedule


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
    parser.add_argument("--collective", choices=("all_reduce", "all_to_all", "all_gather", "broadcast"),
                        default="all_reduce")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = colls.init()
    channel = comm._channel

    def aimed() -> None:
        channel.deadline = time.monotonic() + 60

    if args.collective == "all_reduce":
        x = np.zeros(max(1, args.bytes // 4), np.float32)   # zeros: sums stay exact call after call
        out, theirs = np.empty_like(x), np.empty_like(x)
        comm.all_reduce(x, out=out)   # the first call makes the plan the later ones take
        plan = comm._check.plans[(SUM, x.dtype, x.shape, None)]
        layers = {"full": lambda: comm.all_reduce(x, out=out),
                  "planned": lambda: comm._run_planned(plan, x, out, None),
                  "algorithm": lambda: (aimed(), plan.algorithm.run(channel, out, SUM)),
                  "MPI": lambda: world.Allreduce(x, theirs)}
    elif args.collective == "broadcast":
        x = np.ones(max(1, args.bytes // 4), np.float32)
        out = x if world.Get_rank() == 0 else np.empty_like(x)   # as colls bench: in place on the root
        comm.broadcast(x, root=0, out=out)
        plan = comm._check.broadcast_plans[(x.dtype, x.shape, 0, None)]
        flat = out.reshape(-1)
        layers = {"full": lambda: comm.broadcast(x, root=0, out=out),
                  "algorithm": lambda: (aimed(), plan.algorithm.run(channel, flat, 0)),
                  "MPI": lambda: world.Bcast(out, root=0)}
    else:
        size = world.Get_size()
        gather = args.collective == "all_gather"
        count = max(size, args.bytes // 4 // size * size)
        x = np.ones(count // size if gather else count, np.float32)
        out, theirs = np.empty(count, np.float32), np.empty(count, np.float32)
        call = getattr(comm, args.collective)
        call(x, out=out)
        plan = comm._check.block_plans.get((args.collective, x.dtype, x.shape, None))
        if plan is None:
            raise SystemExit(f"{args.collective} of this group is not planned (its algorithm builds levels "
                             f"across hosts): nothing to take apart")
        layers = {"full": lambda: call(x, out=out)}
        if plan.schedule is not None:
            layers["schedule"] = lambda: (aimed(), run_block_schedule(channel, x, out, plan.schedule))
        layers["algorithm"] = lambda: (aimed(), plan.algorithm.run(channel, x, out))
        layers["MPI"] = ((lambda: world.Allgather(x, theirs)) if gather else
                         (lambda: world.Alltoall(x, theirs)))
    times: dict[str, list[float]] = {name: [] for name in layers}
    for _ in range(15):
        for name, fn in layers.items():
            world.Barrier()
            times[name].append(per_call(fn, args.calls))
    if world.Get_rank() == 0:
        print(f"# {out.nbytes} B {args.collective} ({plan.algorithm.name}), {world.Get_size()} ranks over "
              f"{comm.transport.name}, medians of 15 rounds of {args.calls} calls")
        for name, values in times.items():
            print(f"{name:<10} {np.median(values) * 1e6:6.2f} us")
    comm.close()


if __name__ == "__main__":
    main()
