"""Timed turns of the shm transport's two wait loops, for a performance model (`colls tune`): how
long a waiting rank polls before it yields its core is `spin_polls` such turns."""

from __future__ import annotations

import time

from ..base import Backoff, Request
from .fifo import HEAD
from .transport import ShmTransport


def wait_turn_seconds(transport: ShmTransport, request: Request, turns: int) -> float:
    """Seconds that `turns` turns of `wait_all`'s loop take with `request` pending: a progress
    pass, the check, the clock, the backoff's count (stopping early if `request` completes)."""
    backoff = Backoff(turns + 1)   # (counts its polls, never yields within them)
    start = time.perf_counter()
    for _ in range(turns):
        transport.progress()
        if request.done:
            break
        time.monotonic()   # the deadline check
        backoff.pause()
    return time.perf_counter() - start


def direct_turn_seconds(transport: ShmTransport, peer: int, turns: int) -> float:
    """Seconds that `turns` turns of the direct path's wait for a message from `peer` take (its
    FIFO's head read, the other requests kept moving), whether or not one lands meanwhile."""
    ctl, tail = transport.inbound[peer].ctl, transport.read_tail[peer]
    landed = 0
    start = time.perf_counter()
    for _ in range(turns):
        landed += ctl[HEAD] > tail   # the loop's test, read but not obeyed (the peer may send)
        if transport.active_out or transport.active_in:
            transport.progress()
    return time.perf_counter() - start
