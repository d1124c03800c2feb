"""all_reduce ring, Rabenseifner and the segmented ring at several segment sizes, beside MPI's, interleaved.

Run: mpiexec -n 4 python bench/segments.py [--sizes 1M,2M,4M,8M] [--segments 512K,1M,2M] [--rounds 40]

Each round times one call of every variant at every size, the variants in a rotating order, each
after MPI's barrier; a burst of load so falls on all of them. Printed per size: the median over
rounds of the slowest rank's time, and MPI's time over each variant's (above 1, faster than MPI).
`ring_segmented` cuts segments of n 256 KiB blocks (`algorithms.blocks.segment_bytes`); this
probe runs the same ring over other segment sizes, to show why that size.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import colls
from algorithms import SUM
from algorithms.allreduce import rabenseifner, ring
from algorithms.blocks import pieces
from colls.bench.spec import parse_size


def segmented(segment: int):
    """The ring over `segment`-byte segments in turn, as `ring_segmented` with another size."""
    def run(channel, buf, source):
        for start, stop in pieces(buf.shape[0], buf.itemsize, segment):
            ring(channel, buf[start:stop], SUM, source[start:stop])
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,2M,4M,8M,16M")
    parser.add_argument("--segments", default="512K,1M,2M")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = colls.init("shm")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    variants = {"ring": lambda ch, buf, source: ring(ch, buf, SUM, source),
                "rabenseifner": lambda ch, buf, source: rabenseifner(ch, buf, SUM, source)}
    for text in args.segments.split(","):
        variants[f"seg {text}"] = segmented(parse_size(text))
    names = [*variants, "MPI"]
    times = {(name, nbytes): np.empty(args.rounds) for name in names for nbytes in sizes}
    buffers = {nbytes: (np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32))
               for nbytes in sizes}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for nbytes in sizes:
            x, out = buffers[nbytes]
            for name in order:
                channel = None if name == "MPI" else comm.channel("segments probe", timeout=60)
                world.Barrier()
                start = time.perf_counter()
                if channel is None:
                    world.Allreduce(x, out)
                else:
                    variants[name](channel, out, x)
                times[(name, nbytes)][r] = time.perf_counter() - start
                assert out[0] == world.Get_size(), f"{name} at {nbytes} B: wrong result {out[0]}"
    for series in times.values():
        world.Allreduce(MPI.IN_PLACE, series, op=MPI.MAX)
    if comm.rank == 0:
        print(f"# {comm.size} ranks, medians of {args.rounds} rounds (us); MPI / variant in brackets")
        print(f"{'size':>8} " + " ".join(f"{name:>20}" for name in names))
        for nbytes in sizes:
            median = {name: float(np.median(times[(name, nbytes)])) * 1e6 for name in names}
            cells = [f"{median[n]:9.0f} ({median['MPI'] / median[n]:4.2f}x)" for n in names[:-1]]
            print(f"{nbytes >> 10:>7}K " + " ".join(f"{c:>20}" for c in cells) + f" {median['MPI']:20.0f}")


if __name__ == "__main__":
    main()
