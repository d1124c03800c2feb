"""How a buffer is cut into per-rank blocks when its length does not divide by the group size."""

from __future__ import annotations


def bounds(count: int, parts: int) -> list[int]:
    """Start offsets of `parts` near-equal blocks of `count` elements, plus the end: len parts + 1."""
    return [count * i // parts for i in range(parts + 1)]


def offsets(counts: list[int]) -> list[int]:
    """Exclusive prefix sums: where each of `counts` blocks starts."""
    starts, total = [], 0
    for count in counts:
        starts.append(total)
        total += count
    return starts
