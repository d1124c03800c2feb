"""gather and scatter: blocks to and from one root, in rank order."""

from __future__ import annotations

import numpy as np

from .channel import Channel
from .registry import register


def _subtree(relative: int, size: int) -> int:
    """Blocks in the binomial subtree of relative rank `relative`: its lowest set bit, capped at n."""
    return min(relative & -relative, size - relative) if relative else size


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


@register("gather", "binomial", "binomial tree toward the root: ceil(log2 n) rounds, subtrees merging")
def binomial_gather(channel: Channel, send: np.ndarray, out: np.ndarray | None, root: int) -> None:
    """Binomial-tree gather (Thakur, Rabenseifner & Gropp 2005, section 3.3; MPICH's gather).

    Relative rank v = r - root collects the blocks of v .. v+subtree-1 in a temporary, in that order,
    from the children v + 2^k, then sends them in one message to v - lowbit(v). On the root the
    temporary is the result rotated by the root, so it is turned back into rank order at the end.
    """
    rank, size = channel.rank, channel.size
    block = send.shape[0]
    relative = (rank - root) % size
    subtree = _subtree(relative, size)
    if subtree == 1 and relative:
        channel.wait(channel.send(send, (rank - (relative & -relative)) % size))   # a leaf: my block only
        return
    collected = out if rank == root == 0 else np.empty_like(send, shape=(subtree * block,))
    np.copyto(collected[:block], send)
    receives, mask = [], 1
    while mask < subtree:
        # the child v + 2^k sends its whole subtree, which follows the ones before it in relative order
        count = _subtree(relative + mask, size)
        receives.append(channel.recv(collected[mask * block:(mask + count) * block], (rank + mask) % size))
        mask <<= 1
    channel.wait(*receives)
    if relative:
        # my subtree, in one message, to the parent that differs from me in my lowest set bit
        channel.wait(channel.send(collected, (rank - (relative & -relative)) % size))
    elif root:
        assert out is not None
        # relative block j is rank root+j's
        split = (size - root) * block
        np.copyto(out[root * block:], collected[:split])
        np.copyto(out[:root * block], collected[split:])


@register("scatter", "direct", "the root sends each rank its block directly")
def direct_scatter(channel: Channel, send: np.ndarray | None, out: np.ndarray, root: int) -> None:
    """Direct scatter; `send` (length size * len(out)) only on the root."""
    rank, size = channel.rank, channel.size
    if rank != root:
        channel.exchange(None, None, out, root)
        return
    assert send is not None
    block = out.shape[0]
    np.copyto(out, send[rank * block:(rank + 1) * block])
    channel.wait(*[channel.send(send[peer * block:(peer + 1) * block], peer)
                   for peer in range(size) if peer != root])


@register("scatter", "binomial", "binomial tree from the root: ceil(log2 n) rounds, subtrees splitting")
def binomial_scatter(channel: Channel, send: np.ndarray | None, out: np.ndarray, root: int) -> None:
    """Binomial-tree scatter (Thakur, Rabenseifner & Gropp 2005, section 3.3; MPICH's scatter).

    The mirror of the binomial gather: relative rank v receives the blocks of its whole subtree in
    one message, keeps the first and hands each child v + 2^k its part, largest subtree first.
    """
    rank, size = channel.rank, channel.size
    block = out.shape[0]
    relative = (rank - root) % size
    subtree = _subtree(relative, size)
    if relative == 0:
        assert send is not None
        held = send
        if root:
            # rotate down by the root, so that relative block j (rank root+j's) sits at j
            held = np.empty_like(send)
            split = (size - root) * block
            np.copyto(held[:split], send[root * block:])
            np.copyto(held[split:], send[:root * block])
    else:
        held = out if subtree == 1 else np.empty_like(out, shape=(subtree * block,))
        # my subtree's blocks, in one message, from the parent that differs from me in my lowest set bit
        channel.exchange(None, None, held, (rank - (relative & -relative)) % size)
    sends, mask = [], 1 << (subtree - 1).bit_length()
    while mask > 1:
        mask >>= 1
        if mask < subtree:
            # child v + 2^k gets the run of blocks of its own subtree
            count = _subtree(relative + mask, size)
            sends.append(channel.send(held[mask * block:(mask + count) * block], (rank + mask) % size))
    channel.wait(*sends)
    if held is not out:
        np.copyto(out, held[:block])
