"""Check the simulator against measured times: `colls plan calibrate --bench FILE.json --tune FILE`.

The measured side is a `colls bench --json` file (median of the slowest rank's time per size); the
predicted side runs the very algorithm each row used on the `sim` transport with the α, β and γ
that `colls tune` saved, over a model of shared memory on one machine:

- each rank copies in and out at 1/β (the ping-pong's per-byte cost, which holds both copies of
  the shm transport: into the segment and out of it) and the machine's `cores` CPUs are a link all
  flows cross, so 4 ranks streaming at once on 2 cores each get half;
- a local copy (the collective's input into its output) costs β/2 per byte, one copy of the two;
- reductions and copies, being CPU work too, are slowed by ranks/cores when ranks outnumber cores;
- optionally (`Extra`, measured with the same `colls.tune` functions, never fitted to the bench):
  a per-call software overhead, and β and γ at 64 MiB, where buffers no longer fit the caches;
  between 4 MiB (where `colls tune` measures) and 64 MiB the per-byte costs are interpolated on
  log(size).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from algorithms.cost import Machine
from transports.sim import Link, Route, SimTransport

from .simulate import run_algorithm, run_world


class SharedMemory:
    """One machine's ranks: a copy link per rank each way, and the CPUs shared by every flow."""

    def __init__(self, size: int, machine: Machine, cores: int) -> None:
        self.outgoing = [Link(f"rank{r}.out", 1 / machine.beta) for r in range(size)]
        self.incoming = [Link(f"rank{r}.in", 1 / machine.beta) for r in range(size)]
        self.cpus = Link("cpus", cores / machine.beta)
        self.alpha = machine.alpha

    def route(self, src: int, dst: int) -> Route:
        """Out of the sender, through the CPUs, into the receiver."""
        return Route(self.alpha, (self.outgoing[src], self.cpus, self.incoming[dst]))


@dataclass(frozen=True)
class Extra:
    """Constants beyond α, β, γ: seconds of software per call, β and γ of out-of-cache buffers."""

    call_overhead: float = 0.0
    beta_large: float | None = None
    gamma_large: float | None = None

    def at(self, machine: Machine, nbytes: int) -> Machine:
        """The machine's constants for a collective of `nbytes` (in cache up to 4 MiB)."""
        small, large = 4 << 20, 64 << 20
        weight = min(1.0, max(0.0, math.log(max(nbytes, 1) / small) / math.log(large / small)))

        def blend(near: float, far: float | None) -> float:
            return near if far is None else near * (far / near) ** weight

        return Machine(machine.alpha, blend(machine.beta, self.beta_large),
                       blend(machine.gamma, self.gamma_large))


@dataclass(frozen=True)
class Point:
    """One measured size beside its prediction."""

    collective: str
    algorithm: str
    ranks: int
    nbytes: int
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        """Relative error of the prediction."""
        return self.predicted / self.measured - 1


def predict(collective: str, algorithm: str, ranks: int, nbytes: int, machine: Machine,
            cores: int, extra: Extra = Extra()) -> float:
    """Seconds the simulator predicts for one `colls bench` call (the input copy included)."""
    crowding = max(1.0, ranks / cores)
    machine = extra.at(machine, nbytes)
    network = SharedMemory(ranks, machine, cores)

    def body(transport: SimTransport) -> int:
        transport.elapse(extra.call_overhead)   # describe, select, fingerprint: Python per call
        if collective == "all_reduce" or (collective == "broadcast" and transport.rank == 0):
            transport.elapse(nbytes * machine.beta / 2 * crowding)   # x copied into out first
        return run_algorithm(transport, collective, algorithm, nbytes)

    return run_world(ranks, network, body, machine.gamma * crowding,
                     machine.beta / 2 * crowding).seconds


def load_tune(path: str, transport: str = "shm") -> Machine:
    """α, β, γ from a `colls tune` file."""
    entry = json.loads(open(path).read())[transport]
    return Machine(float(entry["alpha"]), float(entry["beta"]), float(entry["gamma"]))


def measured_medians(bench_paths: list[str]) -> dict[tuple, float]:
    """(collective, algorithm, ranks, bytes) -> the median over several bench runs of their medians."""
    runs: dict[tuple, list[float]] = {}
    for path in bench_paths:
        for record in json.loads(open(path).read())["records"]:
            if record.get("implementation") == "colls":
                key = (record["collective"], record["algorithm"], record["ranks"], record["bytes"])
                runs.setdefault(key, []).append(record["time_median_s"])
    return {key: float(np.median(times)) for key, times in runs.items()}


def compare(bench_paths: list[str], machine: Machine, cores: int | None = None,
            extra: Extra = Extra()) -> list[Point]:
    """Every colls row of one or more bench JSON files (medians across files) beside the prediction."""
    cores = cores or os.cpu_count() or 1
    points = []
    for (collective, algorithm, ranks, nbytes), measured in measured_medians(bench_paths).items():
        predicted = predict(collective, algorithm, ranks, nbytes, machine, cores, extra)
        points.append(Point(collective, algorithm, ranks, nbytes, measured, predicted))
    return points


def summary(points: list[Point]) -> tuple[float, float]:
    """(geometric-mean error, largest error) as fractions: exp(mean |ln(pred/meas)|) - 1."""
    logs = [abs(math.log(p.predicted / p.measured)) for p in points]
    return math.exp(float(np.mean(logs))) - 1, max(abs(p.error) for p in points)


def table(points: list[Point]) -> str:
    """The comparison as a Markdown table."""
    lines = ["| collective | ranks | size | algorithm | measured | predicted | error |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in points:
        size = f"{p.nbytes >> 20} MiB" if p.nbytes >= 1 << 20 else f"{p.nbytes >> 10} KiB"
        lines.append(f"| {p.collective} | {p.ranks} | {size} | {p.algorithm} | {p.measured * 1e6:.1f} us "
                     f"| {p.predicted * 1e6:.1f} us | {p.error * 100:+.1f}% |")
    return "\n".join(lines)
