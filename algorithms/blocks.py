"""How a buffer is cut into per-rank blocks when its length does not divide by the group size."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from transports.base import Reducer


def bounds(count: int, parts: int) -> list[int]:
    """Start offsets of `parts` near-equal blocks of `count` elements, plus the end: len parts + 1."""
    return [count * i // parts for i in range(parts + 1)]


def offsets(counts: list[int]) -> list[int]:
    """Exclusive prefix sums: where each of `counts` blocks starts."""
    starts, total = [], 0
    for count in counts:
        starts.append(total)
        total += count
    return starts


PIPELINE_CHUNK_BYTES = 256 << 10   # pipelined trees and chains move the buffer in pieces of this size

# The blocks of all_reduce `ring_segmented`: it cuts the buffer in segments of n such blocks (512 KiB
# at 2 ranks, 1 MiB at 4), so each ring step moves one. At 2 ranks a segment's input, output and
# incoming block then stay in a core's 2 MiB L2 through its steps. At 4 ranks on 2 cores, 512 KiB
# segments were slower than 1 MiB ones: each segment's ring is 2(n-1) more steps, each a hand-over
# of a core (bench/RESULTS.md, `bench/segments.py`). A constant, not read from the machine: every
# rank must cut the buffer alike.
SEGMENT_BLOCK_BYTES = 256 << 10


def segment_bytes(size: int) -> int:
    """The segment `ring_segmented` runs one ring over at a time, for a group of `size` ranks."""
    return size * SEGMENT_BLOCK_BYTES


def pieces(count: int, itemsize: int, chunk_bytes: int = PIPELINE_CHUNK_BYTES) -> list[tuple[int, int]]:
    """(start, stop) of the pipeline pieces of a `count`-element buffer; one empty piece if count is 0."""
    step = max(1, chunk_bytes // max(1, itemsize))
    return [(start, min(start + step, count)) for start in range(0, count, step)] or [(0, 0)]


def fold_to_power_of_two(rank: int, size: int) -> tuple[int, int]:
    """MPICH's fold for recursive doubling/halving on any n: (power of two p, my new rank or -1).

    With rem = n - p, ranks below 2 rem pair up: the even one hands its data to the odd one and
    sits out (-1); the odd one becomes rank//2; ranks from 2 rem on become rank - rem. New ranks
    cover contiguous, increasing ranges of old ranks, so rank order is kept.
    """
    power = 1 << (size.bit_length() - 1)
    remainder = size - power
    if rank < 2 * remainder:
        return power, (rank // 2 if rank % 2 else -1)
    return power, rank - remainder


@lru_cache(maxsize=1024)
def doubling_partners(rank: int, size: int) -> tuple[int, bool, tuple[int, ...]]:
    """Recursive doubling's schedule for `rank` of `size`, worked out once per group (it is on
    every small all-reduce's path): (my new rank or -1, whether I am one of a pair of the fold, which
    hands a buffer on or takes one in first and answers last, and my partner's old rank at each
    step, lowest bit first)."""
    power, new_rank = fold_to_power_of_two(rank, size)
    pairs = rank < 2 * (size - power)
    if new_rank < 0:
        return new_rank, pairs, ()
    partners = tuple(unfold_rank(new_rank ^ (1 << step), size) for step in range(power.bit_length() - 1))
    return new_rank, pairs, partners


def unfold_rank(new_rank: int, size: int) -> int:
    """The old rank that holds new rank `new_rank` after `fold_to_power_of_two`."""
    power = 1 << (size.bit_length() - 1)
    remainder = size - power
    return 2 * new_rank + 1 if new_rank < remainder else new_rank + remainder


class Step(NamedTuple):
    """One sendrecv of a schedule, as slices of the call's flat `send` and `out` buffers."""

    dst: int
    from_out: bool               # whether the outgoing slice is of `out` (else of `send`)
    outgoing: slice | None       # None: the whole buffer itself (so a step in place passes one object)
    src: int
    incoming: slice | None       # of `out`; None: the whole of it
    reducer: Reducer | None = None   # folds what arrives into `out`'s slice, else it lands there


class Schedule(NamedTuple):
    """A schedule that is nothing but a copy of my own block and sendrecvs, worked out ahead for
    one (rank, size, count, op): what an algorithm declares through its catalogue entry's
    `schedule`, so that a call can be compiled once per signature and then only slices and moves
    (MPI-4's persistent collectives fix their schedule at MPI_Allreduce_init the same way)."""

    copy_from: slice | None      # of `send`; None: no copy (the schedule works in place)
    copy_to: slice | None        # of `out`
    steps: tuple[Step, ...]


def run_schedule(channel, send, out, schedule: Schedule, exchanges: tuple | None = None) -> None:
    """Copy my own block into `out`, and make the schedule's exchanges in order, on flat `send` and
    `out`: by `exchanges` where given (`bind_schedule`, for a schedule compiled once per call
    signature), else by `channel.exchange`. Where the first exchange sends from `send`, the copy
    comes after it: my first message then goes out at once, rather than keep a peer that waits for
    it waiting through my copy (it lands in a block the copy does not touch)."""
    steps = schedule.steps
    copy = schedule.copy_from is not None
    if copy and (not steps or steps[0].from_out):
        out[schedule.copy_to] = send[schedule.copy_from]
        copy = False
    for index, (dst, from_out, outgoing, src, incoming, reducer) in enumerate(steps):
        held = out if from_out else send
        held = held if outgoing is None else held[outgoing]
        into = out if incoming is None else out[incoming]
        if exchanges is None:
            channel.exchange(held, dst, into, src, reducer)
        else:
            exchanges[index](held, into)
        if copy:   # my first message is on its way: now my own block
            out[schedule.copy_to] = send[schedule.copy_from]
            copy = False


def bind_schedule(channel, schedule: Schedule, dtype, send_count: int, out_count: int) -> tuple:
    """Each of `schedule`'s steps as `channel.exchange_init`'s persistent step, for `run_schedule`:
    what a call's schedule is compiled to once per signature, over flat buffers of `send_count`
    and `out_count` elements of `dtype`."""
    def length(part: slice | None, count: int) -> int:
        return count if part is None else len(range(*part.indices(count)))
    return tuple(channel.exchange_init(dtype,
                                       length(step.outgoing, out_count if step.from_out else send_count),
                                       step.dst, length(step.incoming, out_count), step.src,
                                       step.reducer) for step in schedule.steps)
