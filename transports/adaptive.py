"""Which of two ways a kind of call takes, from how long each took lately, not from thresholds
measured once.

The shm transport moves a message through its FIFO's slots (two copies, the cache lines handed
from one core to the other) or by cross-memory attach (one copy, out of the peer's own buffer), by
size thresholds that `colls tune` measured. Which is faster depends on the machine's state, not only
on the size. Measured 2026-12-05 on this project's 2-CPU VM, two ranks exchanging
(`colls.tune.exchange_seconds`, medians of 20): for minutes on end a 1 MiB exchange took 505 us
through the slots and 102 us by cross-memory attach, 4 MiB 2100 against 280 us; minutes before, a
`colls bench` all_to_all of 1 MiB had run its 512 KiB exchanges through the slots in 55 us, and
forcing cross-memory attach made it 78 us. Thresholds are right for the state they were measured in.

So a kind of call (a key) may take one of two ways, and a `ProtocolChoice` keeps the last five
times of each and takes the one whose median is lower (once it has at least three of each: a
caller may leave some calls untimed). The way not in use is tried on `TRY` calls
in a row, first on a key's `FIRST_TRY`-th call and then every `explore_every` calls, the first
call of a try untimed: it pays for the change of way (a 2-rank 1 MiB reduce_scatter took 305 and
145 us on its first two calls through the slots after calls by cross-memory attach, 57 us from then
on). The way in use is timed on the five calls before each try. A key's first calls are slow
whichever the way (800, then 279 us for that reduce_scatter), and tries among them once chose the
slower way for the next 30 calls; so the first try waits, until the 48th call: with it on the 16th,
a probe of 1 MiB all_to_alls in rounds of ten between MPI's calls chose the slower way in one run
of three (its calls 11-15 took 103-177 us through the slots, 80 from call 100 on), with it on the
48th in none of four. Several times a side, and their
medians: one call of the slow state took anything from 104 to 470 us by one way, and means of
two times chose the slower way for a 1 MiB reduce_scatter in two runs of three. A change of state is seen
within `explore_every` calls; a try costs `TRY` calls by the slower way in `explore_every`. This is
how STAR-MPI (Faraj, Yuan & Lowenthal, ICS 2006) picks among collective algorithms at run time. Like
STAR-MPI it times whole calls: timing each exchange on its own (tried 2026-12-05, commit 3c98fbb)
chose against the call, e.g. a 2-rank 1 MiB all_to_all ran in 81.7 us against 55.3 us with the
thresholds, because how one exchange went moved the cost of the copies around it.

What it does not get right yet: a call's time depends on what ran before it. The shm transport
times only calls that follow one of their kind within 1 ms, from the end of that one, and so
chose right at every point of a probe that ran the calls in blocks; but in `colls bench`, whose
rounds put MPI's and Gloo's calls between colls' (2026-12-05, fast state), it still took the
slower way at times (a 1 MiB all_to_all 117 us against 59 with the thresholds). So the shm
transport asks for a choice only with COLLS_SHM_ADAPTIVE=1.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

TIMED = 2       # `ProtocolChoice.choose`'s answer has this bit set when the call is to be timed
TRY = 6         # calls a try of the other way lasts (the first untimed); as many less one before it
FIRST_TRY = 48  # a key's call on which its first try starts (by default)


class _Calls:
    """What one key has seen: its calls so far, and the recent seconds per byte of each way."""

    __slots__ = ("calls", "preferred", "times")

    def __init__(self, preferred: int, keep: int) -> None:
        self.calls = 0
        self.preferred = preferred
        self.times: tuple[deque[float], deque[float]] = (deque(maxlen=keep), deque(maxlen=keep))


class ProtocolChoice:
    """Choose between way 0 and way 1 per key, by their recent times.

    `choose(key, prior)` before a call (`prior`: the way to start with) answers the way, with the
    `TIMED` bit set if the caller is to time the call and pass the time to `record(key, way,
    seconds, nbytes)`. Times are per byte, so that calls of one key but different sizes compare. A
    caller that follows another's choices (rank 0's, say) passes `preferred`, the other's current
    choice, and records nothing: it still tries the other way on the same calls of the key."""

    def __init__(self, explore_every: int = 96, margin: float = 0.05, first_try: int = FIRST_TRY) -> None:
        if explore_every < 2 * TRY or not 0 <= margin < 1 or first_try < TRY:
            raise ValueError(f"ProtocolChoice: explore_every >= {2 * TRY}, 0 <= margin < 1 and first_try >= "
                             f"{TRY}, got {explore_every}, {margin}, {first_try}")
        self.explore_every = explore_every
        self.first_try = first_try
        self.keep = TRY - 1
        self.margin = margin   # the other way must be this much faster to take over
        self.keys: dict[Hashable, _Calls] = {}

    def choose(self, key: Hashable, prior: int, preferred: int | None = None) -> int:
        """The way for the next call of `key` (0 or 1), plus `TIMED` if it is to be timed."""
        seen = self.keys.get(key)
        if seen is None:
            seen = self.keys[key] = _Calls(prior, self.keep)
        if preferred is not None:
            seen.preferred = preferred
        seen.calls += 1
        phase = (seen.calls - self.first_try) % self.explore_every
        if phase < TRY and seen.calls >= self.first_try:
            return (TIMED if phase else 0) | (1 - seen.preferred)   # a try of the other
        if phase >= self.explore_every - (TRY - 1):
            return TIMED | seen.preferred             # what the try is compared with
        return seen.preferred

    def record(self, key: Hashable, way: int, seconds: float, nbytes: int) -> None:
        """A call of `key` by `way` took `seconds`; switch if the other is now faster."""
        seen = self.keys[key]
        seen.times[way].append(seconds / max(nbytes, 1))
        ours, other = seen.times[seen.preferred], seen.times[1 - seen.preferred]
        if min(len(other), len(ours)) >= 3 and _median(other) < _median(ours) * (1 - self.margin):
            seen.preferred = 1 - seen.preferred

    def preferred(self, key: Hashable) -> int | None:
        """The way `key` takes now (None: never called)."""
        seen = self.keys.get(key)
        return None if seen is None else seen.preferred

    def summary(self) -> dict[Hashable, tuple[int, int, float | None, float | None]]:
        """Per key: (preferred way, calls, median recent seconds per byte of 0, of 1)."""
        return {key: (seen.preferred, seen.calls,
                      *(_median(times) if times else None for times in seen.times))
                for key, seen in self.keys.items()}


def _median(times: deque[float]) -> float:
    ordered = sorted(times)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
