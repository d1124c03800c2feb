"""reduce_scatter: every rank ends with the reduction of its own block of everyone's buffer."""

from __future__ import annotations

import numpy as np

from .blocks import bounds
from .channel import Channel
from .ops import Op
from .registry import register


def ring_reduce_scatter_phase(channel: Channel, buf: np.ndarray, starts: list[int], op: Op,
                              source: np.ndarray | None = None) -> None:
    """In place: after n-1 steps rank r holds the full reduction of block r of `buf` (Baidu ring).

    Block j starts at rank j+1 and travels right, each rank folding in its own contribution, so it
    arrives complete at rank j after n-1 hops; every rank sends and receives (n-1)/n of the buffer.
    With `source`, my contributions are read from it and `buf` is only written: each block that
    arrives lands as source ∘ incoming (so `buf` need not hold a copy of the input first).
    """
    rank, size = channel.rank, channel.size
    right, left = (rank + 1) % size, (rank - 1) % size
    for step in range(size - 1):
        send_block = (rank - step - 1) % size
        recv_block = (rank - step - 2) % size
        outgoing = (buf if source is None or step else source)[starts[send_block]:starts[send_block + 1]]
        incoming = buf[starts[recv_block]:starts[recv_block + 1]]
        reducer = op.into_left if source is None else op.from_source(source[starts[recv_block]:
                                                                            starts[recv_block + 1]])
        # send my partial of one block to the right; fold the left's partial of the next into mine
        channel.exchange(outgoing, right, incoming, left, reducer)


@register("reduce_scatter", "ring", "n-1 steps around the ring; each rank sends (n-1)/n of the buffer",
          commutative_only=True)
def ring(channel: Channel, work: np.ndarray, out: np.ndarray, op: Op) -> None:
    """Ring reduce-scatter on `work` (clobbered); rank r's block lands in `out`."""
    starts = bounds(work.shape[0], channel.size)
    ring_reduce_scatter_phase(channel, work, starts, op)
    np.copyto(out, work[starts[channel.rank]:starts[channel.rank + 1]])


@register("reduce_scatter", "pairwise",
          "n-1 steps; in step s rank r sends block r+s to rank r+s and folds in block r from r-s",
          reads_input_only=True)
def pairwise(channel: Channel, work: np.ndarray, out: np.ndarray, op: Op) -> None:
    """Pairwise-exchange reduce-scatter (Thakur, Rabenseifner & Gropp 2005, section 4.3).

    Contributions to my block arrive from r-1, r-2, ..., 0 (folded in on the left of my own), then
    from n-1, n-2, ..., r+1 (folded together in `out`, then on the right), so rank order holds.
    """
    rank, size = channel.rank, channel.size
    block = out.shape[0]
    own = work[rank * block:(rank + 1) * block]   # `work` is only read: the caller may pass its input
    left = own          # (0 .. r) so far: my block with the lower ranks' folded in on its left
    final = False       # whether `out` already holds (0 .. n-1)
    for step in range(1, size):
        dst, src = (rank + step) % size, (rank - step) % size
        reducer = None
        if src < rank:
            if left is own:
                # the first lower contribution lands as incoming ∘ my block (no copy of it first),
                # in `out` itself when no higher rank's will follow
                target = out if rank == size - 1 else np.empty_like(out)
                reducer = op.from_source(own, lower=True)
                left = target
            else:
                target, reducer = left, op.into_right
        elif src == rank + 1 == size - 1:
            # the one higher contribution there is lands as (0 .. r) ∘ incoming: the result
            target, reducer, final = out, op.from_source(left), True
        elif src == size - 1:
            target = out        # the highest rank's contribution starts the right-hand partial
        else:
            # each next-higher rank's contribution goes left of the right-hand partial
            target, reducer = out, op.into_right
        # rank r+s gets its block of my buffer
        channel.exchange(work[dst * block:(dst + 1) * block], dst, target, src, reducer)
    if final:
        return
    if rank == size - 1:
        if left is not out:
            np.copyto(out, left)   # a group of one
    else:
        op.combine(left, out, out)   # (0 .. r) ∘ (r+1 .. n-1)


@register("reduce_scatter", "recursive_halving",
          "log2 n steps, each exchanging half of the remaining blocks with rank r xor 2^k")
def recursive_halving(channel: Channel, work: np.ndarray, out: np.ndarray, op: Op) -> None:
    """Recursive-halving reduce-scatter (Thakur, Rabenseifner & Gropp 2005, section 4.1), any n.

    For n not a power of two, p = 2^floor(log2 n) ranks take part: the first n - p even ranks fold
    their whole buffer into their odd neighbour (so virtual rank v < n - p owns blocks 2v and 2v+1),
    the p virtual ranks halve, and each odd rank hands its even neighbour's block back.

    A commutative op halves by the highest bit first (MPICH's order; no extra step). Otherwise the
    lowest bit goes first, so that every partial covers a contiguous range of ranks and partner ranges
    are adjacent: rank order holds, but virtual rank v ends up holding the blocks of virtual rank
    bitreverse(v), and one more exchange swaps them into place.
    """
    rank, size = channel.rank, channel.size
    block = out.shape[0]
    if size == 1:
        np.copyto(out, work)
        return
    participants = 1 << (size.bit_length() - 1)
    extra = size - participants
    levels = participants.bit_length() - 1

    def span(first: int, last: int) -> np.ndarray:
        """The real blocks owned by virtual ranks first .. last-1."""
        return work[(first + min(first, extra)) * block:(last + min(last, extra)) * block]

    def real(virtual: int) -> int:
        return 2 * virtual + 1 if virtual < extra else virtual + extra

    if rank < 2 * extra and rank % 2 == 0:
        # fold: my whole buffer goes into my odd neighbour's; my reduced block comes back at the end
        channel.wait(channel.send(work, rank + 1), channel.recv(out, rank + 1))
        return
    if rank < 2 * extra:
        # fold in my even neighbour's buffer, which is lower in rank order
        channel.exchange(None, None, work, rank - 1, op.into_right)
    virtual = rank // 2 if rank < 2 * extra else rank - extra
    bits = range(levels - 1, -1, -1) if op.commutative else range(levels)
    low, width = 0, participants            # the window of virtual ranks' blocks I still reduce
    for bit in bits:
        half = width // 2
        peer = virtual ^ (1 << bit)
        upper = bool(virtual >> bit & 1)
        keep, give = (low + half, low) if upper else (low, low + half)
        # send the half my partner keeps; fold its partial of my half in, lower ranks on the left
        # (as one exchange, not a send, a receive and a wait: the transport moves a sendrecv in one
        # step, which counts most where ranks outnumber cores)
        reducer = op.into_right if upper else op.into_left
        channel.exchange(span(give, give + half), real(peer), span(keep, keep + half), real(peer), reducer)
        low, width = keep, half
    if low != virtual:
        # lowest-bit-first left me virtual rank `low`'s blocks: swap with it (bitreverse pairs)
        channel.exchange(span(low, low + 1), real(low), span(virtual, virtual + 1), real(low))
    mine = span(virtual, virtual + 1)
    if rank < 2 * extra:
        # unfold: the first of my two blocks belongs to my even neighbour
        channel.wait(channel.send(mine[:block], rank - 1))
        mine = mine[block:]
    np.copyto(out, mine)
