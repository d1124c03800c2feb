"""all_gather: every rank ends with every rank's block, in rank order."""

from __future__ import annotations

import numpy as np

from transports.base import Channel

from .blocks import bounds
from .registry import register


def ring_all_gather_phase(channel: Channel, buf: np.ndarray, starts: list[int]) -> None:
    """In place: rank r starts holding block r of `buf`; after n-1 steps everyone holds all blocks."""
    rank, size = channel.rank, channel.size
    right, left = (rank + 1) % size, (rank - 1) % size
    for step in range(size - 1):
        send_block = (rank - step) % size
        recv_block = (rank - step - 1) % size
        # pass on the block received last step (my own first); take the next one from the left
        channel.exchange(buf[starts[send_block]:starts[send_block + 1]], right,
                         buf[starts[recv_block]:starts[recv_block + 1]], left)


@register("all_gather", "ring", "n-1 steps around the ring, each forwarding the block it last received")
def ring(channel: Channel, send: np.ndarray, out: np.ndarray) -> None:
    """Ring all-gather of equal blocks `send` into `out` (length size * len(send))."""
    starts = bounds(out.shape[0], channel.size)
    np.copyto(out[starts[channel.rank]:starts[channel.rank + 1]], send)
    ring_all_gather_phase(channel, out, starts)
