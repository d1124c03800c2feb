"""Pipeline schedules: which forwards and backwards each pipeline rank runs, in what order, and
their replay with free messages (the ideal timeline, its bubble) beside the formulas.

An op is ("F" or "B", micro-batch, chunk of this rank); chunk c of rank r is global stage c·p + r.
GPipe (Huang et al. 2019), 1F1B (PipeDream-Flush, Narayanan et al. 2019) and Megatron-LM's
interleaved 1F1B (Narayanan et al. 2021) are plain lists, so a test can check that every schedule,
replayed with equal stage costs, has exactly the bubble (p-1)/(v·m+p-1) and the stash the
formulas say, and the training loop runs the very same lists.
"""

from __future__ import annotations

Op = tuple[str, int, int]   # ("F" or "B", micro-batch, chunk of this rank)


def gpipe(p: int, m: int, rank: int) -> list[Op]:
    """All forwards, then all backwards (GPipe)."""
    return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]


def one_f_one_b(p: int, m: int, rank: int) -> list[Op]:
    """p - rank - 1 warm-up forwards, then alternate one forward, one backward; cool down."""
    warmup = min(p - rank - 1, m)
    ops: list[Op] = [("F", i, 0) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [("F", warmup + i, 0), ("B", i, 0)]
    return ops + [("B", i, 0) for i in range(m - warmup, m)]


def interleaved(p: int, m: int, v: int, rank: int) -> list[Op]:
    """Megatron-LM's interleaved 1F1B: the k-th forward of a rank is micro-batch
    (k // pv)·p + k % p of chunk (k // p) % v (backwards: chunks in reverse); warm-up
    2(p - rank - 1) + (v - 1)·p forwards."""
    total = m * v

    def op(kind: str, k: int) -> Op:
        group, within = divmod(k, p * v)
        chunk = within // p
        return kind, group * p + within % p, chunk if kind == "F" else v - 1 - chunk

    warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
    ops = [op("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        ops += [op("F", warmup + i), op("B", i)]
    return ops + [op("B", k) for k in range(total - warmup, total)]


def schedule(strategy: str, p: int, m: int, v: int, rank: int) -> list[Op]:
    """The op list of pipeline rank `rank` for `strategy`."""
    if strategy == "gpipe":
        return gpipe(p, m, rank)
    if strategy == "interleaved":
        return interleaved(p, m, v, rank)
    return one_f_one_b(p, m, rank)


def simulate(ops: list[list[Op]], p: int, v: int, cost) -> list[list[tuple[float, float]]]:
    """Replay the ranks' op lists with free messages: each op starts once its rank is free and its
    input exists (forward: the previous stage's forward; backward: the next stage's backward);
    `cost(rank, kind, chunk)` is its duration. (start, end) per op; raises on a deadlock."""
    last = p * v - 1
    done: dict[tuple[str, int, int], float] = {}
    times: list[list[tuple[float, float]]] = [[] for _ in range(p)]
    free, position = [0.0] * p, [0] * p
    while any(position[r] < len(ops[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while position[r] < len(ops[r]):
                kind, micro, chunk = ops[r][position[r]]
                stage = chunk * p + r
                needs = (("F", micro, stage - 1) if stage > 0 else None) if kind == "F" else \
                    (("B", micro, stage + 1) if stage < last else ("F", micro, stage))
                if needs is not None and needs not in done:
                    break
                start = max(free[r], done[needs] if needs else 0.0)
                free[r] = done[(kind, micro, stage)] = start + cost(r, kind, chunk)
                times[r].append((start, free[r]))
                position[r] += 1
                moved = True
        if not moved:
            raise RuntimeError(f"pipeline schedule deadlocks at ops {position}")
    return times


def bubble_of(times: list[list[tuple[float, float]]]) -> list[float]:
    """Per rank, the idle fraction of the span from the first op start to the last op end."""
    start = min(t[0][0] for t in times if t)
    span = max(t[-1][1] for t in times if t) - start
    return [1.0 - sum(b - a for a, b in t) / span for t in times]


def bubble_formula(p: int, m: int, v: int) -> float:
    """(p-1)/(v·m+p-1): the idle fraction when every stage costs the same (Megatron-LM)."""
    return (p - 1) / (v * m + p - 1)


def stash_formula(strategy: str, p: int, m: int, v: int, rank: int) -> int:
    """Most chunk micro-batches whose activations a rank holds at once: m·v (GPipe), p - rank
    (1F1B, at most p), the interleaved warm-up + 1."""
    if strategy == "gpipe":
        return m * v
    if strategy == "interleaved":
        return min(m * v, 2 * (p - rank - 1) + (v - 1) * p + 1)
    return min(m, p - rank)
