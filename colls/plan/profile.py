"""`Profile`: one machine at one number of ranks as `colls run -n N -m colls.tune --profile` measured
it (`colls.tune_profile`), read into the tables the shared-memory model prices messages, exchanges,
copies and waits with (`colls.plan.shared_memory`)."""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass

import numpy as np

from transports.shm import (
    exchange_rendezvous_bytes,
    fifo_geometry,
    rendezvous_bytes,
)

# How several runs of one measurement combine: their median, or the fastest (other jobs on a shared
# machine only ever slow a run down, and the model has no term for them).
COMBINE = {"median": lambda values: float(np.median(values)), "fastest": lambda values: float(min(values))}


def _interpolate(table: list[tuple[int, float]], nbytes: int) -> float:
    """A per-byte cost at `nbytes`, linear in log(size) between measured sizes, flat beyond them."""
    sizes = [size for size, _ in table]
    if nbytes <= sizes[0]:
        return table[0][1]
    if nbytes >= sizes[-1]:
        return table[-1][1]
    i = bisect.bisect_right(sizes, nbytes) - 1
    (low, below), (high, above) = table[i], table[i + 1]
    weight = math.log(nbytes / low) / math.log(high / low)
    return below + (above - below) * weight


def _linear(points: list[tuple[int, float]], nbytes: int) -> float:
    """Seconds at `nbytes` from measured (bytes, seconds): linear in bytes between the sizes around
    it, the last two's slope beyond them, the first size's time below it (never below zero)."""
    sizes = [size for size, _ in points]
    if nbytes <= sizes[0] or len(points) == 1:
        return points[0][1]
    i = min(bisect.bisect_right(sizes, nbytes) - 1, len(points) - 2)
    (low, t_low), (high, t_high) = points[i], points[i + 1]
    return max(0.0, t_low + (nbytes - low) * (t_high - t_low) / (high - low))


@dataclass(frozen=True)
class Profile:
    """One machine at one number of ranks, as `colls.tune_profile.profile` measured it (see there)."""

    ranks: int
    cores: int
    message: tuple[tuple[int, float], ...]     # (bytes, one-way seconds), sorted
    start: float
    call: dict[str, float]
    reduce: tuple[tuple[int, float], ...]      # (bytes, seconds per byte)
    copy: tuple[tuple[int, float], ...]
    spin: float = 0.0
    wake: float = 0.0
    rendezvous: int = 64 << 10
    alloc: tuple[tuple[int, float], ...] = ((1, 0.0),)
    post: float = 0.0
    # (bytes, seconds of both ranks exchanging that many in one sendrecv): below the rendezvous size
    # the whole step as the schedules make it, from it two cross-memory reads at once
    exchange: tuple[tuple[int, float], ...] = ()
    # the same two, from send buffers the sender has just written (dirty in its cache)
    written: tuple[tuple[int, float], ...] = ()
    exchange_written: tuple[tuple[int, float], ...] = ()
    receive_reduce: float = 0.0   # a reducing receive's software beyond a plain receive's
    one_slot_spin: float | None = None   # the spin of a wait in a one-slot sendrecv (None: `spin`)
    one_slot_wake: float | None = None   # and getting the core back from it (None: `wake`)
    # one numpy sum's or copy's own cost (an 8 B one): the tables above less it, per byte, are
    # what a byte adds; the simulator charges it once per call of the algorithm code
    reduce_call: float = 0.0
    copy_call: float = 0.0
    exchange_reduce: tuple[tuple[int, float], ...] = ()   # the exchanges with a float32 sum
    exchange_after_copy: tuple[tuple[int, float], ...] = ()   # right after a copy of as many bytes
    exchange_reduce_source: tuple[tuple[int, float], ...] = ()   # input ∘ incoming (`from_source`)
    # a sendrecv of at least this many bytes moves by cross-memory attach, as a plain message from
    # `rendezvous` (the transport's while the profile was measured, else the shm transport's
    # `exchange_rendezvous_bytes` here; 0: `rendezvous`)
    exchange_rendezvous: int = 0
    reduce_exchange_rendezvous: int = 0
    # (bytes, seconds the sender of one FIFO message spends posting it and copying it in), below
    # the rendezvous size; empty: a send keeps its sender only for `post`
    send: tuple[tuple[int, float], ...] = ()
    # how long a rank waiting in MPI's barrier keeps its core before it yields (`colls bench`'s
    # ranks wait there once their call has returned); None: unmeasured, as long as colls' `spin`
    barrier_hold: float | None = None
    # (bytes, seconds) of plain sendrecvs sent from huge pages, as `colls bench`'s buffers are from
    # 4 MiB (`colls.bench.cases.fresh_array`): they have an exchange threshold of their own
    # (`transports.shm.exchange_huge_bytes`); `exchange` holds them in small pages below 4 MiB
    exchange_huge: tuple[tuple[int, float], ...] = ()
    # (bytes, seconds) a rank's write of that many bytes of a buffer costs on top of a plain one when
    # a rank on another core has just read them by cross-memory attach, both ranks writing at once
    # (`colls.tune_probes.rewrite_after_read_seconds`); empty: unmeasured, nothing
    rewrite: tuple[tuple[int, float], ...] = ()
    # the size a plain exchange from huge pages moves by cross-memory attach from
    # (`exchange_huge_bytes`; 0: unknown)
    exchange_huge_rendezvous: int = 0
    # (bytes, seconds) of the exchanges a planned small call makes, persistent (`colls.tune_probes.
    # persistent_exchange_seconds`): plain into another buffer, and a float32 sum in place
    exchange_persistent: tuple[tuple[int, float], ...] = ()
    exchange_persistent_reduce: tuple[tuple[int, float], ...] = ()

    @classmethod
    def load(cls, paths: list[str], runs: str = "median") -> Profile:
        """Several profile files (all measured at the same ranks) in one: each number's median over
        them, or (`runs="fastest"`) its smallest."""
        combine = COMBINE[runs]
        entries = [json.loads(open(path).read()) for path in paths]
        ranks = {entry["ranks"] for entry in entries}
        if len(ranks) != 1:
            raise ValueError(f"profiles of different rank counts {sorted(ranks)} given together")

        def median_table(field: str) -> tuple[tuple[int, float], ...]:
            sizes = sorted({int(size) for entry in entries for size in entry[field]})
            return tuple((size, combine([e[field][str(size)] for e in entries if str(size) in e[field]]))
                         for size in sizes)

        calls = {name for entry in entries for name in entry["call_s"]}
        size = ranks.pop()
        cores = int(entries[0]["cores"])
        chunk, slots = fifo_geometry(size)
        return cls(size, cores, median_table("message_s"),
                   combine([entry["start_s"] for entry in entries]),
                   {name: combine([e["call_s"][name] for e in entries if name in e["call_s"]])
                    for name in calls},
                   median_table("reduce_s_per_byte"), median_table("copy_s_per_byte"),
                   combine([entry.get("spin_s", 0.0) for entry in entries]),
                   combine([entry.get("wake_s", 0.0) for entry in entries]),
                   rendezvous_bytes(*fifo_geometry(size)),
                   median_table("alloc_s_per_byte") if all("alloc_s_per_byte" in e for e in entries)
                   else ((1, 0.0),), combine([entry.get("post_s", 0.0) for entry in entries]),
                   median_table("exchange_s") if all(e.get("exchange_s") for e in entries) else (),
                   median_table("message_written_s") if all(e.get("message_written_s") for e in entries)
                   else (),
                   median_table("exchange_written_s") if all(e.get("exchange_written_s") for e in entries)
                   else (),
                   combine([e["receive_reduce_s"] for e in entries])
                   if all("receive_reduce_s" in e for e in entries) else 0.0,
                   *(combine([e[name] for e in entries]) if all(name in e for e in entries) else None
                     for name in ("one_slot_spin_s", "one_slot_wake_s")),
                   *(combine([e.get(name, 0.0) for e in entries])
                     for name in ("reduce_call_s", "copy_call_s")),
                   median_table("exchange_reduce_s") if all(e.get("exchange_reduce_s") for e in entries)
                   else (),
                   median_table("exchange_after_copy_s")
                   if all(e.get("exchange_after_copy_s") for e in entries) else (),
                   median_table("exchange_reduce_source_s")
                   if all(e.get("exchange_reduce_source_s") for e in entries) else (),
                   *(int(combine([e["exchange_cma_bytes"][kind] for e in entries]))
                     if all(kind in e.get("exchange_cma_bytes", {}) for e in entries)
                     else exchange_rendezvous_bytes(chunk, slots, kind == "reducing", size > cores)
                     for kind in ("plain", "reducing")),
                   send=median_table("send_s") if all(e.get("send_s") for e in entries) else (),
                   barrier_hold=combine([e["barrier_hold_s"] for e in entries])
                   if all(e.get("barrier_hold_s") is not None for e in entries) else None,
                   exchange_huge=median_table("exchange_huge_s")
                   if all(e.get("exchange_huge_s") for e in entries) else (),
                   rewrite=median_table("rewrite_after_read_s")
                   if all(e.get("rewrite_after_read_s") for e in entries) else (),
                   exchange_huge_rendezvous=int(combine([e["exchange_cma_bytes"]["plain_huge"]
                                                         for e in entries]))
                   if all("plain_huge" in e.get("exchange_cma_bytes", {}) for e in entries) else 0,
                   **{name: median_table(f"{name}_s") if all(e.get(f"{name}_s") for e in entries) else ()
                      for name in ("exchange_persistent", "exchange_persistent_reduce")})

    def message_cost(self, nbytes: int) -> tuple[float, float]:
        """(α, β) of one message of `nbytes`: the measured one-way times of its protocol, linear in
        bytes between the two measured sizes around it (the last two beyond them)."""
        fifo = nbytes < self.rendezvous
        points = [(size, t) for size, t in self.message if (size < self.rendezvous) == fifo]
        if len(points) < 2:   # a protocol measured at one size only: all of it is α
            size, seconds = points[0] if points else self.message[0]
            return seconds, 0.0
        sizes = [size for size, _ in points]
        i = min(max(bisect.bisect_right(sizes, nbytes) - 1, 0), len(points) - 2)
        (low, t_low), (high, t_high) = points[i], points[i + 1]
        beta = max(0.0, (t_high - t_low) / (high - low))
        alpha = t_low - low * beta
        if alpha < 0:   # the line through the two points passes below zero: keep the time, drop α
            alpha, beta = 0.0, (t_low + (nbytes - low) * beta) / max(nbytes, 1)
        return alpha, beta

    def send_seconds(self, nbytes: int) -> float | None:
        """How long a FIFO send of `nbytes` keeps its sender busy (posting, copying in): linear in
        bytes between the measured sizes around it; None from the rendezvous size or unmeasured."""
        points = [(size, t) for size, t in self.send if size < self.rendezvous]
        if nbytes >= self.rendezvous or not points:
            return None
        return _linear(points, nbytes)

    def exchange_limit(self, reducing: bool | str = False) -> int:
        """The smallest sendrecv (reducing or plain) that moves by cross-memory attach."""
        limit = self.reduce_exchange_rendezvous if reducing else self.exchange_rendezvous
        return limit or self.rendezvous

    def exchange_seconds(self, nbytes: int, reducing: bool | str = False, written: bool = False,
                         after_work: bool = False) -> float | None:
        """A sendrecv of `nbytes` below its rendezvous size (`exchange_limit`), the whole step (both
        ranks send and receive, as shm's one-slot path does them together; `reducing`: the receive a float32
        sum, `"source"` one from a third buffer (`Op.from_source`); `after_work`: right after a
        copy or reduction of as many bytes or more; `written`: from
        send buffers their senders have just written; each where measured, in that order): linear
        in bytes between the measured sizes around it, the last two's slope beyond them; None if
        the profile measured none."""
        table = self.exchange
        limit = self.exchange_limit(reducing)
        below = lambda measured: any(size < limit for size, _ in measured)  # noqa: E731
        if reducing == "source" and self.exchange_reduce_source:
            table = self.exchange_reduce_source
        elif reducing and self.exchange_reduce:
            table = self.exchange_reduce
        elif after_work and below(self.exchange_after_copy):
            table = self.exchange_after_copy
        elif written and below(self.exchange_written):
            table = self.exchange_written
        points = [(size, t) for size, t in table if size < limit]
        return _linear(points, nbytes) if points else None

    def contention(self, nbytes: int) -> float:
        """How much slower per byte a cross-memory read of `nbytes` is while another runs: from the
        exchange of that size (each rank posts, then reads while the other reads), at least 1."""
        return self._slower(self.exchange, nbytes, self.post, self.exchange_limit())

    def written_slowdown(self, nbytes: int) -> float:
        """How much slower per byte a cross-memory read of `nbytes` is from a buffer its sender has
        just written (one message of a written buffer beside a clean one), at least 1."""
        return self._slower(self.written, nbytes, 0.0, self.rendezvous)

    def written_contention(self, nbytes: int) -> float:
        """The same for a read while another runs (the exchange of written buffers); at least the
        clean exchange's."""
        if not self.exchange_written:
            return self.contention(nbytes)
        return max(self.contention(nbytes),
                   self._slower(self.exchange_written, nbytes, self.post, self.exchange_limit()))

    def _slower(self, table: tuple[tuple[int, float], ...], nbytes: int, post: float, limit: int) -> float:
        """Per byte, the times of `table` (less `post` and the message's α) over one clean message's
        β, from the sizes it measured by cross-memory attach (`limit` on)."""
        ratios = []
        for size, seconds in table:
            if size < limit:   # FIFO sizes: no cross-memory read to slow down
                continue
            alpha, beta = self.message_cost(size)
            if beta > 0:
                ratios.append((size, max(1.0, (seconds - post - alpha) / size / beta)))
        return _interpolate(ratios, nbytes) if ratios else 1.0

    def rewrite_seconds(self, nbytes: int) -> float:
        """What writing `nbytes` that a rank on another core has just read adds to the write: linear
        between the measured sizes (the last two's slope beyond them, proportional below the
        smallest), at least 0."""
        table = self.rewrite
        if not table:
            return 0.0
        if nbytes <= table[0][0]:
            return max(0.0, table[0][1] * nbytes / table[0][0])
        return max(0.0, _linear(list(table), nbytes))

    def reduce_seconds_per_byte(self, nbytes: int) -> float:
        """γ for a call of `nbytes` (what a byte adds to a sum beyond the sum's own `reduce_call`)."""
        return max(0.0, _interpolate(list(self.reduce), nbytes) - self.reduce_call / max(nbytes, 1))

    def copy_seconds_per_byte(self, nbytes: int) -> float:
        """Seconds per byte of a local copy in a call of `nbytes` (beyond the copy's `copy_call`)."""
        return max(0.0, _interpolate(list(self.copy), nbytes) - self.copy_call / max(nbytes, 1))

    def copy_slowdown(self, nbytes: int, footprint: int) -> float:
        """How many times longer a byte of a copy takes among `footprint` bytes than among `nbytes`
        (at least 1): the local copies' per-byte times, call software and all (so a small piece's
        is no smaller than a big one's), at the two sizes."""
        table = list(self.copy)
        piece = _interpolate(table, max(nbytes, 1))
        return max(1.0, _interpolate(table, footprint) / piece) if piece > 0 else 1.0

    def alloc_seconds_per_byte(self, nbytes: int) -> float:
        """Seconds per byte of first touching a new buffer of `nbytes` (the algorithms' scratch)."""
        return _interpolate(list(self.alloc), nbytes)
