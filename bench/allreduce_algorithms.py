"""Every all_reduce algorithm timed on the same ranks and buffers: the table for the catalogue note.

Run: colls run -n 2 bench/allreduce_algorithms.py [--sizes 8,1048576,16777216] [--iters 20]
Prints, per algorithm and size, the median over iterations of the slowest rank's time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import colls


def median_seconds(comm, x, out, algorithm: str, iters: int) -> float:
    """Median of the slowest rank's time for one call (ranks start together after a barrier)."""
    times = np.empty(iters)
    for i in range(iters):
        comm.barrier()
        start = time.perf_counter()
        comm.all_reduce(x, out=out, algorithm=algorithm)
        times[i] = time.perf_counter() - start
    slowest = comm.all_reduce(times, op=colls.MAX, algorithm="recursive_doubling")
    return float(np.median(slowest))


def _seconds(t: float) -> str:
    return f"{t * 1e6:.0f} us" if t < 1e-2 else f"{t * 1e3:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="8,1048576,16777216")
    parser.add_argument("--iters", type=int, default=20)
    options = parser.parse_args()
    comm = colls.init()
    sizes = [int(s) for s in options.sizes.split(",")]
    rows = {}
    for name in colls.algorithms("all_reduce"):
        for nbytes in sizes:
            x = np.ones(max(1, nbytes // 4), np.float32)
            out = np.empty_like(x)
            for _ in range(3):
                comm.all_reduce(x, out=out, algorithm=name)
            assert np.all(out == comm.size), name
            rows[name, nbytes] = median_seconds(comm, x, out, name, options.iters)
    if comm.rank == 0:
        print(f"# all_reduce float32 SUM over {comm.transport.name}, {comm.size} ranks, "
              f"median of {options.iters} (slowest rank)")
        print("| algorithm | " + " | ".join(f"{n} B" for n in sizes) + " |")
        print("| --- |" + " --- |" * len(sizes))
        for name in colls.algorithms("all_reduce"):
            cells = [_seconds(rows[name, n]) for n in sizes]
            print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
