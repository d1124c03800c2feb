"""reduce: the root ends with the reduction of everyone's buffer."""

from __future__ import annotations

import numpy as np

from transports.base import Channel

from .ops import Op
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
            channel.wait(channel.recv_reduce(buf, rank + mask, op.into_left))
        mask <<= 1
    if root != 0:
        if rank == 0:
            channel.wait(channel.send(buf, root))
        elif rank == root:
            channel.wait(channel.recv(buf, 0))
