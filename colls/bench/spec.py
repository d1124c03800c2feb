"""What one `colls bench` run measures: sizes as nccl-tests count them, bus-bandwidth factors, the spec.

Sizes follow nccl-tests: `-b 8 -e 256M -f 2` walks 8 B, 16 B, ... 256 MiB, each the collective's
per-rank buffer — the input of all_reduce, broadcast, reduce, reduce_scatter and all_to_all, the
gathered output of all_gather — rounded down to whole elements (and to a multiple of the group size
where the buffer splits into one block per rank).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

import numpy as np

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")
DTYPES = ("float32", "float64", "float16", "int32", "int64")
BASELINES = ("mpi", "gloo")
OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")
ROOT = 0   # broadcast and reduce: rank 0 sends or receives, as in nccl-tests' default
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'8' -> 8, '64K' -> 65536, '256M' (or 256MiB, 256MB) -> 268435456: binary, as in nccl-tests."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"size {text!r}: give bytes with an optional K, M or G suffix, e.g. 8, 64K, 256M")
    return int(float(match.group(1)) * _SUFFIXES[match.group(2).upper()])


def size_steps(begin: int, end: int, factor: int) -> list[int]:
    """begin, begin*factor, ... up to end (both ends included when reached)."""
    if begin < 0 or end < begin:
        raise ValueError(f"sizes: need 0 <= -b ({begin}) <= -e ({end})")
    if factor < 2:
        raise ValueError(f"-f must be at least 2, not {factor}")
    steps, size = [], begin
    while size <= end:
        steps.append(size)
        if size == 0:
            size = 1
        size *= factor
    return steps


def format_bytes(nbytes: int) -> str:
    """8 -> '8 B', 65536 -> '64 KiB', 3 << 20 -> '3 MiB', 1536 -> '1536 B' (exact or plain bytes)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw: what each rank's links carry relative to the buffer."""
    if collective == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0   # broadcast, reduce


def element_counts(collective: str, nbytes: int, ranks: int, dtype: str) -> tuple[int, int]:
    """(input elements, output elements) per rank for a buffer of `nbytes` as nccl-tests counts it."""
    count = nbytes // np.dtype(dtype).itemsize
    if collective in ("all_reduce", "broadcast", "reduce"):
        return count, count
    total = max(ranks, count - count % ranks)   # one block per rank, at least one element each
    if collective == "all_gather":
        return total // ranks, total
    if collective == "reduce_scatter":
        return total, total // ranks
    return total, total   # all_to_all


def buffer_bytes(collective: str, counts: tuple[int, int], dtype: str) -> int:
    """The size nccl-tests prints for these counts (the larger of input and output)."""
    return max(counts) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class Spec:
    """One run's settings, written by the `colls bench` parent and read by every rank."""

    ranks: int
    transport: str
    collectives: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str = "float32"
    op: str = "sum"
    algorithm: str | None = None          # None: the library's choice ("auto")
    warmup: int = 5
    iters: int | None = None              # None: as many as fit `budget_s`, within the bounds below
    budget_s: float = 0.2
    min_iters: int = 5
    max_iters: int = 200
    baselines: tuple[str, ...] = BASELINES
    memcheck: bool = False
    memcheck_calls: int = 1000
    pin: bool = False                     # each rank on one CPU of its own, round robin (`pin_rank`)
    registered: bool = False              # colls' buffers in registered memory (`colls.alloc`)
    plugins: str = ""                     # COLLS_PLUGINS for the ranks (`--plugin`)
    records_path: str = ""

    def save(self, path: str) -> None:
        """Write the spec as JSON for the ranks."""
        with open(path, "w") as handle:
            json.dump(asdict(self), handle)

    @classmethod
    def load(cls, path: str) -> Spec:
        """Read the spec the parent wrote."""
        with open(path) as handle:
            data = json.load(handle)
        data["collectives"] = tuple(data["collectives"])
        data["sizes"] = tuple(data["sizes"])
        data["baselines"] = tuple(data["baselines"])
        return cls(**data)


def error_path(spec_path: str, rank: int) -> str:
    """Where rank `rank` of the job run from `spec_path` leaves the traceback it failed with."""
    return f"{spec_path}.rank{rank}.error"
