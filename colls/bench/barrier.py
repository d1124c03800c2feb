"""How long a rank waiting in MPI's barrier keeps its core: `mpiexec -n 2 python -m colls.bench.barrier`.

`colls bench` times every call after MPI's barrier, and a rank that has finished its call waits in
the next one. With more ranks than cores, how long that wait polls before it yields the core to a
rank still working is part of the slower ranks' time, and MPICH's wait is not colls' (`Backoff`).
Two ranks time back-to-back barriers pinned to one core (each barrier hands the core over once: the
rank that arrives first polls, yields, and the other runs), then each on a core of its own (no hand-
over). Rank 0 prints both medians as JSON: `colls tune --profile` runs this and takes the hand-over
less the free barrier and the wake-up as the barrier's hold (`barrier_hold_s`).
"""

from __future__ import annotations

import json
import os
import statistics
import time

BARRIERS = 2000
ROUNDS = 5


def per_barrier(world, cores: set[int]) -> float:
    """Median seconds per barrier over `ROUNDS` loops of `BARRIERS`, this process pinned to `cores`."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        for _ in range(200):
            world.Barrier()
        times = []
        for _ in range(ROUNDS):
            world.Barrier()
            start = time.perf_counter()
            for _ in range(BARRIERS):
                world.Barrier()
            times.append((time.perf_counter() - start) / BARRIERS)
        return statistics.median(times)
    finally:
        os.sched_setaffinity(0, allowed)


def main() -> int:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    allowed = sorted(os.sched_getaffinity(0))
    shared = per_barrier(world, {allowed[0]})
    free = per_barrier(world, {allowed[world.rank % len(allowed)]}) if len(allowed) > 1 else None
    shared = world.allreduce(shared, op=MPI.MAX)
    if free is not None:
        free = world.allreduce(free, op=MPI.MAX)
    if world.rank == 0:
        print(json.dumps({"one_core_s": shared, "two_cores_s": free}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
