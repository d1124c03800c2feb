"""`colls fuzz`: random collective programs on real ranks, checked against numpy, shrunk on failure.

    from colls.fuzz import fuzz
    stats, found = fuzz("shm", programs=200, seed=1)   # found: None, or the shrunk failing program

The command line (`colls fuzz --help`) prints a progress line, a summary table and, for a failure,
a runnable snippet and the seed that `colls fuzz --replay SEED` reruns.
"""

from __future__ import annotations

from .groups import make_group
from .program import Program, Space, Step
from .session import Found, Session, Stats, Verdict, judge


def fuzz(transport: str = "local", ranks: tuple[int, int] = (2, 8), *, programs: int | None = None,
         seconds: float | None = None, seed: int = 0, deadline_s: float = 30.0,
         shrink_seconds: float = 120.0, **space) -> tuple[Stats, Found | None]:
    """Run one session in this process (local or shm; mpi needs `colls fuzz` under mpiexec)."""
    group = make_group(transport, ranks[1])
    try:
        session = Session(group, Space(ranks[0], ranks[1], **space), seed=seed, programs=programs,
                          seconds=seconds, deadline_s=deadline_s, shrink_seconds=shrink_seconds)
        return session.stats, session.run()
    finally:
        group.close()


def replay(seed: str, transport: str = "local", deadline_s: float = 30.0) -> tuple[Program, Verdict]:
    """Rerun the program a failing session printed (its replay seed) and judge it again."""
    program = Program.from_token(seed)
    group = make_group(transport, program.size)
    try:
        return program, judge(program, group.run(program, deadline_s), deadline_s)
    finally:
        group.close()


__all__ = ["Found", "Program", "Session", "Space", "Stats", "Step", "Verdict", "fuzz", "judge",
           "make_group", "replay"]
