"""What a rank did, for diagnosing a hang or a mismatch after the fact.

COLLS_DEBUG=1 prints one line per call to stderr (call, algorithm, bytes, time) and turns on the
fingerprint check of `colls.fingerprint`. COLLS_TRACE=FILE keeps the last TRACE_KEPT (100)
calls of each rank in memory and writes them to FILE.<rank> when a call fails, so the last thing
every rank did before a hang or a mismatch can be read side by side.
"""

from __future__ import annotations

import sys
import time
from collections import deque

from . import config
from .describe import Description

TRACE_KEPT = 100   # calls each rank keeps for COLLS_TRACE: enough to line the ranks' last steps up


def debug_enabled() -> bool:
    """Whether COLLS_DEBUG asks for checks and logging."""
    return config.get("COLLS_DEBUG")


class Tracer:
    """Per-communicator log of calls: printed under COLLS_DEBUG, kept and dumped under COLLS_TRACE."""

    def __init__(self, group: str, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.debug = debug_enabled()
        self.path = config.get("COLLS_TRACE")
        self.recent: deque[str] = deque(maxlen=TRACE_KEPT)
        self.active = self.debug or self.path is not None

    def finished(self, description: Description, nbytes: int, seconds: float) -> None:
        """Record a call that completed."""
        line = f"{time.time():.6f} rank {self.rank} {self.group} {description.label()} {nbytes} B " \
               f"{seconds * 1e6:.1f} us ok"
        self.recent.append(line)
        if self.debug:
            print(f"colls: {line}", file=sys.stderr, flush=True)

    def failed(self, description: Description, error: BaseException) -> None:
        """Record a call that raised, and write the trace file if one was asked for."""
        line = f"{time.time():.6f} rank {self.rank} {self.group} {description.label()} FAILED: " \
               f"{type(error).__name__}: {error}"
        self.recent.append(line)
        if self.debug:
            print(f"colls: {line}", file=sys.stderr, flush=True)
        if self.path:
            with open(f"{self.path}.{self.rank}", "w") as handle:
                handle.write("\n".join(self.recent) + "\n")
