"""reduce: the root ends with the reduction of everyone's buffer."""

from __future__ import annotations

import numpy as np

from .blocks import bounds
from .channel import Channel
from .ops import Op
from .reduce_scatter import ring_reduce_scatter_phase
from .registry import register


@register("reduce", "binomial", "binomial tree toward rank 0 in rank order, then to the root")
def binomial(channel: Channel, buf: np.ndarray, op: Op, root: int) -> None:
    """Binomial-tree reduce; `buf` is clobbered everywhere and holds the result on `root`.

    The tree is built on real ranks, not ranks relative to the root, so that rank r always holds
    the reduction of the contiguous range [r, r + 2^k): that keeps rank order for non-commutative
    operators. A root other than 0 costs one extra message from rank 0.
    """
    rank, size = channel.rank, channel.size
    mask = 1
    while mask < size:
        if rank & mask:
            # my range is complete: hand it to the rank that owns the range just below mine
            channel.wait(channel.send(buf, rank - mask))
            break
        if rank + mask < size:
            # fold in the range [rank + mask, rank + 2 mask), which comes after mine in rank order
            channel.exchange(None, None, buf, rank + mask, op.into_left)
        mask <<= 1
    if root != 0:
        if rank == 0:
            channel.wait(channel.send(buf, root))
        elif rank == root:
            channel.exchange(None, None, buf, 0)


@register("reduce", "direct", "every rank sends to the root, which folds them in rank order")
def direct(channel: Channel, buf: np.ndarray, op: Op, root: int) -> None:
    """Direct reduce: (n-1) buffers into the root, folded one after another in rank order."""
    rank, size = channel.rank, channel.size
    if rank != root:
        channel.wait(channel.send(buf, root))
        return
    # lower ranks go on the left of what I hold, higher ranks on the right
    for peer in list(range(root - 1, -1, -1)) + list(range(root + 1, size)):
        channel.exchange(None, None, buf, peer, op.into_right if peer < root else op.into_left)


@register("reduce", "ring", "ring reduce-scatter, then every rank sends its reduced block to the root",
          commutative_only=True)
def ring(channel: Channel, buf: np.ndarray, op: Op, root: int) -> None:
    """Reduce as reduce-scatter + gather (Rabenseifner's long-message reduce, with a ring)."""
    rank, size = channel.rank, channel.size
    if size == 1:
        return
    starts = bounds(buf.shape[0], size)
    ring_reduce_scatter_phase(channel, buf, starts, op)   # rank r holds block r reduced
    if rank != root:
        channel.wait(channel.send(buf[starts[rank]:starts[rank + 1]], root))
    else:
        # collect every other block straight into place
        channel.wait(*[channel.recv(buf[starts[peer]:starts[peer + 1]], peer)
                       for peer in range(size) if peer != root])
