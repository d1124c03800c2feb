"""Run the plugin's broadcast on every rank of a world and check it against numpy.

    colls run -n 3 --plugin examples/plugin/tree_broadcast.py examples/plugin/check_tree.py
    COLLS_PLUGINS=examples/plugin/tree_broadcast.py mpiexec -n 3 python examples/plugin/check_tree.py

An argument names another algorithm to check (default binary_tree), e.g. one an installed package
registers through the `colls.algorithms` entry points.
"""

from __future__ import annotations

import sys

import numpy as np

import colls

COUNTS = (0, 1, 7, 4097, 70001)   # empty, one element, under a piece, a short last piece, several


def main(name: str = "binary_tree") -> None:
    """Broadcast from every root at every count in `COUNTS`; raise on the first wrong element."""
    comm = colls.init()
    for count in COUNTS:
        for root in range(comm.size):
            want = np.arange(count, dtype=np.float64) * (root + 1)
            x = want.copy() if comm.rank == root else np.full(count, -1.0)
            got = comm.broadcast(x, root=root, algorithm=name)
            if not np.array_equal(got, want):
                raise AssertionError(f"rank {comm.rank}: {name} from root {root}, {count} elements: wrong")
    print(f"rank {comm.rank}: {name} right on {comm.transport.name} x{comm.size}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:2])
