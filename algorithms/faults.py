"""Planted faults: deliberate bugs, off unless asked for, that show the fuzzer and tests have teeth.

`ACTIVE` is empty in normal use, and every hook in an algorithm is one line that tests it first, so
a disabled fault costs one attribute lookup. Faults are planted by `COLLS_FAULTS=name,name` (read
once at import, so `colls run`, `colls.spawn` and mpiexec ranks inherit it) or, in one process, by
`with faults.planted("op_order"): ...`. Never plant one outside a test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# name -> what goes wrong; each hook carries a `# planted fault` comment beside it
FAULTS = {
    "block_boundary": "blocks.bounds ends the last block one element early (count > parts), so one "
                      "element is never reduced or moved",
    "ring_wrong_peer": "the ring reduce-scatter phase takes its first step from rank r-2 instead of "
                       "r-1 (n >= 3): every rank waits for a message nobody sends",
    "odd_skip_reduction": "the binomial reduce receives but does not fold in the last rank's buffer "
                          "when n is odd",
    "op_order": "Op.into_left puts the incoming (higher-rank) operand on the left: wrong for "
                "non-commutative operators only",
}

ACTIVE: frozenset[str] = frozenset()


def parse(spec: str) -> frozenset[str]:
    """The fault names in a comma-separated `spec`; ValueError for one that does not exist."""
    chosen = frozenset(name.strip() for name in spec.split(",") if name.strip())
    unknown = sorted(chosen - FAULTS.keys())
    if unknown:
        raise ValueError(f"COLLS_FAULTS: unknown fault(s) {unknown}; choose from {sorted(FAULTS)}")
    return chosen


def plant(*names: str) -> None:
    """Make exactly `names` the active faults in this process (none: disable every fault)."""
    global ACTIVE
    ACTIVE = parse(",".join(names))


@contextmanager
def planted(*names: str) -> Iterator[None]:
    """Activate `names` for the duration of a `with` block, then restore what was active."""
    previous = ACTIVE
    plant(*names)
    try:
        yield
    finally:
        plant(*previous)


ACTIVE = parse(os.environ.get("COLLS_FAULTS", ""))
