"""Which of two protocols a message takes, from how long each took lately, not from a threshold
measured once.

The shm transport can move a big sendrecv through its FIFO's slots (two copies, the cache lines
handed from one core to the other) or by cross-memory attach (one copy, out of the peer's own
buffer). Which is faster depends on the machine's state, not only on the size. Measured 2026-12-05
on this project's 2-CPU VM, two ranks exchanging (`colls.tune.exchange_seconds`, medians of 20):
for minutes on end a 1 MiB exchange took 505 us through the slots and 102 us by cross-memory attach,
4 MiB 2100 against 280 us. Minutes earlier a `colls bench` all_to_all of 1 MiB had run its 512 KiB
exchanges through the slots in 55 us, and forcing cross-memory attach made it 78 us. The tune file's
threshold is right for the state it was measured in only.

So the transport asks a `ProtocolChoice` before each such call and tells it how long the call took.
Each kind of call (a key: the caller's, e.g. plain or reducing, and the size's power of two) keeps
the last few times of each protocol, per byte, and takes the protocol whose best recent time is
lower. The one not in use is tried on a call's second and third time and then every
`explore_every`-th call, so that a change of state is seen within that many calls; a wrong guess
costs one call in `explore_every`. This is how STAR-MPI (Faraj, Yuan & Lowenthal, ICS 2006) picks
among collective algorithms at run time, here applied to the protocols under one call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable


class _Calls:
    """What one key has seen: its calls so far, and the recent seconds per byte of each protocol."""

    __slots__ = ("calls", "preferred", "times")

    def __init__(self, preferred: bool, keep: int) -> None:
        self.calls = 0
        self.preferred = preferred
        self.times: tuple[deque[float], deque[float]] = (deque(maxlen=keep), deque(maxlen=keep))


class ProtocolChoice:
    """Choose between protocol False and protocol True per key, by their recent times.

    `choose(key, prior)` before a call (`prior`: the protocol to start with, e.g. a threshold's
    verdict), `record(key, protocol, seconds, nbytes)` after it. Times are per byte, so that calls
    of one key but different sizes compare."""

    def __init__(self, explore_every: int = 32, keep: int = 3, margin: float = 0.05) -> None:
        if explore_every < 4 or keep < 1 or not 0 <= margin < 1:
            raise ValueError(f"ProtocolChoice: explore_every >= 4, keep >= 1 and 0 <= margin < 1, got "
                             f"{explore_every}, {keep}, {margin}")
        self.explore_every = explore_every
        self.keep = keep
        self.margin = margin   # the other protocol must be this much faster to take over
        self.keys: dict[Hashable, _Calls] = {}

    def choose(self, key: Hashable, prior: bool) -> bool:
        """The protocol for the next call of `key`."""
        seen = self.keys.get(key)
        if seen is None:
            seen = self.keys[key] = _Calls(prior, self.keep)
        seen.calls += 1
        if seen.calls in (2, 3) or seen.calls % self.explore_every == 0:
            return not seen.preferred
        return seen.preferred

    def record(self, key: Hashable, protocol: bool, seconds: float, nbytes: int) -> None:
        """A call of `key` by `protocol` took `seconds`; switch if the other is now faster."""
        seen = self.keys[key]
        seen.times[protocol].append(seconds / max(nbytes, 1))
        ours, other = seen.times[seen.preferred], seen.times[not seen.preferred]
        if ours and other and min(other) < min(ours) * (1 - self.margin):
            seen.preferred = not seen.preferred

    def preferred(self, key: Hashable) -> bool | None:
        """The protocol `key` takes now (None: never called)."""
        seen = self.keys.get(key)
        return None if seen is None else seen.preferred

    def summary(self) -> dict[Hashable, tuple[bool, int, float | None, float | None]]:
        """Per key: (preferred protocol, calls, best recent seconds per byte of False, of True)."""
        return {key: (seen.preferred, seen.calls, *(min(times) if times else None for times in seen.times))
                for key, seen in self.keys.items()}
