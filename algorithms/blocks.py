"""How a buffer is cut into per-rank blocks when its length does not divide by the group size."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from . import faults


def bounds(count: int, parts: int) -> list[int]:
    """Start offsets of `parts` near-equal blocks of `count` elements, plus the end: len parts + 1."""
    starts = [count * i // parts for i in range(parts + 1)]
    if faults.ACTIVE and "block_boundary" in faults.ACTIVE and count > parts:
        starts[-1] -= 1   # planted fault: the last block loses its last element
    return starts


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


class BlockSchedule(NamedTuple):
    """An all_gather's or all_to_all's schedule for one rank, as slices of its flat `send` and `out`:
    the own block's copy, then one sendrecv per step. Worked out once per call signature when the
    call is planned (`colls.describe.Plan`), so that a later call only slices and moves."""

    copy_from: slice   # of send
    copy_to: slice     # of out
    # (destination, whether the outgoing slice is of out (else of send), outgoing, source, incoming)
    steps: tuple[tuple[int, bool, slice, int, slice], ...]


def run_persistent_block_schedule(send, out, schedule: BlockSchedule, exchanges: tuple) -> None:
    """`run_block_schedule` with each step's exchange made persistent once (`exchanges`, one per
    step, `Channel.persistent_exchange(...)(outgoing, into)`): a small planned call's exchanges
    take no checks and no views (2 ranks, 8 B all_gather: see `colls.describe.Plan`)."""
    out[schedule.copy_to] = send[schedule.copy_from]
    for (_, from_out, outgoing, _, incoming), exchange in zip(schedule.steps, exchanges, strict=True):
        exchange((out if from_out else send)[outgoing], out[incoming])


def run_block_schedule(channel, send, out, schedule: BlockSchedule) -> None:
    """Copy my own block, then make the schedule's exchanges in order, on flat `send` and `out`.

    Where the transport splits an exchange and the first step sends from `send`, that send is
    posted before the copy, so the peer starts on it meanwhile. 2 ranks, shm, all_to_all, the
    slower rank's median of 200 (us): 1 MiB 57.0-58.0 against 59.0-60.5, 4 MiB 200.8-222.9 against
    228.9-261.8 (`/tmp/s6/a2d.py`, 2026-12-05)."""
    steps = iter(schedule.steps)
    first = next(steps, None) if channel.transport.splits_exchanges else None
    if first is not None and not first[1]:
        dst, _, outgoing, src, incoming = first
        sent = channel.exchange_post(send[outgoing], dst, out[incoming])
        out[schedule.copy_to] = send[schedule.copy_from]
        channel.exchange_finish(sent, send[outgoing], dst, out[incoming], src)
    else:
        out[schedule.copy_to] = send[schedule.copy_from]
        if first is not None:
            dst, from_out, outgoing, src, incoming = first
            channel.exchange((out if from_out else send)[outgoing], dst, out[incoming], src)
    for dst, from_out, outgoing, src, incoming in steps:
        channel.exchange((out if from_out else send)[outgoing], dst, out[incoming], src)
