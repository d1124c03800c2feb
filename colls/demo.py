"""A first all-reduce: `colls run -n 4 -m colls.demo` (or `mpiexec -n 4 python -m colls.demo`).

Every rank contributes arange(8) * (rank + 1); the sum over ranks is arange(8) * size(size+1)/2,
which each rank checks exactly (int64, so no rounding can hide a wrong answer).
"""

from __future__ import annotations

import sys
import time

import numpy as np

import colls


def expected_sum(size: int, count: int = 8) -> np.ndarray:
    """What all_reduce(SUM) of arange(count) * (rank + 1) over `size` ranks must give."""
    return np.arange(count, dtype=np.int64) * (size * (size + 1) // 2)


def main() -> int:
    """All-reduce one small array, print one line saying what happened, return 0 if it was right."""
    comm = colls.init()
    contribution = np.arange(8, dtype=np.int64) * (comm.rank + 1)
    start = time.perf_counter()
    result = comm.all_reduce(contribution, op=colls.SUM)
    elapsed = time.perf_counter() - start
    correct = np.array_equal(result, expected_sum(comm.size))
    verdict = "correct" if correct else f"WRONG, expected {expected_sum(comm.size).tolist()}"
    print(f"rank {comm.rank} of {comm.size} over {comm.transport.name}: "
          f"all_reduce(arange(8) * {comm.rank + 1}) = {np.asarray(result).tolist()} "
          f"in {elapsed * 1e3:.3f} ms, {verdict}")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
