"""`colls plan search`: every layout of a model on a cluster that fits in memory, priced, ranked.

A layout is (dp, tp, pp, ep, ZeRO stage, micro-batch, v, placement order). Given the global
batch B (sequences), m = B / (dp x micro-batch) micro-batches per step. Each layout that fits in
HBM is priced by `estimate` (NCCL's algorithms on the cluster's links, every group at once); the
fastest few are returned with the reason the winner wins: the dimension where it gains most over
the runner-up, and what the runner-up would need.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from .estimate import Step, estimate, memory
from .topology import Cluster
from .training import Training

PLACEMENTS = ("tp,dp,pp", "tp,pp,dp", "pp,tp,dp", "dp,tp,pp", "dp,pp,tp", "pp,dp,tp")


def _powers_of_two(limit: int) -> list[int]:
    values, v = [], 1
    while v <= limit:
        values.append(v)
        v *= 2
    return values


@dataclass(frozen=True)
class SearchSpace:
    """What the search may choose (defaults: the usual choices)."""

    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4)
    interleaves: tuple[int, ...] = (1, 2, 4)
    placements: tuple[str, ...] = PLACEMENTS


def layouts(model: Training, cluster: Cluster, global_batch: int,
            space: SearchSpace = SearchSpace()) -> Iterator[Training]:
    """Every consistent layout of `model` on all of `cluster`'s GPUs (TP at most a node)."""
    world = cluster.size
    for tp in _powers_of_two(min(cluster.ranks_per_node, model.hidden)):
        for pp in [p for p in range(1, model.layers + 1) if model.layers % p == 0 and world % (tp * p) == 0]:
            dp = world // (tp * pp)
            eps = [1] if not model.experts else [e for e in _powers_of_two(dp)
                                                 if model.experts % e == 0 and dp % e == 0]
            for ep in eps:
                for micro_batch in space.micro_batch_sizes:
                    if global_batch % (dp * micro_batch):
                        continue
                    m = global_batch // (dp * micro_batch)
                    for v in space.interleaves:
                        if v > 1 and (pp < 2 or m % pp or model.layers % (pp * v)):
                            continue
                        for zero in space.zero_stages:
                            for placement in _distinct_placements(space.placements, dp, tp, pp):
                                yield replace(model, dp=dp, tp=tp, pp=pp, ep=ep, micro_batch=micro_batch,
                                              micro_batches=m, interleave=v, zero=zero, placement=placement)


def _distinct_placements(placements: tuple[str, ...], dp: int, tp: int, pp: int) -> list[str]:
    """Placements that differ once dimensions of size 1 are dropped."""
    seen, kept = set(), []
    sizes = {"dp": dp, "tp": tp, "pp": pp}
    for placement in placements:
        key = tuple(d for d in placement.split(",") if sizes[d] > 1)
        if key not in seen:
            seen.add(key)
            kept.append(placement)
    return kept


@dataclass
class SearchResult:
    """The ranked layouts that fit, and how many were tried."""

    ranked: list[Step]
    tried: int
    fitting: int
    runner_up: Step | None = None   # the best of another (dp, tp, pp, ep, placement)

    def reason(self) -> str:
        """Why the winner beats the runner-up: the dimensions where the gap is."""
        if not self.ranked:
            return "no layout fits in memory"
        if self.runner_up is None:
            return "the only shape (dp, tp, pp, ep, placement) that fits"
        win, second = self.ranked[0], self.runner_up
        parts = _parts(win), _parts(second)
        gaps = sorted(((parts[1].get(k, 0.0) - parts[0].get(k, 0.0), k)
                       for k in set(parts[0]) | set(parts[1])), reverse=True)
        gain = ", ".join(f"{name} {gap * 1e3:+.1f} ms" for gap, name in gaps if abs(gap) > 1e-6)
        ties = [s for s in self.ranked[1:] if s.seconds <= win.seconds * (1 + 1e-9)]
        tied = (f" ({len(ties)} layout{'s' * (len(ties) > 1)} as fast, e.g. another ZeRO stage, take more "
                f"memory)" if ties else "")
        return (f"{_describe(win.training)}{tied} beats the best other shape, {_describe(second.training)}, "
                f"by {(second.seconds - win.seconds) * 1e3:.1f} ms a step; where the runner-up loses "
                f"(+) or gains (-): {gain or 'nowhere'}; bounds of the winner: "
                + ", ".join(f"{d.dimension} {d.bound}" for d in win.dimensions))


def _parts(step: Step) -> dict[str, float]:
    parts = {d.dimension: d.seconds for d in step.dimensions if d.dimension in ("dp", "edp")}
    inside = sum(d.seconds for d in step.dimensions if d.dimension in ("tp", "ep", "pp"))
    parts["compute+bubble"] = step.pipeline - inside
    for d in step.dimensions:
        if d.dimension in ("tp", "ep", "pp"):
            parts[d.dimension] = d.seconds
    return parts


def _describe(t: Training) -> str:
    return (f"dp{t.dp} tp{t.tp} pp{t.pp} ep{t.ep} zero{t.zero} mb{t.micro_batch} v{t.interleave} "
            f"[{t.placement}]")


def search(model: Training, cluster: Cluster, global_batch: int, top: int = 5,
           space: SearchSpace = SearchSpace(), slow: dict[int, float] | None = None) -> SearchResult:
    """Price every layout that fits and rank them by step time.

    Args:
        model: the model (params, layers, hidden, seq, experts...); its parallel sizes are ignored.
        cluster: the machine; every GPU is used.
        global_batch: sequences per step.
        top: how many to keep.
        space: the choices to enumerate.
        slow: a straggler, as `estimate` takes it.

    Returns:
        The fastest `top` layouts that fit, the counts tried and fitting.

    Raises:
        ValueError: a global batch no layout can split.
    """
    steps, tried = [], 0
    for layout in layouts(model, cluster, global_batch, space):
        tried += 1
        if memory(layout).total > cluster.hbm:   # priced only if it fits
            continue
        steps.append(estimate(layout, cluster, slow))
    if tried == 0:
        raise ValueError(f"--global-batch {global_batch} splits over no dp x micro-batch of {cluster.size} "
                         f"GPUs")
    steps.sort(key=lambda s: (s.seconds, s.memory.total))   # a tie goes to the smaller memory
    shape = _shape(steps[0].training) if steps else None
    runner_up = next((s for s in steps if _shape(s.training) != shape), None)
    return SearchResult(steps[:top], tried, len(steps), runner_up)


def _shape(t: Training) -> tuple:
    return t.dp, t.tp, t.pp, t.ep, t.placement


def describe(t: Training) -> str:
    """One line naming a layout."""
    return _describe(t)
