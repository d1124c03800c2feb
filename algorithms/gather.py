"""gather and scatter: blocks to and from one root, in rank order."""

from __future__ import annotations

import numpy as np

from transports.base import Channel

from .registry import register


@register("gather", "direct", "every rank sends its block straight to the root")
def direct_gather(channel: Channel, send: np.ndarray, out: np.ndarray | None, root: int) -> None:
    """Direct gather; `out` (length size * len(send)) only on the root."""
    rank, size = channel.rank, channel.size
    if rank != root:
        channel.wait(channel.send(send, root))
        return
    assert out is not None
    block = send.shape[0]
    np.copyto(out[rank * block:(rank + 1) * block], send)
    # post every receive at once so the senders never queue behind each other
    channel.wait(*[channel.recv(out[peer * block:(peer + 1) * block], peer)
                   for peer in range(size) if peer != root])


@register("scatter", "direct", "the root sends each rank its block directly")
def direct_scatter(channel: Channel, send: np.ndarray | None, out: np.ndarray, root: int) -> None:
    """Direct scatter; `send` (length size * len(out)) only on the root."""
    rank, size = channel.rank, channel.size
    if rank != root:
        channel.wait(channel.recv(out, root))
        return
    assert send is not None
    block = out.shape[0]
    np.copyto(out, send[rank * block:(rank + 1) * block])
    channel.wait(*[channel.send(send[peer * block:(peer + 1) * block], peer)
                   for peer in range(size) if peer != root])
