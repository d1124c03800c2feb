"""barrier: no rank leaves before every rank has arrived."""

from __future__ import annotations

import numpy as np

from .channel import Channel
from .registry import register


@register("barrier", "dissemination", "ceil(log2 n) rounds; in round k rank r signals r + 2^k")
def dissemination(channel: Channel) -> None:
    """Dissemination barrier (Hensgen, Finkel & Manber 1988): works for any n, no root."""
    rank, size = channel.rank, channel.size
    token_out = np.zeros(1, np.uint8)
    token_in = np.zeros(1, np.uint8)
    distance = 1
    while distance < size:
        # tell the rank `distance` ahead that I (and all I have heard from) arrived
        channel.exchange(token_out, (rank + distance) % size, token_in, (rank - distance) % size)
        distance <<= 1
