"""all_reduce: every rank ends with the reduction of everyone's buffer, bitwise identical."""

from __future__ import annotations

import numpy as np

from transports.base import Channel

from .allgather import ring_all_gather_phase
from .blocks import bounds
from .ops import Op
from .reduce_scatter import ring_reduce_scatter_phase
from .registry import register


@register("all_reduce", "ring",
          "reduce-scatter then all-gather around the ring; 2(n-1)/n of the buffer per rank",
          commutative_only=True)
def ring(channel: Channel, buf: np.ndarray, op: Op) -> None:
    """Ring all-reduce in place (Patarasuk & Yuan 2009; Baidu's ring): bandwidth-optimal.

    Each block is reduced by exactly one chain of ranks and then copied around, so every rank ends
    with the same bytes even for floats. Counts that don't divide by n give blocks one element apart.
    """
    if channel.size == 1:
        return
    starts = bounds(buf.shape[0], channel.size)
    ring_reduce_scatter_phase(channel, buf, starts, op)   # rank r now holds block r reduced
    ring_all_gather_phase(channel, buf, starts)           # and passes it around the ring
