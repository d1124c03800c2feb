"""A fuzzing session: hypothesis draws programs, a group runs them, failures shrink to a minimal one.

Hypothesis runs in batches of `BATCH` examples, each batch seeded from the session seed, so that a
session is reproducible and can stop on time; the first failing program ends generation and
hypothesis shrinks it (bounded by `shrink_seconds`). Its database is off: a session never depends
on what an earlier one saw, and a failure is replayed from its printed token instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from .groups import SLACK_S
from .program import Program, Space, programs

BATCH = 200
PRIORITY = {"wrong result": 0, "ranks differ": 1, "crash": 2, "timeout": 3, "hang": 4, "peer lost": 5,
            "aborted": 6}


@dataclass
class Verdict:
    """Everything the ranks reported about one program, and whether it passed."""

    failures: list[dict[str, Any]]
    calls: dict[str, int]
    bytes: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def primary(self) -> dict[str, Any] | None:
        """The failure that explains the others: a cause before an abort it set off, then the earliest
        step, then a wrong result before a timeout.

        An abort is always another rank's failure arriving; it can reach a rank still finishing an
        earlier step (a barrier's last message in flight), so its step says nothing about the cause.
        """
        if not self.failures:
            return None
        return min(self.failures, key=lambda f: (f["kind"] == "aborted",
                                                 f["step"] if f["step"] >= 0 else 1 << 30,
                                                 PRIORITY.get(f["kind"], 9), f["rank"]))


def judge(program: Program, reports: list[dict[str, Any] | None], deadline_s: float) -> Verdict:
    """The verdict on one run: every rank's failures, silent ranks, and results that differ by rank."""
    failures: list[dict[str, Any]] = []
    calls: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    digests: dict[str, dict[str, list[int]]] = {}
    for rank, report in enumerate(reports):
        if report is None:
            failures.append({"rank": rank, "step": -1, "kind": "hang", "label": "", "detail": "",
                             "message": f"gave no report within {deadline_s + SLACK_S:g} s (killed)"})
            continue
        failures += report.get("failures", [])
        for kind, count in report.get("calls", {}).items():
            calls[kind] = max(calls.get(kind, 0), count)
        for kind, count in report.get("bytes", {}).items():
            nbytes[kind] = nbytes.get(kind, 0) + count
        for key, value in report.get("digests", {}).items():
            digests.setdefault(key, {}).setdefault(value, []).append(rank)
    for key, by_value in digests.items():
        if len(by_value) > 1:
            step = int(key.split("/")[0])
            groups = sorted(by_value.values(), key=len)
            failures.append({"rank": groups[0][0], "step": step, "kind": "ranks differ", "detail": "",
                             "label": program.steps[step].label(),
                             "message": f"ranks {groups[0]} hold different bytes from ranks {groups[-1]}"})
    return Verdict(failures, calls, nbytes)


class ProgramFailed(Exception):
    """Raised inside the hypothesis test so that it shrinks; carries the program and its verdict."""

    def __init__(self, program: Program, verdict: Verdict) -> None:
        super().__init__(f"{program.collective_steps()} steps on {program.size} ranks failed")
        self.program = program
        self.verdict = verdict


@dataclass
class Stats:
    """Counts for the progress line and the summary table."""

    started: float = field(default_factory=time.monotonic)
    programs: int = 0
    steps: int = 0
    failures: int = 0
    shrink_runs: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    def add(self, program: Program, verdict: Verdict) -> None:
        self.programs += 1
        self.steps += program.collective_steps()
        self.failures += not verdict.ok
        for kind, count in verdict.calls.items():
            self.calls[kind] = self.calls.get(kind, 0) + count
        for kind, count in verdict.bytes.items():
            self.bytes[kind] = self.bytes.get(kind, 0) + count

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


@dataclass
class Found:
    """The outcome of a failing session: the shrunk program and how it was found."""

    program: Program
    verdict: Verdict
    first: Program
    programs_to_detect: int
    shrink_runs: int
    shrink_seconds: float
    flaky: bool = False


class Session:
    """Draw, run and judge programs until the budget is spent or one fails (then shrink it)."""

    def __init__(self, group, space: Space, *, seed: int = 0, programs: int | None = None,
                 seconds: float | None = None, deadline_s: float = 30.0, shrink_seconds: float = 120.0,
                 on_progress=None) -> None:
        self.group = group
        self.space = space
        self.seed = seed
        self.budget_programs = programs
        self.budget_seconds = seconds
        self.deadline_s = deadline_s
        self.shrink_seconds = shrink_seconds
        self.on_progress = on_progress or (lambda session: None)
        self.stats = Stats()
        self.first: Program | None = None
        self.detected_after = 0
        self.shrink_started = 0.0
        self.failing: dict[str, Verdict] = {}
        self.passing: set[str] = set()
        self.smallest: tuple[Program, Verdict] | None = None

    @property
    def shrinking(self) -> bool:
        return self.first is not None

    def spent(self) -> bool:
        """Whether the generation budget (programs or seconds) is used up."""
        if self.budget_programs is not None and self.stats.programs >= self.budget_programs:
            return True
        return self.budget_seconds is not None and self.stats.elapsed >= self.budget_seconds

    def run_one(self, program: Program) -> Verdict:
        """Run one program on the group and judge it."""
        verdict = judge(program, self.group.run(program, self.deadline_s), self.deadline_s)
        if self.shrinking:
            self.stats.shrink_runs += 1
        else:
            self.stats.add(program, verdict)
        self.on_progress(self)
        return verdict

    def _test(self, program: Program) -> None:
        """The hypothesis test body: one raise statement, so hypothesis sees one kind of failure."""
        verdict = self._verdict(program)
        if verdict is not None and not verdict.ok:
            raise ProgramFailed(program, verdict)

    def _verdict(self, program: Program) -> Verdict | None:
        """Run `program` (None: skipped, the budget being spent) and keep track of failures."""
        key = program.to_json()
        if self.shrinking:
            # many choice sequences normalise to one program: run each program once while shrinking
            if key in self.failing:
                return self.failing[key]
            if key in self.passing or time.monotonic() - self.shrink_started > self.shrink_seconds:
                return None   # (out of time: only the known failures still fail)
        elif self.spent():
            return None
        verdict = self.run_one(program)
        if verdict.ok:
            if self.shrinking and len(self.passing) < 100_000:
                self.passing.add(key)
            return verdict
        if not self.shrinking:
            self.first, self.detected_after = program, self.stats.programs
            self.shrink_started = time.monotonic()
        if len(self.failing) < 10_000:
            self.failing[key] = verdict
        if self.smallest is None or _weight(program) < _weight(self.smallest[0]):
            self.smallest = (program, verdict)
        return verdict

    def run(self) -> Found | None:
        """Fuzz until the budget is spent; the shrunk failure, or None if every program passed."""
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis import seed as seeded

        strategy = programs(self.space)
        batch = 0
        while not self.spent():
            test = given(strategy)(self._test)
            test = settings(database=None, max_examples=BATCH, deadline=None, derandomize=False,
                            suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink),
                            report_multiple_bugs=False, verbosity=Verbosity.quiet, print_blob=False)(test)
            test = seeded(self.seed * 1_000_003 + batch)(test)
            batch += 1
            before = self.stats.programs
            try:
                test()
            except ProgramFailed as failure:
                return self._found(failure.program, failure.verdict, flaky=False)
            except Exception:
                if self.smallest is None:
                    raise
                return self._found(*self.smallest, flaky=True)   # it did not fail again when rerun
            if self.stats.programs == before:
                break   # hypothesis has nothing new to draw in so small a space
        return None

    def _found(self, program: Program, verdict: Verdict, flaky: bool) -> Found:
        assert self.first is not None
        if not flaky:
            program, verdict = self._delete_steps(program, verdict)
        return Found(program, verdict, self.first, self.detected_after, self.stats.shrink_runs,
                     time.monotonic() - self.shrink_started, flaky)

    def _delete_steps(self, program: Program, verdict: Verdict) -> tuple[Program, Verdict]:
        """Finish the shrink by deleting single steps while the program still fails.

        Hypothesis deletes trailing steps readily but rarely a leading one, because every later
        step's inputs are derived from its index and so change; one pass of plain deletion
        (Zeller's delta debugging with chunks of one) removes what is left over.
        """
        index = 0
        while index < len(program.steps) and len(program.steps) > 1:
            if time.monotonic() - self.shrink_started > self.shrink_seconds:
                break
            candidate = without_step(program, index)
            if candidate is None:
                index += 1
                continue
            attempt = self.run_one(candidate)
            if attempt.ok:
                index += 1
            else:
                program, verdict = candidate, attempt   # keep the deletion; retry at the same index
        return program, verdict


def without_step(program: Program, index: int) -> Program | None:
    """`program` less step `index` (a split only if no later step uses its communicator)."""
    removed = program.steps[index]
    later = program.steps[index + 1:]
    if removed.kind == "split":
        number = 1 + sum(s.kind == "split" for s in program.steps[:index])
        if any(s.comm == number for s in later):
            return None
        later = tuple(replace(s, comm=s.comm - (s.comm > number)) for s in later)
    return replace(program, steps=program.steps[:index] + tuple(later))


def _weight(program: Program) -> tuple[int, int, int]:
    """What 'smaller' means for a failing program: fewer steps, fewer ranks, fewer rows."""
    return program.collective_steps(), program.size, sum(s.rows for s in program.steps)
