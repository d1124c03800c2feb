"""reduce_scatter: every rank ends with the reduction of its own block of everyone's buffer."""

from __future__ import annotations

import numpy as np

from transports.base import Channel

from .blocks import bounds
from .ops import Op
from .registry import register


def ring_reduce_scatter_phase(channel: Channel, buf: np.ndarray, starts: list[int], op: Op) -> None:
    """In place: after n-1 steps rank r holds the full reduction of block r of `buf` (Baidu ring).

    Block j starts at rank j+1 and travels right, each rank folding in its own contribution, so it
    arrives complete at rank j after n-1 hops; every rank sends and receives (n-1)/n of the buffer.
    """
    rank, size = channel.rank, channel.size
    right, left = (rank + 1) % size, (rank - 1) % size
    for step in range(size - 1):
        send_block = (rank - step - 1) % size
        recv_block = (rank - step - 2) % size
        outgoing = buf[starts[send_block]:starts[send_block + 1]]
        incoming = buf[starts[recv_block]:starts[recv_block + 1]]
        # send my partial of one block to the right; fold the left's partial of the next into mine
        channel.wait(channel.send(outgoing, right), channel.recv_reduce(incoming, left, op.into_left))


@register("reduce_scatter", "ring", "n-1 steps around the ring; each rank sends (n-1)/n of the buffer",
          commutative_only=True)
def ring(channel: Channel, work: np.ndarray, out: np.ndarray, op: Op) -> None:
    """Ring reduce-scatter on `work` (clobbered); rank r's block lands in `out`."""
    starts = bounds(work.shape[0], channel.size)
    ring_reduce_scatter_phase(channel, work, starts, op)
    np.copyto(out, work[starts[channel.rank]:starts[channel.rank + 1]])
