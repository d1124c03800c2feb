"""all_gather: every rank ends with every rank's block, in rank order.

Every schedule here receives exactly the (n-1) blocks a rank lacks, never one twice, so each rank
receives (n-1)/n of the output; they differ in how many steps that takes (latency) and who sends.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .blocks import Schedule, Step, bounds, run_schedule
from .channel import Channel
from .registry import register


@lru_cache(maxsize=1024)
def ring_steps(rank: int, size: int, starts: tuple[int, ...]) -> tuple[Step, ...]:
    """The ring's n-1 steps in place on blocks `starts` of `out`, rank r starting with block r."""
    right, left = (rank + 1) % size, (rank - 1) % size

    def block(index: int) -> slice:
        return slice(starts[index % size], starts[index % size + 1])

    # step s: pass on the block received last step (my own first); take the next one from the left
    return tuple(Step(right, True, block(rank - step), left, block(rank - step - 1))
                 for step in range(size - 1))


def ring_all_gather_phase(channel: Channel, buf: np.ndarray, starts: list[int]) -> None:
    """In place: rank r starts holding block r of `buf`; after n-1 steps everyone holds all blocks."""
    steps = ring_steps(channel.rank, channel.size, tuple(starts))
    run_schedule(channel, buf, buf, Schedule(None, None, steps))


@lru_cache(maxsize=1024)
def ring_schedule(rank: int, size: int, count: int, op: object = None) -> Schedule:
    """The ring all_gather for blocks of `count` elements: my block's copy into `out`, then
    `ring_steps`, except that my own block goes out first from `send` (see `recursive_doubling`)."""
    starts = tuple(bounds(size * count, size))
    steps = ring_steps(rank, size, starts)
    if steps:
        steps = (steps[0]._replace(from_out=False, outgoing=None), *steps[1:])
    return Schedule(slice(None), slice(starts[rank], starts[rank + 1]), steps)


@register("all_gather", "ring", "n-1 steps around the ring, each forwarding the block it last received",
          schedule=ring_schedule)
def ring(channel: Channel, send: np.ndarray, out: np.ndarray) -> None:
    """Ring all-gather of equal blocks `send` into `out` (length size * len(send))."""
    run_schedule(channel, send, out, ring_schedule(channel.rank, channel.size, send.shape[0]))


def _doubling_steps(rank: int, size: int) -> list[tuple[int, int, int, int, int]]:
    """Recursive doubling's exchanges for `rank` of `size`, as (partner, first and last block I
    send, first and last block I take): empty for an even rank folded out (see `recursive_doubling`)."""
    participants = 1 << (size.bit_length() - 1)
    extra = size - participants
    if rank < 2 * extra and rank % 2 == 0:
        return []

    def first_block(virtual: int) -> int:
        """The first real block held by virtual rank `virtual` (virtual ranks below `extra` hold two)."""
        return virtual + min(virtual, extra)

    virtual = rank // 2 if rank < 2 * extra else rank - extra
    steps = []
    distance = 1
    while distance < participants:
        mine = virtual & ~(distance - 1)
        theirs = mine ^ distance
        peer = virtual ^ distance
        partner = 2 * peer + 1 if peer < extra else peer + extra
        # the run of blocks my group of `distance` virtual ranks holds; the partner group's
        steps.append((partner, first_block(mine), first_block(mine + distance),
                      first_block(theirs), first_block(theirs + distance)))
        distance <<= 1
    return steps


@lru_cache(maxsize=1024)
def doubling_schedule(rank: int, size: int, count: int, op: object = None) -> Schedule | None:
    """`recursive_doubling` as a schedule where it is only exchanges: n a power of two."""
    if size & (size - 1):
        return None

    def blocks(first: int, last: int) -> slice:
        return slice(first * count, last * count)

    own = (rank, rank + 1)   # sent from `send`, as the algorithm does (its docstring says why)
    return Schedule(slice(None), blocks(*own), tuple(
        Step(partner, (first, last) != own, None if (first, last) == own else blocks(first, last),
             partner, blocks(theirs, their_last))
        for partner, first, last, theirs, their_last in _doubling_steps(rank, size)))


@register("all_gather", "recursive_doubling",
          "log2 n steps exchanging doubling halves with rank r xor 2^k; non-powers of two fold in first",
          schedule=doubling_schedule)
def recursive_doubling(channel: Channel, send: np.ndarray, out: np.ndarray) -> None:
    """Recursive-doubling all-gather (Thakur, Rabenseifner & Gropp 2005, section 3.1), any n.

    For n not a power of two, p = 2^floor(log2 n) ranks take part: the first n - p even ranks hand
    their block to their odd neighbour (so virtual rank v < n - p holds blocks 2v and 2v+1), the p
    virtual ranks double, and the odd ranks hand the rest back. Every group a virtual rank holds is a
    contiguous run of blocks, so each step is one message each way.

    A step that sends just my own block sends it from `send`, not from its copy in `out`: the copy's
    lines are dirty in my cache, and the peer's read of them is slower (about a quarter of a 1 MiB
    step at 2 ranks).
    """
    rank, size = channel.rank, channel.size
    block = send.shape[0]
    schedule = doubling_schedule(rank, size, block)
    if schedule is not None:
        run_schedule(channel, send, out, schedule)
        return
    np.copyto(out[rank * block:(rank + 1) * block], send)
    extra = size - (1 << (size.bit_length() - 1))

    def blocks(first: int, last: int) -> np.ndarray:
        return out[first * block:last * block]

    if rank < 2 * extra and rank % 2 == 0:
        # folded out: my block goes to my odd neighbour, everything else comes back from it at the end
        channel.wait(channel.send(send, rank + 1),
                     *[channel.recv(blocks(lo, hi), rank + 1) for lo, hi in _around(rank, size)])
        return
    if rank < 2 * extra:
        # fold: take my even neighbour's block, which sits just below mine
        channel.exchange(None, None, blocks(rank - 1, rank), rank - 1)
    for partner, first, last, theirs, their_last in _doubling_steps(rank, size):
        channel.exchange(send if (first, last) == (rank, rank + 1) else blocks(first, last), partner,
                         blocks(theirs, their_last), partner)
    if rank < 2 * extra:
        # unfold: my even neighbour lacks every block but its own
        channel.wait(*[channel.send(blocks(lo, hi), rank - 1) for lo, hi in _around(rank - 1, size)])


def _around(block: int, size: int) -> list[tuple[int, int]]:
    """The runs of blocks before and after `block`, leaving out an empty one."""
    return [(lo, hi) for lo, hi in ((0, block), (block + 1, size)) if hi > lo]


@register("all_gather", "bruck",
          "ceil(log2 n) steps for any n, gathering relative to my rank, then one local rotation")
def bruck(channel: Channel, send: np.ndarray, out: np.ndarray) -> None:
    """Bruck's concatenation (Bruck et al. 1997; Thakur et al. 2005, section 3.1): any n, no folding.

    Blocks are kept in order relative to this rank, `gathered[j]` being rank r+j's, so that each step
    sends one contiguous run; the final rotation puts them in rank order.
    """
    rank, size = channel.rank, channel.size
    block = send.shape[0]
    gathered = np.empty_like(out)   # small-message algorithm: the temporary is the price of 1 message
    np.copyto(gathered[:block], send)
    held = 1
    while held < size:
        count = min(held, size - held)
        # send the first `count` blocks I hold to rank r - held; rank r + held's first ones land after mine
        # my own block first, from `send` rather than its fresh copy (see `recursive_doubling`)
        channel.exchange(send if held == 1 else gathered[:count * block], (rank - held) % size,
                         gathered[held * block:(held + count) * block], (rank + held) % size)
        held += count
    # rotate: relative block j belongs to rank r + j
    split = (size - rank) * block
    np.copyto(out[rank * block:], gathered[:split])
    np.copyto(out[:rank * block], gathered[split:])
