"""Check the simulator against measured times: `colls plan calibrate --bench FILE.json --profile FILE`.

The measured side is a `colls bench --json` file (median of the slowest rank's time per size), read
here, by machine mode, run and placement; the predicted side is `colls.plan.shared_memory.predict`
over the `Profile` measured at the same number of ranks. `compare` pairs them into `Point`s, and
`summary` and `table` report the errors.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from .profile import COMBINE, Profile
from .shared_memory import predict


@dataclass(frozen=True)
class Point:
    """One measured size beside its prediction."""

    collective: str
    algorithm: str
    ranks: int
    nbytes: int
    measured: float
    predicted: float
    placement: tuple[int, ...] | None = None   # `colls bench --pin`: each rank's core

    @property
    def error(self) -> float:
        """Relative error of the prediction."""
        return self.predicted / self.measured - 1


Window = tuple[float, float] | dict[str, tuple[float, float]] | None   # a machine mode: see `in_mode`


def in_mode(entry: dict, window: Window) -> bool:
    """Whether a profile or a bench record was measured in the machine mode `window`: (lo, hi) for
    the cache-line round trips taken before and after it (`round_trip_ns`, `colls.bench.machine`),
    all within [lo, hi); or {field: (lo, hi)} for each of several such fields (`round_trip_ns`,
    `exchange_us`). No window: everything; a window: nothing that has no such measurement."""
    if window is None:
        return True
    bounds = window if isinstance(window, dict) else {"round_trip_ns": window}
    for field, (low, high) in bounds.items():
        values = [value for value in entry.get(field) or [] if value is not None]
        if not values or not all(low <= value < high for value in values):
            return False
    return True


def load_profiles(paths: list[str], runs: str = "median",
                  window: Window = None) -> dict[int, Profile]:
    """Profiles by rank count (those measured in the mode `window`, see `in_mode`); several files
    of one rank count combine as `runs` says."""
    by_ranks: dict[int, list[str]] = {}
    for path in paths:
        entry = json.loads(open(path).read())
        if in_mode(entry, window):
            by_ranks.setdefault(int(entry["ranks"]), []).append(path)
    return {ranks: Profile.load(files, runs) for ranks, files in by_ranks.items()}


def measured_runs(bench_paths: list[str], window: Window = None,
                  by_placement: bool = False) -> dict[tuple, list[float]]:
    """(collective, algorithm, ranks, bytes, placement) -> each bench run's median, in the files'
    order (of the points measured in the mode `window`, see `in_mode`); placement: the ranks' cores
    as `colls bench --pin` recorded them, None unpinned; with `by_placement`, an unpinned run's
    where the bench saw its ranks (`seen_placement`; None where it did not record it)."""
    found: dict[tuple, list[float]] = {}
    for record in colls_records(bench_paths, window):
        placement = tuple(record["placement"]) if record.get("placement") else None
        if placement is None and by_placement:
            placement = seen_placement(record)
        key = (record["collective"], record["algorithm"], record["ranks"], record["bytes"], placement)
        found.setdefault(key, []).append(record["time_median_s"])
    return found


def colls_records(bench_paths: list[str], window: Window = None):
    """The colls rows of the bench files, in their order, those measured in the mode `window`."""
    for path in bench_paths:
        for record in json.loads(open(path).read())["records"]:
            if record.get("implementation") == "colls" and in_mode(record, window):
                yield record


def seen_placement(record: dict) -> tuple[int, ...] | None:
    """Each rank's core through an unpinned bench point, as `colls bench` saw them (`cpus`: each
    rank's CPU as the point began and ended), the cores numbered in the order the ranks first name
    them; None where not recorded or where a rank was on another CPU at the end (a rank may still
    have run a while on the other core in between)."""
    cpus = record.get("cpus")
    if not cpus or any(first != last for first, last in cpus):
        return None
    numbers: dict[int, int] = {}
    return tuple(numbers.setdefault(first, len(numbers)) for first, _ in cpus)


def placements_seen(bench_paths: list[str], window: Window = None) -> dict[int, dict[str, int]]:
    """By rank count, how many unpinned bench points ran at each placement (`seen_placement`,
    written as each rank's core in turn; "-": not recorded, or a rank moved)."""
    counts: dict[int, dict[str, int]] = {}
    for record in colls_records(bench_paths, window):
        if not record.get("placement"):   # (pinned ones are where `--pin` put them)
            seen = seen_placement(record)
            label = "".join(map(str, seen)) if seen else "-"
            tally = counts.setdefault(record["ranks"], {})
            tally[label] = tally.get(label, 0) + 1
    return counts


def measured_medians(bench_paths: list[str], runs: str = "median", window: Window = None,
                     by_placement: bool = False) -> dict[tuple, float]:
    """(collective, algorithm, ranks, bytes, placement) -> the median (or fastest) of several bench
    runs' medians (see `measured_runs`)."""
    found = measured_runs(bench_paths, window, by_placement)
    return {key: COMBINE[runs](times) for key, times in found.items()}


def reproducibility(bench_paths: list[str], runs: str = "median", window: Window = None,
                    by_placement: bool = False) -> dict[int, tuple[float, float, int]]:
    """How closely the bench files agree with themselves, by rank count: every point's runs split
    into alternate halves (1st, 3rd, ... against 2nd, 4th, ...), each half combined as `runs` says,
    then the two compared as a prediction is (`summary`): (geometric-mean error, largest, points).
    No model of these runs can be shown closer than this; points with one run are left out."""
    logs: dict[int, list[float]] = {}
    for key, times in measured_runs(bench_paths, window, by_placement).items():
        if len(times) >= 2:
            first, second = COMBINE[runs](times[0::2]), COMBINE[runs](times[1::2])
            logs.setdefault(key[2], []).append(abs(math.log(second / first)))
    return {ranks: (math.exp(float(np.mean(values))) - 1, math.exp(max(values)) - 1, len(values))
            for ranks, values in logs.items()}


def batches_apart(batches: list[list[str]], runs: str = "median", window: Window = None,
                  by_placement: bool = False) -> dict[int, tuple[float, float, int]]:
    """How far apart several batches of bench files are, by rank count: every point measured in all
    of them predicted at the middle (in ratio) of the batches' figures for it (each batch's runs
    combined as `runs` says), against each batch's figure, as `summary` compares: (geometric-mean
    error, largest, points). A model that predicts a point alike for every batch (from profiles
    alike) can be no closer to all of them than this."""
    figures = [measured_medians(paths, runs, window, by_placement) for paths in batches]
    logs: dict[int, list[float]] = {}
    for key in set(figures[0]).intersection(*figures[1:]):
        values = [batch[key] for batch in figures]
        middle = math.sqrt(min(values) * max(values))
        logs.setdefault(key[2], []).extend(abs(math.log(middle / value)) for value in values)
    return {ranks: (math.exp(float(np.mean(values))) - 1, math.exp(max(values)) - 1,
                    len(values) // len(batches)) for ranks, values in logs.items()}


def compare(bench_paths: list[str], profiles: dict[int, Profile], cores: int | None = None,
            runs: str = "median", window: Window = None, by_placement: bool = False) -> list[Point]:
    """Every colls row of the bench files (medians across files; those measured in the mode
    `window`) whose rank count has a profile, beside the prediction (at the row's placement when
    its ranks were pinned, or with `by_placement` where the bench saw them: a row per placement)."""
    points = []
    medians = measured_medians(bench_paths, runs, window, by_placement)
    pinned = {key for key in measured_runs(bench_paths, window) if key[4] is not None}
    for key, measured in sorted(medians.items(), key=_table_order):
        collective, algorithm, ranks, nbytes, placement = key
        if ranks in profiles:
            predicted = predict(collective, algorithm, ranks, nbytes, profiles[ranks], cores, placement,
                                key in pinned)
            points.append(Point(collective, algorithm, ranks, nbytes, measured, predicted, placement))
    return points


def _table_order(item: tuple) -> tuple:
    (collective, _, ranks, nbytes, placement), _ = item
    return ranks, collective, nbytes, placement or ()


def summary(points: list[Point]) -> tuple[float, float]:
    """(geometric-mean error, largest error) as fractions: exp(mean |ln(pred/meas)|) - 1."""
    logs = [abs(math.log(p.predicted / p.measured)) for p in points]
    return math.exp(float(np.mean(logs))) - 1, max(abs(p.error) for p in points)


def table(points: list[Point]) -> str:
    """The comparison as a Markdown table."""
    pinned = any(p.placement for p in points)
    lines = ["| collective | ranks | size | algorithm | " + ("cores | " if pinned else "")
             + "measured | predicted | error |",
             "| --- | --- | --- | --- | " + ("--- | " if pinned else "") + "--- | --- | --- |"]
    for p in points:
        size = f"{p.nbytes >> 20} MiB" if p.nbytes >= 1 << 20 else f"{p.nbytes >> 10} KiB"
        cores = ("".join(map(str, p.placement)) if p.placement else "-") + " | " if pinned else ""
        lines.append(f"| {p.collective} | {p.ranks} | {size} | {p.algorithm} | {cores}"
                     f"{p.measured * 1e6:.1f} us | {p.predicted * 1e6:.1f} us | {p.error * 100:+.1f}% |")
    return "\n".join(lines)
