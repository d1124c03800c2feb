"""What a session prints: a live progress line, the summary table, and a failure's full story."""

from __future__ import annotations

import sys
import time
from typing import IO

from .session import Found, Session, Stats, Verdict

PLAIN_PERIOD_S = 10.0   # without a terminal: one progress line this often
TTY_PERIOD_S = 0.1


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def plural(count: int, noun: str) -> str:
    """`1 step`, `3 steps`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def status_line(stats: Stats, transport: str, shrinking: bool) -> str:
    """`shm  412 programs  2,031 ops  1.2 GiB checked  0 failures  38.1 programs/s  11 s`."""
    elapsed = max(stats.elapsed, 1e-9)
    line = (f"{transport}  {stats.programs:,} programs  {stats.steps:,} ops  "
            f"{human_bytes(stats.total_bytes)} checked  {stats.failures} failures  "
            f"{stats.programs / elapsed:.1f} programs/s  {elapsed:.0f} s")
    if shrinking:
        line += f"  (shrinking: {stats.shrink_runs} runs)"
    return line


class Progress:
    """Rewrites one line on a terminal; elsewhere prints a line every PLAIN_PERIOD_S seconds."""

    def __init__(self, transport: str, stream: IO[str] | None = None, quiet: bool = False) -> None:
        self.transport = transport
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.quiet = quiet
        self.last = 0.0 if self.tty else time.monotonic()
        self.width = 0

    def __call__(self, session: Session) -> None:
        now = time.monotonic()
        if self.quiet or now - self.last < (TTY_PERIOD_S if self.tty else PLAIN_PERIOD_S):
            return
        self.last = now
        self.show(status_line(session.stats, self.transport, session.shrinking))

    def show(self, line: str) -> None:
        if self.tty:
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        """End the live line so that what follows starts on a fresh one."""
        if self.tty and self.width and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()


def summary(stats: Stats, transport: str, ranks: str) -> str:
    """The table printed at the end: calls and bytes checked per collective, then the totals."""
    rows = [("collective", "calls", "bytes checked")]
    for kind in sorted(stats.calls, key=lambda k: -stats.calls[k]):
        rows.append((kind, f"{stats.calls[kind]:,}", human_bytes(stats.bytes.get(kind, 0))))
    widths = [max(len(row[c]) for row in rows) for c in range(3)]
    lines = [f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}" for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    elapsed = max(stats.elapsed, 1e-9)
    lines.append("-" * len(lines[0]))
    lines.append(f"{stats.programs:,} programs ({stats.programs / elapsed:.1f}/s), {stats.steps:,} ops, "
                 f"{human_bytes(stats.total_bytes)} checked on {transport} with {ranks} ranks in "
                 f"{elapsed:.1f} s; {stats.failures} failing programs"
                 + (f" ({stats.shrink_runs} shrink runs)" if stats.shrink_runs else ""))
    return "\n".join(lines)


def describe_failure(verdict: Verdict) -> str:
    """'rank 1, step 0 all_reduce(...): wrong result: ...' plus the other ranks' failures, briefly."""
    primary = verdict.primary
    if primary is None:
        return "passed"
    step = f"step {primary['step']} {primary['label']}" if primary["step"] >= 0 else "no step reached"
    lines = [f"rank {primary['rank']}, {step}: {primary['kind']}: {primary['message']}"]
    if primary.get("detail"):
        lines += ["    " + line for line in primary["detail"].rstrip().splitlines()]
    others = [f for f in verdict.failures if f is not primary]
    for failure in others[:6]:
        lines.append(f"  also rank {failure['rank']}, step {failure['step']}: {failure['kind']}: "
                     f"{failure['message'][:160]}")
    if len(others) > 6:
        lines.append(f"  and {len(others) - 6} more")
    return "\n".join(lines)


def failure_story(found: Found, transport: str, snippet: str, replay: str) -> str:
    """Everything a failing session prints after its progress line."""
    program = found.program
    how = "did not fail again when rerun (flaky); smallest failing program seen" if found.flaky else \
        f"shrunk in {found.shrink_runs} runs ({found.shrink_seconds:.1f} s)"
    lines = [
        f"FAILED on {transport}: {describe_failure(found.verdict)}",
        "",
        f"found after {plural(found.programs_to_detect, 'program')} (the first had "
        f"{plural(found.first.collective_steps(), 'step')} on {found.first.size} ranks); {how} to "
        f"{plural(program.collective_steps(), 'step')} on {program.size} ranks:",
        "",
        snippet.rstrip(),
        "",
        f"replay: {replay}",
    ]
    return "\n".join(lines)
