"""all_to_all and all_to_all_v: block i of every rank's buffer goes to rank i."""

from __future__ import annotations

import numpy as np

from transports.base import Channel

from .registry import register


@register("all_to_all_v", "pairwise",
          "n-1 steps; in step s rank r sends to r+s and receives from r-s, one pair at a time")
def pairwise_v(channel: Channel, send: np.ndarray, send_counts: list[int], send_starts: list[int],
               out: np.ndarray, recv_counts: list[int], recv_starts: list[int]) -> None:
    """Pairwise exchange of variable blocks (MPICH's long-message all-to-all)."""
    rank, size = channel.rank, channel.size
    mine = send[send_starts[rank]:send_starts[rank] + send_counts[rank]]
    np.copyto(out[recv_starts[rank]:recv_starts[rank] + recv_counts[rank]], mine)
    for step in range(1, size):
        dst, src = (rank + step) % size, (rank - step) % size
        # one partner out, one partner in: every link busy, no rank flooded
        channel.exchange(send[send_starts[dst]:send_starts[dst] + send_counts[dst]], dst,
                         out[recv_starts[src]:recv_starts[src] + recv_counts[src]], src)


@register("all_to_all", "pairwise",
          "n-1 steps; in step s rank r sends to r+s and receives from r-s, one pair at a time")
def pairwise(channel: Channel, send: np.ndarray, out: np.ndarray) -> None:
    """Pairwise exchange of equal blocks."""
    size = channel.size
    block = send.shape[0] // size
    counts = [block] * size
    starts = [block * i for i in range(size)]
    pairwise_v(channel, send, counts, starts, out, counts, starts)
