"""How fast ranks 0 and 1 reach each other's cache lines right now: the machine's mode.

On a virtual machine the host moves the guest's CPUs about: on this project's 2-CPU VM a cache
line's round trip between two pinned processes takes ~260-300 ns for minutes (the CPUs behave like
two threads of one host core), then ~630-790 ns for minutes (two cores apart), and every copy
between ranks changes speed with it (bench/RESULTS.md). `colls bench` records the round trip
before and after each point and `colls tune --profile` before and after its messages, so that
`colls plan calibrate --round-trip LO-HI` can compare measurements made in one mode.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable

import numpy as np

ROUND_TRIPS = 2000   # ~0.5-1.6 ms a measurement on the reference machine
SLEEP_S = 2e-4       # how often a rank that waits out a measurement looks whether it is over


class CoreLink:
    """A page mapped by ranks 0 and 1, where they take turns writing a counter: each turn is a
    cache line handed from one CPU to the other and back."""

    def __init__(self, rank: int, words: np.ndarray, page: mmap.mmap, barrier: Callable[[], None]) -> None:
        self.rank = rank
        self.words = words
        self.page = page
        self.barrier = barrier
        self.count = 0
        allowed = sorted(os.sched_getaffinity(0))
        self.cpu = allowed[rank % len(allowed)]   # ranks 0 and 1 bounce the line from CPUs of their own

    @classmethod
    def open(cls, rank: int, size: int, share: Callable[[int], int],
             barrier: Callable[[], None]) -> CoreLink | None:
        """Collective over the group whose `share` (rank 0's int to all) and `barrier` are given.
        None with fewer than 2 ranks or fewer than 2 CPUs to run on (two ranks on one core would
        hand the line over only when the scheduler switches them). With more ranks than CPUs the
        others sleep while ranks 0 and 1 bounce the line (`round_trip_ns`)."""
        if size < 2 or len(os.sched_getaffinity(0)) < 2:
            return None
        made = -1
        if rank == 0:
            path = f"/dev/shm/colls-line-{os.getpid()}"
            try:
                with open(path, "wb") as handle:
                    handle.write(bytes(mmap.PAGESIZE))
                made = os.getpid()
            except OSError:   # no /dev/shm here: no mode to record
                pass
        made = share(made)
        if made < 0:
            return None
        path = f"/dev/shm/colls-line-{made}"
        barrier()
        try:
            fd = os.open(path, os.O_RDWR)
            try:
                page = mmap.mmap(fd, mmap.PAGESIZE)
            finally:
                os.close(fd)
        finally:
            barrier()
            if rank == 0:
                os.unlink(path)   # both have it mapped: nothing is left in /dev/shm
        return cls(rank, np.frombuffer(page, np.int64), page, barrier)

    def round_trip_ns(self) -> float | None:
        """Nanoseconds per round trip, rank 0's measurement (0.0 on the other ranks, None if the
        peer did not answer within a second); collective. Ranks 0 and 1 run on CPUs of their own
        meanwhile: on one CPU each hand-over would wait for the scheduler."""
        self.barrier()
        if self.rank > 1:
            self._sleep_through()
            return 0.0
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.cpu})
        try:
            return self._bounce()
        finally:
            os.sched_setaffinity(0, allowed)
            if self.rank == 0:
                self.words[16] = self.count   # the other ranks may wake (a line of its own)

    def _sleep_through(self) -> None:
        """The ranks beyond 0 and 1 sleep until rank 0 has measured: polling, they would take
        the CPUs the two need (4 ranks on 2 CPUs)."""
        self.count += ROUND_TRIPS
        deadline = time.monotonic() + 2.0   # as long as a bounce may take, and its give-up
        while self.words[16] < self.count and time.monotonic() < deadline:
            time.sleep(SLEEP_S)

    def _bounce(self) -> float | None:
        words = self.words
        first = self.count + 1
        self.count += ROUND_TRIPS
        deadline = time.monotonic() + 1.0   # a peer that never answers: give up, report nothing
        polls = 0
        if self.rank == 0:
            start = time.perf_counter()
            for i in range(first, first + ROUND_TRIPS):
                words[0] = i
                while words[8] != i:   # the other rank's line, 64 B on
                    polls += 1
                    if not polls & 0xFFFF and time.monotonic() > deadline:
                        return None
            return (time.perf_counter() - start) / ROUND_TRIPS * 1e9
        if self.rank == 1:
            for i in range(first, first + ROUND_TRIPS):
                while words[0] != i:
                    polls += 1
                    if not polls & 0xFFFF and time.monotonic() > deadline:
                        return None
                words[8] = i
        return 0.0

    def close(self) -> None:
        """Unmap the page."""
        del self.words
        self.page.close()
