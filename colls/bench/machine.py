"""How fast ranks 0 and 1 reach each other's cache lines right now: the machine's mode.

On a virtual machine the host moves the guest's CPUs about: a cache line's round trip between two
pinned processes may be short for minutes (the CPUs behave like two threads of one host core),
then twice as long or more for minutes (two cores apart), and every copy between ranks changes
speed with it. `colls bench` records the round trip before and after each point and `colls tune
--profile` before and after its messages, so that `colls plan calibrate --round-trip LO-HI` can
compare measurements made in one mode.

The round trip does not tell every state apart: in one, copies into memory the other core has just
read run several times slower at the same round trip, from one launch of the ranks to the next.
So `CoreLink` also times exchanges of 256 KiB through shared memory (`exchange_us`): ranks 0 and 1
each write a buffer of their own while the other writes its, then read the other's, as a FIFO
exchange does; that time follows the FIFO's. (Taking turns instead, one rank copying at a time,
does not: it reads the same in both states.)
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable

import numpy as np

ROUND_TRIPS = 2000   # a millisecond or two a measurement
EXCHANGE_BYTES = 256 << 10   # what ranks 0 and 1 each write and the other reads (one FIFO slot)
EXCHANGES = 20       # exchanges a measurement times, after half as many untimed
SLEEP_S = 2e-4       # how often a rank that waits out a measurement looks whether it is over
MODE_FIELDS = ("round_trip_ns", "exchange_us")   # what `CoreLink.mode` measures, in its order


class CoreLink:
    """A page mapped by ranks 0 and 1, where they take turns writing a counter: each turn is a
    cache line handed from one CPU to the other and back."""

    def __init__(self, rank: int, words: np.ndarray, page: mmap.mmap, barrier: Callable[[], None]) -> None:
        self.rank = rank
        self.words = words
        self.page = page
        self.barrier = barrier
        self.trips = 0      # round trips made so far (`round_trip_ns`)
        self.exchanges = 0  # exchanges made so far (`exchange_us`)
        self.measured = 0   # measurements made so far (the ranks beyond 1 sleep through them)
        # rank r writes the r-th buffer after the page, and reads the other
        self.buffers = [np.frombuffer(page, np.uint8, EXCHANGE_BYTES, mmap.PAGESIZE + i * EXCHANGE_BYTES)
                        for i in range(2)]
        self.mine = np.full(EXCHANGE_BYTES, rank, np.uint8)   # what this rank writes
        self.seen = np.empty(EXCHANGE_BYTES, np.uint8)        # what it reads into
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
                    handle.write(bytes(mmap.PAGESIZE + 2 * EXCHANGE_BYTES))
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
                page = mmap.mmap(fd, mmap.PAGESIZE + 2 * EXCHANGE_BYTES)
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
        return self._pinned(self._bounce)

    def mode(self) -> tuple[float | None, float | None]:
        """(`round_trip_ns`, `exchange_us`): the machine's mode now; collective."""
        return self.round_trip_ns(), self.exchange_us()

    def exchange_us(self) -> float | None:
        """Microseconds per exchange of 256 KiB between ranks 0 and 1 through shared memory (each
        writes its buffer while the other writes its own, then reads the other's), rank 0's
        measurement (0.0 on the other ranks, None if the peer did not answer within a second);
        collective, pinned as `round_trip_ns`."""
        return self._pinned(lambda: (self._exchange(EXCHANGES // 2), self._exchange(EXCHANGES))[1])

    def _pinned(self, measure: Callable[[], float | None]) -> float | None:
        """`measure()` on ranks 0 and 1, each pinned to a CPU of its own, while the others sleep."""
        self.barrier()
        if self.rank > 1:
            self._sleep_through()
            return 0.0
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.cpu})
        try:
            return measure()
        finally:
            os.sched_setaffinity(0, allowed)
            self.measured += 1
            if self.rank == 0:
                self.words[16] = self.measured   # the other ranks may wake (a line of its own)

    def _sleep_through(self) -> None:
        """The ranks beyond 0 and 1 sleep until rank 0 has measured: polling, they would take
        the CPUs the two need (4 ranks on 2 CPUs)."""
        self.measured += 1
        deadline = time.monotonic() + 2.0   # as long as a bounce may take, and its give-up
        while self.words[16] < self.measured and time.monotonic() < deadline:
            time.sleep(SLEEP_S)

    def _bounce(self) -> float | None:
        words = self.words
        first = self.trips + 1
        self.trips += ROUND_TRIPS
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

    def _exchange(self, count: int) -> float | None:
        """`count` exchanges, seconds each on rank 0: write mine once the other has read my last
        (words[40 + 8r]: the exchanges rank r has read), say so (words[24 + 8r]: those it has
        written), wait for the other's, read it, say so."""
        words, me, other = self.words, self.rank, 1 - self.rank
        first = self.exchanges + 1
        self.exchanges += count
        deadline = time.monotonic() + 1.0
        start = time.perf_counter()
        for i in range(first, first + count):
            if not self._wait(40 + 8 * other, i - 1, deadline):
                return None
            np.copyto(self.buffers[me], self.mine)
            words[24 + 8 * me] = i
            if not self._wait(24 + 8 * other, i, deadline):
                return None
            np.copyto(self.seen, self.buffers[other])
            words[40 + 8 * me] = i
        return (time.perf_counter() - start) / count * 1e6 if self.rank == 0 else 0.0

    def _wait(self, word: int, value: int, deadline: float) -> bool:
        """Poll until words[word] >= value: False if the deadline passes first."""
        words, polls = self.words, 0
        while words[word] < value:
            polls += 1
            if not polls & 0xFFFF and time.monotonic() > deadline:
                return False
        return True

    def close(self) -> None:
        """Unmap the page."""
        del self.words, self.buffers
        self.page.close()


def mode_fields(before: tuple[float | None, float | None], after: tuple[float | None, float | None]) -> dict:
    """A record's fields for the modes `CoreLink.mode` measured before and after it: round_trip_ns
    and exchange_us, each [before, after] (None where the peer did not answer)."""
    return {name: [None if value is None else round(value, 1) for value in (before[i], after[i])]
            for i, name in enumerate(MODE_FIELDS)}


def current_cpu() -> int | None:
    """The CPU this process ran on last (Linux's /proc/self/stat, field 39); None where unknown.
    With more ranks than cores the kernel keeps each rank on one core's run queue for the whole of
    a launch, and where it put them sets the call's time (4 ranks on 2 cores: a binomial broadcast
    about twice as slow with ranks 0 and 3 on one core as apart, and every call of a launch finds
    the ranks where the first did), so `colls bench` records it around each point (`cpus`)."""
    try:
        with open("/proc/self/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None
