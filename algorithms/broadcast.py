"""broadcast: the root's buffer ends up on every rank."""

from __future__ import annotations

import numpy as np

from .allgather import ring_all_gather_phase
from .blocks import bounds, pieces
from .channel import Channel
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
            channel.exchange(None, None, buf, (rank - mask) % size)
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


@register("broadcast", "pipeline", "chain from the root, the buffer cut in pieces that flow down it")
def pipeline(channel: Channel, buf: np.ndarray, root: int) -> None:
    """Pipelined chain: time ~ S/B + (n-2)·piece/B, so long chains cost little for big buffers."""
    rank, size = channel.rank, channel.size
    relative = (rank - root) % size
    previous, following = (rank - 1) % size, (rank + 1) % size
    parts = [buf[start:stop] for start, stop in pieces(buf.shape[0], buf.itemsize)]
    # post every piece's receive up front, then forward each as soon as it lands
    arrivals = [channel.recv(part, previous) for part in parts] if relative else [None] * len(parts)
    sends = []
    for part, arrival in zip(parts, arrivals, strict=True):
        if arrival is not None:
            channel.wait(arrival)
        if relative + 1 < size:
            sends.append(channel.send(part, following))
    channel.wait(*sends)


@register("broadcast", "scatter_allgather",
          "the root scatters n blocks, then a ring all-gather (van de Geijn): 2S/B for big buffers")
def scatter_allgather(channel: Channel, buf: np.ndarray, root: int) -> None:
    """Scatter + all-gather broadcast (MPICH's long-message broadcast), any n and count."""
    rank, size = channel.rank, channel.size
    starts = bounds(buf.shape[0], size)
    if rank == root:
        # hand each rank its own block
        channel.wait(*[channel.send(buf[starts[peer]:starts[peer + 1]], peer)
                       for peer in range(size) if peer != root])
    else:
        channel.exchange(None, None, buf[starts[rank]:starts[rank + 1]], root)
    ring_all_gather_phase(channel, buf, starts)   # then pass the blocks around the ring


@register("broadcast", "direct", "the root sends the whole buffer to every rank itself")
def direct(channel: Channel, buf: np.ndarray, root: int) -> None:
    """Direct broadcast: (n-1)·S out of the root; the baseline the trees improve on."""
    if channel.rank == root:
        channel.wait(*[channel.send(buf, peer) for peer in range(channel.size) if peer != root])
    else:
        channel.exchange(None, None, buf, root)
