"""A pipelined binary-tree broadcast: a schedule colls does not ship, written as a plugin.

colls' catalogue broadcasts down a binomial tree (log n rounds, the whole buffer each) or a
pipelined chain (the buffer in pieces, n - 1 hops deep). This one crosses them, as MPICH's and
NCCL's tree broadcasts do: the ranks form a binary tree (relative rank r has children 2r + 1 and
2r + 2, heap order, the root at 0), and the buffer flows down it in pieces, each rank forwarding a
piece to its two children as soon as it lands. Depth log2 n, and every link busy at once once the
pipeline fills: time ~ (log2 n + pieces - 1) * 2 * (alpha + piece * beta).

Load it with `--plugin examples/plugin/tree_broadcast.py` (colls run, fuzz, bench, plan), or
COLLS_PLUGINS=examples/plugin/tree_broadcast.py in a script's environment; then
`comm.broadcast(x, root=r, algorithm="binary_tree")`. `--plugin
examples/plugin/tree_broadcast.py:planted-bug` plants the bug docs/plugins.md has the fuzzer find.
"""

from __future__ import annotations

import math

import colls

MIN_PIECE_BYTES = 16 << 10   # a piece is at least this big (smaller ones pay alpha for little) ...
MAX_PIECES = 64              # ... and a buffer is cut in at most this many
PLANTED_BUG = False          # `setup("planted-bug")`: count the pieces wrongly (see `piece_bounds`)


def setup(argument: str) -> None:
    """`--plugin tree_broadcast.py:planted-bug`: plant the tutorial's bug.

    Args:
        argument: "planted-bug".

    Raises:
        ValueError: any other argument.
    """
    global PLANTED_BUG
    if argument != "planted-bug":
        raise ValueError(f"tree_broadcast: unknown argument {argument!r}; the one known is planted-bug")
    PLANTED_BUG = True


def piece_bounds(count: int, itemsize: int) -> list[tuple[int, int]]:
    """(start, stop) of each piece of a `count`-element buffer; none if it is empty."""
    step = max(1, MIN_PIECE_BYTES // itemsize, -(-count // MAX_PIECES))
    if PLANTED_BUG:
        number = max(1, count // step)   # BUG: rounds down, so a short last piece is never sent
    else:
        number = -(-count // step)       # rounds up: the last piece may be short
    return [(index * step, min((index + 1) * step, count)) for index in range(number)]


def tree_cost(size: int, nbytes: float, machine) -> float:
    """The textbook alpha-beta time: the pipeline fills in depth steps, then one piece per step,
    and each step sends a piece to two children one after the other."""
    if size == 1:
        return 0.0
    depth = int(math.log2(size))   # levels below the root in heap order
    pieces = max(1, len(piece_bounds(int(nbytes), 1)))
    piece = nbytes / pieces
    return (depth + pieces - 1) * 2 * (machine.alpha + piece * machine.beta)


@colls.algorithm("broadcast", "binary_tree",
                 summary="pipelined binary tree: pieces flow down a heap-ordered tree, "
                         "each rank feeding two children",
                 cost=tree_cost)
def binary_tree(channel, buf, root: int) -> None:
    """Broadcast the root's `buf` in place to every rank: receive each piece from my parent, and
    forward it to my children as soon as it lands."""
    rank, size = channel.rank, channel.size
    relative = (rank - root) % size

    def absolute(relative_rank: int) -> int:
        return (relative_rank + root) % size

    parent = absolute((relative - 1) // 2) if relative else None
    children = [absolute(child) for child in (2 * relative + 1, 2 * relative + 2) if child < size]
    parts = [buf[start:stop] for start, stop in piece_bounds(buf.shape[0], buf.itemsize)]
    # post every piece's receive up front, so that a piece can land while I forward the last one
    arrivals = [channel.recv(part, parent) for part in parts] if parent is not None else []
    sends = []
    for index, part in enumerate(parts):
        if arrivals:
            channel.wait(arrivals[index])   # piece `index` is here
        sends += [channel.send(part, child) for child in children]   # and goes on down the tree
    channel.wait(*sends)
