"""broadcast: the root's buffer ends up on every rank."""

from __future__ import annotations

import numpy as np

from transports.base import Channel

from .registry import register


@register("broadcast", "binomial", "binomial tree: ceil(log2 n) rounds, the holders doubling each round")
def binomial(channel: Channel, buf: np.ndarray, root: int) -> None:
    """Binomial-tree broadcast in place (MPICH's short-message broadcast)."""
    rank, size = channel.rank, channel.size
    relative = (rank - root) % size
    mask = 1
    # receive once, from the rank that differs from me in my lowest set bit
    while mask < size:
        if relative & mask:
            channel.wait(channel.recv(buf, (rank - mask) % size))
            break
        mask <<= 1
    # then send to the ranks below that bit, farthest first so the tree fills fastest
    mask >>= 1
    sends = []
    while mask > 0:
        if relative + mask < size:
            sends.append(channel.send(buf, (rank + mask) % size))
        mask >>= 1
    channel.wait(*sends)
