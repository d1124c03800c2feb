"""colls beside MPI, sorted by how fast the machine's two cores reach each other's caches at the time.

Run: COLLS_TRANSPORT=shm mpiexec -n 2 python bench/machine_modes.py [--seconds 60]
     [--case all_to_all:1M --case all_gather:1M --case all_reduce:8]

Why: on a virtual machine the hypervisor moves the guest's CPUs between host cores. How long one
core takes to see a line the other wrote then changes, by 2x and more, and stays so for seconds to
minutes (a cache-line round trip of a few hundred ns for minutes, then two or three times that).
Every copy between the ranks pays for it, and not every
implementation alike: a benchmark run is a mixture of modes in unknown shares, and two runs a minute
apart disagree. This script samples the mode around every measurement and reports each mode apart.

Each sample: ranks 0 and 1 bounce a cache line 2000 times (`colls.bench.machine.CoreLink`, the
round trip `colls bench` records around each point; rank 0 times it), then every case runs 10
calls of colls and 10 of MPI's native collective on the same buffers (each after a barrier, the
slower rank's time), then the line is bounced again. A sample whose two round trips differ by
more than 15% straddled a change of mode and is left out. Per mode: the
median over samples of each side's median call, and colls' speed relative to MPI (MPI time / colls
time: above 1, colls is faster).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import colls
from colls.bench.baselines import Prepared
from colls.bench.machine import CoreLink
from colls.bench.runner import timed

MODES = ((0, 450), (450, 700), (700, 10**6))   # round-trip bands in ns (fast, slow, slower)
UNITS = {"K": 1 << 10, "M": 1 << 20}


def size_of(text: str) -> int:
    """'8', '64K', '1M' -> bytes."""
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def calls(comm, world, collective: str, nbytes: int) -> tuple:
    """(colls call, MPI call) for `collective` of `nbytes` (the output's size for all_gather)."""
    size = world.Get_size()
    if collective == "all_reduce":
        x, out = np.zeros(max(1, nbytes // 4), np.float32), np.zeros(max(1, nbytes // 4), np.float32)
        return (lambda: comm.all_reduce(x, out=out)), (lambda: world.Allreduce(x, out))
    if collective == "all_to_all":
        x, out = np.ones(nbytes // 4, np.float32), np.zeros(nbytes // 4, np.float32)
        return (lambda: comm.all_to_all(x, out=out)), (lambda: world.Alltoall(x, out))
    if collective == "all_gather":
        x, out = np.ones(nbytes // 4 // size, np.float32), np.zeros(nbytes // 4, np.float32)
        return (lambda: comm.all_gather(x, out=out)), (lambda: world.Allgather(x, out))
    if collective == "broadcast":
        x = np.ones(nbytes // 4, np.float32)
        return (lambda: comm.broadcast(x, root=0, out=x)), (lambda: world.Bcast(x, root=0))
    raise SystemExit(f"machine_modes: no case for {collective}")


def median_call(world, call, count: int = 10) -> float:
    """Median seconds of `count` calls, each after a barrier, the slower rank's (`colls bench`'s timing)."""
    return float(np.median(timed(world, Prepared(call, None), count)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--case", action="append", help="collective:size, e.g. all_to_all:1M (repeatable)")
    args = parser.parse_args()
    cases = [case.split(":") for case in (args.case or ["all_to_all:1M", "all_gather:1M", "all_reduce:8"])]
    world = MPI.COMM_WORLD
    comm = colls.init()
    line = CoreLink.open(world.rank, world.Get_size(), lambda value: world.bcast(value, root=0),
                         world.Barrier)
    if line is None:
        raise SystemExit("machine_modes: needs 2 ranks and a CPU for each")
    prepared = [(name, size_of(size), *calls(comm, world, name, size_of(size))) for name, size in cases]
    for *_, ours, theirs in prepared:   # first calls: plans made, pages touched
        ours()
        theirs()
    samples = []
    end = time.monotonic() + args.seconds
    while not world.bcast(time.monotonic() > end, root=0):
        before = line.round_trip_ns()
        row = [median_call(world, call) for *_, ours, theirs in prepared for call in (ours, theirs)]
        after = line.round_trip_ns()
        if before is not None and after is not None:   # None: the line went unanswered for a second
            samples.append((before, after, *row))
    line.close()
    comm.close()
    if world.rank != 0:
        return
    table = np.array(samples)
    steady = table[np.abs(table[:, 0] - table[:, 1]) <= 0.15 * table[:, 0]]
    print(f"`COLLS_TRANSPORT={comm.transport.name} mpiexec -n {world.Get_size()} python "
          f"bench/machine_modes.py --seconds {args.seconds:g}`: {len(table)} samples, {len(steady)} in one "
          f"mode throughout\n")
    heads = [f"{name} {size} B: colls / MPI" for name, size, *_ in prepared]
    print("| round trip | samples | " + " | ".join(heads) + " |")
    print("| --- | ---: |" + " --- |" * len(prepared))
    for low, high in MODES:
        band = steady[(steady[:, 0] >= low) & (steady[:, 0] < high)]
        if not len(band):
            continue
        cells = []
        for k in range(len(prepared)):
            ours, theirs = np.median(band[:, 2 + 2 * k]), np.median(band[:, 3 + 2 * k])
            cells.append(f"{ours * 1e6:.1f} / {theirs * 1e6:.1f} us ({theirs / ours:.2f}x)")
        label = f"{low}-{high} ns" if high < 10**6 else f">= {low} ns"
        print(f"| {label} (median {np.median(band[:, 0]):.0f}) | {len(band)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
