"""all_to_all and all_to_all_v: block i of every rank's buffer goes to rank i."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .allreduce import recursive_doubling
from .blocks import Schedule, Step, run_schedule
from .channel import Channel
from .ops import MAX
from .registry import register


def _equal_blocks(send: np.ndarray, size: int) -> tuple[list[int], list[int]]:
    """(counts, starts) of `size` equal blocks of `send`."""
    block = send.shape[0] // size
    return [block] * size, [block * i for i in range(size)]


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


@register("all_to_all_v", "direct", "post every send and receive at once, then wait for them all")
def direct_v(channel: Channel, send: np.ndarray, send_counts: list[int], send_starts: list[int],
             out: np.ndarray, recv_counts: list[int], recv_starts: list[int]) -> None:
    """Direct exchange of variable blocks (MPICH's medium-message all-to-all): one round, n-1 pairs.

    Receives go up first so that no send waits for a matching receive; peers are taken in the order
    r+1, r+2, ... so that the ranks don't all start on rank 0.
    """
    rank, size = channel.rank, channel.size
    np.copyto(out[recv_starts[rank]:recv_starts[rank] + recv_counts[rank]],
              send[send_starts[rank]:send_starts[rank] + send_counts[rank]])
    peers = [(rank + step) % size for step in range(1, size)]
    # every incoming block straight into its place in `out`
    receives = [channel.recv(out[recv_starts[src]:recv_starts[src] + recv_counts[src]], src)
                for src in peers]
    # every outgoing block straight from its place in `send`
    sends = [channel.send(send[send_starts[dst]:send_starts[dst] + send_counts[dst]], dst)
             for dst in peers]
    channel.wait(*receives, *sends)


@lru_cache(maxsize=1024)
def pairwise_schedule(rank: int, size: int, count: int, op: object = None) -> Schedule:
    """`pairwise_v`'s schedule for equal blocks of a `count`-element send buffer."""
    block = count // size

    def of(peer: int) -> slice:
        return slice(peer * block, (peer + 1) * block)

    pairs = [((rank + step) % size, (rank - step) % size) for step in range(1, size)]
    return Schedule(of(rank), of(rank), tuple(Step(dst, False, of(dst), src, of(src)) for dst, src in pairs))


@register("all_to_all", "pairwise",
          "n-1 steps; in step s rank r sends to r+s and receives from r-s, one pair at a time",
          schedule=pairwise_schedule)
def pairwise(channel: Channel, send: np.ndarray, out: np.ndarray) -> None:
    """Pairwise exchange of equal blocks (`pairwise_v` with every count equal)."""
    run_schedule(channel, send, out, pairwise_schedule(channel.rank, channel.size, send.shape[0]))


@register("all_to_all", "direct", "post every send and receive at once, then wait for them all")
def direct(channel: Channel, send: np.ndarray, out: np.ndarray) -> None:
    """Direct exchange of equal blocks."""
    counts, starts = _equal_blocks(send, channel.size)
    direct_v(channel, send, counts, starts, out, counts, starts)


@lru_cache(maxsize=256)
def bruck_schedule(rank: int, size: int) -> tuple[tuple[tuple[int, int, np.ndarray], ...], np.ndarray, int]:
    """`bruck`'s schedule for one rank, worked out once per (rank, size): per step (destination,
    source, the blocks it forwards, as indices into the unrotated working copy); the order in which
    `out` takes the working copy's blocks at the end; the most blocks any step forwards."""
    steps = []
    distance = 1
    while distance < size:
        # relative block j is bound for rank r+j and sits at (r + j) % size of the working copy
        forwarded = (rank + np.flatnonzero(np.arange(size) & distance)) % size
        steps.append(((rank + distance) % size, (rank - distance) % size, forwarded))
        distance <<= 1
    # relative block j ends up holding what rank r-j sent me; out's block i is relative block r-i
    gather = (2 * rank - np.arange(size)) % size
    for indices in (gather, *(blocks for _, _, blocks in steps)):
        indices.flags.writeable = False   # shared by every call (and thread) of this rank and size
    return tuple(steps), gather, max((len(blocks) for _, _, blocks in steps), default=0)


@register("all_to_all", "bruck",
          "ceil(log2 n) steps for small blocks: step k forwards every block whose index has bit k set")
def bruck(channel: Channel, send: np.ndarray, out: np.ndarray) -> None:
    """Bruck's index algorithm (Bruck et al. 1997; Thakur, Rabenseifner & Gropp 2005, section 3.5).

    The block bound j ranks on moves 2^k for each bit k set in j. Each step packs those blocks into
    one message: fewer messages (log n, not n-1) at the cost of sending each block up to log n times
    and copying. The blocks stay where `send` has them (no rotation: the schedule's indices are
    this rank's), and one scratch buffer holds the working copy and every step's packed messages:
    for small blocks the indices, rotations and fresh buffers of each call cost more than the
    messages themselves.
    """
    size = channel.size
    block = send.shape[0] // size
    steps, gather, most = bruck_schedule(channel.rank, size)
    scratch = np.empty_like(send, shape=(size + 2 * most, block))   # numpy or cupy, as `send`
    work, packed, landed = scratch[:size], scratch[size:size + most], scratch[size + most:]
    np.copyto(work, send.reshape(size, block))
    # numpy's take buffers `out` unless told the indices need no check (mode="clip" spares that
    # copy, a third to a half of the take); cupy's takes no mode
    clip = {"mode": "clip"} if type(work) is np.ndarray else {}
    for dst, src, forwarded in steps:
        outgoing, incoming = packed[:forwarded.shape[0]], landed[:forwarded.shape[0]]
        np.take(work, forwarded, axis=0, out=outgoing, **clip)
        channel.exchange(outgoing.reshape(-1), dst, incoming.reshape(-1), src)
        work[forwarded] = incoming
    np.take(work, gather, axis=0, out=out.reshape(size, block), **clip)


@register("all_to_all_v", "bruck",
          "pad every block to the largest count anywhere (one small all-reduce), then Bruck's log n steps")
def bruck_v(channel: Channel, send: np.ndarray, send_counts: list[int], send_starts: list[int],
            out: np.ndarray, recv_counts: list[int], recv_starts: list[int]) -> None:
    """Bruck for variable blocks: worth it only when blocks are small and about the same size.

    Bruck's schedule forwards blocks through intermediate ranks, which then must know their sizes;
    padding every block to the group-wide largest count keeps the schedule static (MPICH keeps
    Bruck for uniform blocks for the same reason). The padding is sent; the byte counters show it.
    """
    size = channel.size
    largest = np.array([max(send_counts + recv_counts)], np.int64)
    recursive_doubling(channel, largest, MAX)            # the largest block of any pair, everywhere
    block = int(largest[0])
    padded = np.zeros_like(send, shape=(size, block))
    for peer in range(size):
        padded[peer, :send_counts[peer]] = send[send_starts[peer]:send_starts[peer] + send_counts[peer]]
    landed = np.empty_like(padded)
    bruck(channel, padded.reshape(-1), landed.reshape(-1))
    for peer in range(size):                             # drop the padding again
        out[recv_starts[peer]:recv_starts[peer] + recv_counts[peer]] = landed[peer, :recv_counts[peer]]
