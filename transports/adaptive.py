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

So a kind of call (a key) may take one of two ways, and a `ProtocolChoice` times the way in use
and, now and then, the other. The other way is tried on `TRY` calls in a row, first on a key's
`FIRST_TRY`-th call and then every `explore_every` calls, the first call of a try untimed: it pays
for the change of way (a 2-rank 1 MiB reduce_scatter took 305 and 145 us on its first two calls
through the slots after calls by cross-memory attach, 57 us from then on). The way in use is timed
on the five calls before each try and on the five after it (the first call after it, which changes
back, untimed). The other way takes over only if the median of its try is lower than the medians
of both, by a margin (and each of the three windows has at least three times: a caller may leave
some calls untimed). Several times a side, and their medians: one call of the slow state took
anything from 104 to 470 us by one way, and means of two times chose the slower way for a 1 MiB
reduce_scatter in two runs of three. The windows on both sides: a key's calls get faster over
their first hundred or so whichever the way, and a try compared with the calls before it only
took the slower way inside `colls bench` (2026-12-05, fast state: a 4 MiB all_to_all's calls 43-46
took 1047-1321 us through the slots, its try's calls 49-53 by cross-memory attach 290-314 us, and
from call 139 on the two ways took 272-334 us by attach and 282-357 through the slots). The first
try waits for the 48th call for the same reason: with it on the 16th, a probe of 1 MiB all_to_alls
in rounds of ten between MPI's calls chose the slower way in one run of three (its calls 11-15 took
103-177 us through the slots, 80 from call 100 on), with it on the 48th in none of four. A change of state is
seen within two cycles; a try costs `TRY` calls by the slower way in `explore_every`. This is how
STAR-MPI (Faraj, Yuan & Lowenthal, ICS 2006) picks among collective algorithms at run time. Like
STAR-MPI it times whole calls: timing each exchange on its own (tried 2026-12-05, commit 3c98fbb)
chose against the call, e.g. a 2-rank 1 MiB all_to_all ran in 81.7 us against 55.3 us with the
thresholds, because how one exchange went moved the cost of the copies around it.

A call's time also depends on what ran before it, so the shm transport times only calls that
follow one of their kind within 1 ms, from the end of that one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

TIMED = 2       # `ProtocolChoice.choose`'s answer has this bit set when the call is to be timed
TRY = 6         # calls a try of the other way lasts (the first untimed); timed windows of one fewer around it
FIRST_TRY = 48  # a key's call on which its first try starts (by default)
BEFORE, TRIAL, AFTER = range(3)   # the windows of a try's cycle: the way in use, the other, the way in use


class _Calls:
    """What one key has seen: its calls so far, the way it takes, the timed calls of the current
    cycle's three windows (seconds per byte), and the recent times of each way (for `summary`)."""

    __slots__ = ("calls", "preferred", "cycle", "windows", "times")

    def __init__(self, preferred: int, keep: int) -> None:
        self.calls = 0
        self.preferred = preferred
        self.cycle: int | None = None          # the cycle whose windows are being filled
        self.windows: tuple[list[float], list[float], list[float]] = ([], [], [])
        self.times: tuple[deque[float], deque[float]] = (deque(maxlen=keep), deque(maxlen=keep))


class ProtocolChoice:
    """Choose between way 0 and way 1 per key, by their recent times.

    `choose(key, prior)` before a call (`prior`: the way to start with) answers the way, with the
    `TIMED` bit set if the caller is to time the call and pass the time to `record(key, way,
    seconds, nbytes, call)` (`call`: the call's number, 1 for the key's first; by default its
    latest). Times are per byte, so that calls of one key but different sizes compare. A caller
    that follows another's choices (rank 0's, say) passes `preferred`, the other's current choice,
    and records nothing: it still tries the other way on the same calls of the key.

    Each cycle of `explore_every` calls has three windows of timed calls: the way in use on the
    `TRY` - 1 calls before a try, the other way on the try's `TRY` calls (the first untimed), and
    the way in use again on the `TRY` calls after it (the first untimed: it changes back). The
    other way takes over only if its median beats both of the way in use by `margin`: a cost that
    drifts during a cycle (a key's calls speed up over their first hundred) moves the windows
    before and after the try apart, and a try then has to beat the faster of them."""

    def __init__(self, explore_every: int = 96, margin: float = 0.05, first_try: int = FIRST_TRY) -> None:
        if explore_every < 3 * TRY or not 0 <= margin < 1 or first_try < TRY:
            raise ValueError(f"ProtocolChoice: explore_every >= {3 * TRY}, 0 <= margin < 1 and first_try >= "
                             f"{TRY}, got {explore_every}, {margin}, {first_try}")
        self.explore_every = explore_every
        self.first_try = first_try
        self.keep = TRY - 1
        self.margin = margin   # the other way must be this much faster to take over
        self.keys: dict[Hashable, _Calls] = {}

    def _window(self, call: int) -> tuple[int, int, bool] | None:
        """(cycle, window, timed) of a key's call number `call`; None outside the windows."""
        if call < self.first_try - (TRY - 1):
            return None
        cycle, phase = divmod(call - self.first_try, self.explore_every)
        if phase >= self.explore_every - (TRY - 1):
            return cycle + 1, BEFORE, True
        if phase < TRY:
            return cycle, TRIAL, phase > 0
        if phase < 2 * TRY:
            return cycle, AFTER, phase > TRY
        return None

    def choose(self, key: Hashable, prior: int, preferred: int | None = None) -> int:
        """The way for the next call of `key` (0 or 1), plus `TIMED` if it is to be timed."""
        seen = self.keys.get(key)
        if seen is None:
            seen = self.keys[key] = _Calls(prior, self.keep)
        if preferred is not None:
            seen.preferred = preferred
        seen.calls += 1
        if preferred is None and seen.cycle is not None and self._window(seen.calls - 2 * TRY - 1) == (
                seen.cycle, TRIAL, False):
            # two calls after the window after a try, by when a caller that records each call at the
            # end of the next (rank 0) has recorded that window's last: its verdict, even if one of
            # its calls went untimed (else it waits for the next cycle's first time, `record`)
            self._decide(seen)
        where = self._window(seen.calls)
        if where is None:
            return seen.preferred
        _, window, timed = where
        way = 1 - seen.preferred if window == TRIAL else seen.preferred
        return (TIMED if timed else 0) | way

    def record(self, key: Hashable, way: int, seconds: float, nbytes: int, call: int | None = None) -> None:
        """Call number `call` of `key` (default: its latest) took `seconds` by `way`; once the
        window after a try is in, take the other way if the try beat both windows around it."""
        seen = self.keys[key]
        where = self._window(seen.calls if call is None else call)
        if where is None:
            return
        cycle, window, _ = where
        per_byte = seconds / max(nbytes, 1)
        seen.times[way].append(per_byte)
        if seen.cycle != cycle:
            if seen.cycle is not None and cycle > seen.cycle:
                self._decide(seen)   # a cycle whose last window's end went untimed
            if seen.cycle is not None and cycle < seen.cycle:
                return               # (a late time of a closed cycle)
            seen.cycle, seen.windows = cycle, ([], [], [])
        if way != (1 - seen.preferred if window == TRIAL else seen.preferred):
            return   # a call made before the way in use changed
        seen.windows[window].append(per_byte)
        if window == AFTER and len(seen.windows[AFTER]) == TRY - 1:
            self._decide(seen)

    def _decide(self, seen: _Calls) -> None:
        """Close the current cycle: switch if its try beat the way in use before and after it."""
        before, trial, after = seen.windows
        seen.windows = ([], [], [])
        if min(len(before), len(trial), len(after)) < 3:
            return   # too few timed calls (other work came between them): no verdict
        if _median(trial) < min(_median(before), _median(after)) * (1 - self.margin):
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


def _median(times) -> float:
    ordered = sorted(times)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
