"""all_reduce: every rank ends with the reduction of everyone's buffer, bitwise identical.

Bitwise identity across ranks holds for floats too: each algorithm either computes every element
once and copies it around (ps, ring, tree, rabenseifner) or has every rank evaluate the very same
expression (recursive doubling: both partners compute `lower ∘ higher`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from transports.base import Request

from .allgather import ring_all_gather_phase
from .blocks import (
    Schedule,
    Step,
    bounds,
    doubling_partners,
    pieces,
    run_schedule,
    segment_bytes,
    unfold_rank,
)
from .channel import Channel
from .ops import Op
from .reduce import direct as direct_reduce
from .reduce_scatter import ring_reduce_scatter_phase
from .registry import register
from .trees import Tree, double_binary_tree


@register("all_reduce", "ring",
          "reduce-scatter then all-gather around the ring; 2(n-1)/n of the buffer per rank",
          commutative_only=True, takes_source=True)
def ring(channel: Channel, buf: np.ndarray, op: Op, source: np.ndarray | None = None) -> None:
    """Ring all-reduce in place (Patarasuk & Yuan 2009; Baidu's ring): bandwidth-optimal.

    Each block is reduced by exactly one chain of ranks and then copied around, so every rank ends
    with the same bytes even for floats. Counts that don't divide by n give blocks one element apart.
    With `source` (the input, apart from `buf`), `buf` is only written: no copy of the input first.
    """
    if channel.size == 1:
        if source is not None:
            np.copyto(buf, source)
        return
    starts = bounds(buf.shape[0], channel.size)
    ring_reduce_scatter_phase(channel, buf, starts, op, source)   # rank r now holds block r reduced
    ring_all_gather_phase(channel, buf, starts)           # and passes it around the ring


@register("all_reduce", "ring_segmented",
          "the ring over segments of n 256 KiB blocks in turn, so each segment's steps stay in cache",
          commutative_only=True, takes_source=True)
def ring_segmented(channel: Channel, buf: np.ndarray, op: Op, source: np.ndarray | None = None) -> None:
    """Ring all-reduce of each `segment_bytes(n)` segment of the buffer in turn (n 256 KiB blocks).

    One ring over 1 MiB at 2 ranks works on 3 MiB at once (input, output, the block coming in) and
    spills a 2 MiB L2; its second step finds its lines gone. Segments of 512 KiB keep each ring's
    working set in cache, at the price of one more set of steps per segment (colls tune decides
    where that pays). The segment grows with the group, so each step still moves a 256 KiB block.
    """
    for start, stop in pieces(buf.shape[0], buf.itemsize, segment_bytes(channel.size)):
        ring(channel, buf[start:stop], op, None if source is None else source[start:stop])


@register("all_reduce", "ps",
          "parameter server: workers push to rank 0, which reduces in rank order and sends back")
def parameter_server(channel: Channel, buf: np.ndarray, op: Op) -> None:
    """The seed article's first data-parallel scheme: the server takes (n-1) buffers in, sends
    (n-1) out, and is the bottleneck every other algorithm here removes."""
    server_rank = 0
    direct_reduce(channel, buf, op, server_rank)          # every worker's buffer into the server
    if channel.rank == server_rank:
        # the server answers every worker with the global result
        channel.wait(*[channel.send(buf, worker) for worker in range(channel.size) if worker != server_rank])
    else:
        channel.exchange(None, None, buf, server_rank)


@register("all_reduce", "ps_sharded",
          "every rank serves 1/n of the buffer: direct reduce-scatter, then direct all-gather")
def parameter_server_sharded(channel: Channel, buf: np.ndarray, op: Op) -> None:
    """Sharded parameter servers (Li et al. 2014): rank j reduces block j from everyone, in rank order."""
    rank, size = channel.rank, channel.size
    starts = bounds(buf.shape[0], size)

    def block(j: int) -> np.ndarray:
        return buf[starts[j]:starts[j + 1]]

    # push block j of my buffer to its server j, all at once
    sends = [channel.send(block(j), j) for j in range(size) if j != rank]
    # as server of my block: fold in the lower ranks' copies on the left, the higher ranks' on the right
    scratch = np.empty_like(block(rank))
    for peer in list(range(rank - 1, -1, -1)) + list(range(rank + 1, size)):
        channel.exchange(None, None, scratch, peer)
        (op.into_right if peer < rank else op.into_left)(block(rank), scratch)
    channel.wait(*sends)
    # every server sends its reduced block to everyone
    requests = [channel.send(block(rank), j) for j in range(size) if j != rank]
    requests += [channel.recv(block(j), j) for j in range(size) if j != rank]
    channel.wait(*requests)


@lru_cache(maxsize=1024)
def doubling_steps(rank: int, size: int, op: Op) -> tuple[Step, ...]:
    """Recursive doubling's whole-buffer exchanges in place, once the fold is done: with the
    partner at each step, both computing lower ∘ higher (so every rank holds the same bytes)."""
    _, _, partners = doubling_partners(rank, size)
    return tuple(Step(partner, True, None, partner, None, op.into_right if partner < rank else op.into_left)
                 for partner in partners)


def doubling_schedule(rank: int, size: int, count: int, op: Op | None = None) -> Schedule | None:
    """`recursive_doubling` as a schedule where it is only its exchanges: every rank of a
    power-of-two group, and the ranks above the pairs that fold into one another otherwise (rank 2
    of 3); None for a rank of a pair, or of a group of one."""
    new_rank, pairs, partners = doubling_partners(rank, size)
    if pairs or new_rank < 0 or not partners or op is None:
        return None
    return Schedule(None, None, doubling_steps(rank, size, op))


@register("all_reduce", "recursive_doubling",
          "log2 n rounds of whole-buffer exchanges with rank XOR 2^k: latency-optimal for small buffers",
          schedule=doubling_schedule)
def recursive_doubling(channel: Channel, buf: np.ndarray, op: Op) -> None:
    """Recursive doubling (Thakur, Rabenseifner & Gropp 2005), with MPICH's fold for any n."""
    rank = channel.rank
    if channel.size == 1:
        return
    new_rank, pairs, _ = doubling_partners(rank, channel.size)
    if pairs and not _fold_in(channel, buf, op, new_rank, pairs):
        _fold_out(channel, buf, new_rank, pairs)   # I handed my buffer on: wait for the result
        return
    # swap whole partial results with each partner in turn, in place
    run_schedule(channel, buf, buf, Schedule(None, None, doubling_steps(rank, channel.size, op)))
    if pairs:
        _fold_out(channel, buf, new_rank, pairs)


@register("all_reduce", "rabenseifner",
          "recursive-halving reduce-scatter, then recursive-doubling all-gather: log n steps, 2S moved",
          takes_source=True)
def rabenseifner(channel: Channel, buf: np.ndarray, op: Op, source: np.ndarray | None = None) -> None:
    """Rabenseifner's algorithm (2004), MPICH's long-message all-reduce, for any n.

    With `source` (the input, apart from `buf`), the first halving reads it where it lies and
    lands my half as source ∘ incoming; ranks taking part in the fold copy it first.
    """
    rank, size = channel.rank, channel.size
    new_rank, pairs, _ = doubling_partners(rank, size)
    if source is not None and (size == 1 or pairs):
        np.copyto(buf, source)
        source = None
    if size == 1:
        return
    if _fold_in(channel, buf, op, new_rank, pairs):
        power = 1 << (size.bit_length() - 1)
        starts = bounds(buf.shape[0], power)
        low, high = 0, power          # the blocks I am still responsible for
        # Halve with the lowest bit first, so each step joins two *adjacent* ranges of ranks and
        # rank order holds for non-commutative operators; I end up owning block bitreverse(rank).
        mask = 1
        while mask < power:
            partner = unfold_rank(new_rank ^ mask, size)
            middle = (low + high) // 2
            lower, upper = (low, middle), (middle, high)
            keep, give = (lower, upper) if new_rank & mask == 0 else (upper, lower)
            # send the half my partner keeps; fold its copy of my half into mine
            held = buf if source is None else source
            if source is None:
                reducer = op.into_right if partner < rank else op.into_left
            else:
                reducer = op.from_source(source[starts[keep[0]]:starts[keep[1]]], lower=partner < rank)
            channel.exchange(held[starts[give[0]]:starts[give[1]]], partner,
                             buf[starts[keep[0]]:starts[keep[1]]], partner, reducer)
            source = None   # my half of buf now holds my input reduced with my partner's
            low, high = keep
            mask <<= 1
        # then retrace the steps in reverse, swapping finished ranges to double what both hold
        mask = power >> 1
        while mask:
            partner = unfold_rank(new_rank ^ mask, size)
            span = high - low
            partner_low = high if new_rank & mask == 0 else low - span
            channel.exchange(buf[starts[low]:starts[high]], partner,
                             buf[starts[partner_low]:starts[partner_low + span]], partner)
            low, high = min(low, partner_low), max(high, partner_low + span)
            mask >>= 1
    _fold_out(channel, buf, new_rank, pairs)


@register("all_reduce", "tree",
          "pipelined reduce up and broadcast down a double binary tree, each tree carrying half",
          commutative_only=True)
def tree(channel: Channel, buf: np.ndarray, op: Op) -> None:
    """Double binary tree (NCCL 2.4): two trees, each with half the buffer, cut in pipelined pieces.

    A rank is interior in at most one tree, so its links carry the same load as in a ring, while
    the depth (and so the latency) grows with log n instead of n.
    """
    size = channel.size
    if size == 1:
        return
    half = buf.shape[0] // 2
    work = list(zip(double_binary_tree(channel.rank, size), (buf[:half], buf[half:]), strict=True))
    # up: post every piece's receive-reduce from the children at once, then pass each piece up
    # as soon as it is complete, so the levels of the tree work on different pieces together
    ups: list[tuple[Tree, np.ndarray, list[Request]]] = []
    for shape, part in work:
        for start, stop in pieces(part.shape[0], part.itemsize):
            piece = part[start:stop]
            requests = [channel.recv_reduce(piece, child, op.into_left) for child in shape.children]
            ups.append((shape, piece, requests))
    sends: list[Request] = []
    for shape, piece, requests in ups:
        channel.wait(*requests)
        if shape.parent >= 0:
            sends.append(channel.send(piece, shape.parent))
    channel.wait(*sends)
    # down: each piece of the result flows from the root to the leaves the same way
    downs = [(shape, piece, channel.recv(piece, shape.parent) if shape.parent >= 0 else None)
             for shape, piece, _ in ups]
    sends = []
    for shape, piece, request in downs:
        if request is not None:
            channel.wait(request)
        sends += [channel.send(piece, child) for child in shape.children]
    channel.wait(*sends)


def _fold_in(channel: Channel, buf: np.ndarray, op: Op, new_rank: int, pairs: bool) -> bool:
    """The extra ranks of a non-power-of-two group (`pairs`: mine is one of the pairs below 2 rem,
    see `fold_to_power_of_two`) hand their data to a neighbour; False if I sit out."""
    rank = channel.rank
    if new_rank < 0:
        channel.wait(channel.send(buf, rank + 1))          # even rank: hand my buffer to rank + 1
        return False
    if pairs:
        channel.exchange(None, None, buf, rank - 1, op.into_right)   # odd rank: fold in rank - 1
    return True


def _fold_out(channel: Channel, buf: np.ndarray, new_rank: int, pairs: bool) -> None:
    """Give the ranks that sat out the finished result."""
    rank = channel.rank
    if new_rank < 0:
        channel.exchange(None, None, buf, rank + 1)
    elif pairs:
        channel.wait(channel.send(buf, rank - 1))
