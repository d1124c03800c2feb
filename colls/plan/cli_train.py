"""`colls plan train` and `colls plan search`: one layout priced, or every layout ranked."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from .estimate import Step, estimate
from .search import describe, search
from .topology import GB
from .training import StepPlan, Training, compare_placements, plan_step
from .units import SIZE_CONVENTION


def _model_arguments(mode: argparse.ArgumentParser) -> None:
    for name, default, kind, text in (
            ("params", 100e9, float, "parameters Ψ"), ("layers", 80, int, "transformer layers"),
            ("hidden", 10240, int, "hidden size h"), ("seq", 2048, int, "sequence length s"),
            ("experts", 0, int, "experts per MoE layer (0: dense)"),
            ("expert-fraction", 0.0, float, "share of the parameters in expert weights"),
            ("top-k", 1, int, "experts per token")):
        mode.add_argument(f"--{name}", type=kind, default=default, help=text)
    mode.add_argument("--json", action="store_true", help="machine-readable output")


def add_train_arguments(train: argparse.ArgumentParser) -> None:
    """Options of `colls plan train`."""
    _model_arguments(train)
    for name, default, text in (("micro-batch", 1, "sequences per micro-batch"),
                                ("micro-batches", 16, "m, per step and pipeline"), ("dp", 16, ""),
                                ("tp", 8, ""), ("pp", 8, ""), ("ep", 1, "EP groups carved out of DP"),
                                ("zero", 0, "ZeRO stage 0-3 over DP"),
                                ("v", 1, "interleaved 1F1B: model chunks per pipeline rank")):
        train.add_argument(f"--{name}", type=int, default=default, help=text or None)
    train.add_argument("--placement", default="tp,dp,pp", help="dimensions from innermost to outermost")
    train.add_argument("--compare", action="store_true",
                       help="also place TP across nodes and PP under one leaf, side by side")
    train.add_argument("--simulate", action="store_true",
                       help="also run the step on the sim transport with colls' own algorithms and a "
                            "simulated 1F1B (ZeRO 0, v 1, no straggler; slow at scale)")


def add_search_arguments(search_mode: argparse.ArgumentParser) -> None:
    """Options of `colls plan search`."""
    _model_arguments(search_mode)
    search_mode.add_argument("--global-batch", type=int, default=1024, help="sequences per step")
    search_mode.add_argument("--top", type=int, default=5, help="layouts to print")


def _training(args: argparse.Namespace) -> Training:
    return Training(params=args.params, layers=args.layers, hidden=args.hidden, seq=args.seq,
                    micro_batch=args.micro_batch, micro_batches=args.micro_batches, dp=args.dp,
                    tp=args.tp, pp=args.pp, ep=args.ep, top_k=args.top_k, placement=args.placement,
                    zero=args.zero, interleave=args.v, experts=args.experts,
                    expert_fraction=args.expert_fraction)


def train_table(args: argparse.Namespace) -> int:
    """Price one layout (or its placements, --compare); --simulate adds the simulated step."""
    from .cli import cluster_of, slowdown

    training = _training(args)
    cluster = cluster_of(args, int(args.nodes))
    slow = slowdown(args, cluster.size)
    placements = ("tp,dp,pp", "tp,pp,dp", "dp,pp,tp") if args.compare else (training.placement,)
    try:
        steps = [estimate(replace(training, placement=p), cluster, slow) for p in placements]
    except ValueError as error:
        raise SystemExit(f"colls plan train: {error}") from None
    if args.simulate and (slow or training.zero or training.interleave > 1 or training.expert_fraction):
        raise SystemExit("colls plan train: --simulate runs ZeRO 0, v 1, no expert fraction and no "
                         "straggler; drop --simulate to price --zero, --v, --expert-fraction or --slow-rank")
    if args.json:
        print(json.dumps({"cluster": cluster.describe(), "units": SIZE_CONVENTION, "slow": slow,
                          "steps": [s.as_dict() for s in steps]}, indent=1))
        return 0
    print(f"# {training.params / 1e9:g}B parameters, dp {training.dp} x tp {training.tp} x pp {training.pp}"
          f" (ep {training.ep}), ZeRO {training.zero}, v {training.interleave}, {training.micro_batches} "
          f"micro-batches of {training.micro_batch} x {training.seq} tokens, on {cluster.describe()}"
          + (f"; rank {args.slow_rank} {args.slow_factor:g}x slower" if slow else ""))
    print(f"# {SIZE_CONVENTION}")
    gradient = training.params * training.bytes_per_value
    print(f"gradient of the whole model: {gradient / GB:.0f} GB; a ring all-reduce over n ranks sends "
          f"2(n-1)/n of it per rank: {2 * (training.dp - 1) / training.dp * gradient / GB:.0f} GB at n = dp "
          f"= {training.dp} without model parallelism")
    for step in steps:
        print_step(step)
    if args.simulate:
        simulated = replace(training, gpu_flops=cluster.gpu_flops * 0.5)
        plans = compare_placements(simulated, cluster) if args.compare else [plan_step(simulated, cluster)]
        print("# simulated on the sim transport (colls' own algorithms, 1F1B run message by message):")
        print(f"{'placement':<11}{'dim':<5}{'calls':>7}{'bytes/call':>12}{'per call':>12}{'per step':>12}"
              f"{'sent/rank':>12}  algorithm")
        for plan in plans:
            _print_plan(plan)
    return 0


def print_step(step: Step) -> None:
    """A priced step: per dimension, the pipeline, memory beside HBM."""
    from .cli import _time

    t, placement = step.training, step.training.placement
    print(f"{placement:<11}{'dim':<5}{'calls':>7}{'bytes/call':>13}{'per step':>12}  algorithm (bound)")
    for d in step.dimensions:
        print(f"{placement:<11}{d.dimension:<5}{d.calls:>7}{d.nbytes / 1e6:>11.1f}MB{_time(d.seconds):>12}"
              f"  {d.algorithm} ({d.bound})")
    dp = step.seconds - step.pipeline
    print(f"{placement:<11}step {_time(step.seconds)} = 1F1B {_time(step.pipeline)} (compute "
          f"{_time(step.compute)}, bubble {step.bubble:.3f} = (p-1)/v / (m+(p-1)/v)) + DP {_time(dp)}")
    mem = step.memory
    print(f"{placement:<11}memory per GPU {mem.total / GB:.1f} GB of {step.cluster.hbm / GB:g} GB HBM "
          f"({'fits' if step.fits else 'DOES NOT FIT'}): parameters {mem.parameters / GB:.1f}, gradients "
          f"{mem.gradients / GB:.1f}, optimizer {mem.optimizer / GB:.1f}, activations "
          f"{mem.activations / GB:.1f} (1F1B stash of min(m, p) = {min(t.micro_batches, t.pp)} "
          f"micro-batches)")


def _print_plan(plan: StepPlan) -> None:
    from .cli import _time

    placement = plan.training.placement
    for d in plan.dimensions:
        print(f"{placement:<11}{d.dimension:<5}{d.calls:>7}{d.nbytes / 1e6:>10.1f}MB"
              f"{_time(d.seconds_per_call):>12}{_time(d.seconds):>12}{d.bytes_sent / 1e6:>10.1f}MB"
              f"  {d.algorithm}")
    p, m = plan.training.pp, plan.training.micro_batches
    dp = plan.step_seconds - plan.pipeline_seconds
    print(f"{placement:<11}total communication {_time(plan.communication_seconds)}; step "
          f"{_time(plan.step_seconds)} = 1F1B {_time(plan.pipeline_seconds)} (compute "
          f"{_time(plan.compute_seconds)}, TP/EP inside the stages "
          f"{_time(plan.pipeline_ideal - plan.compute_seconds)}) + DP {_time(dp)}; bubble {plan.bubble:.3f} "
          f"simulated vs (p-1)/(m+p-1) = {(p - 1) / (m + p - 1):.3f}")


def search_table(args: argparse.Namespace) -> int:
    """Rank every layout that fits; print the top few, the split by dimension and why."""
    from .cli import cluster_of, slowdown

    cluster = cluster_of(args, int(args.nodes))
    slow = slowdown(args, cluster.size)
    model = Training(params=args.params, layers=args.layers, hidden=args.hidden, seq=args.seq,
                     experts=args.experts, expert_fraction=args.expert_fraction, top_k=args.top_k)
    start = time.perf_counter()
    try:
        result = search(model, cluster, args.global_batch, args.top, slow=slow)
    except ValueError as error:
        raise SystemExit(f"colls plan search: {error}") from None
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps({"cluster": cluster.describe(), "units": SIZE_CONVENTION, "slow": slow,
                          "global_batch": args.global_batch, "tried": result.tried, "fit": result.fitting,
                          "search_s": seconds, "reason": result.reason(),
                          "ranked": [s.as_dict() for s in result.ranked]}, indent=1))
        return 0
    print(f"# {model.params / 1e9:g}B parameters, {model.layers} layers, global batch {args.global_batch} x "
          f"{model.seq} tokens on {cluster.describe()}; {SIZE_CONVENTION}")
    print(f"# {result.tried} layouts tried, {result.fitting} fit in {cluster.hbm / GB:g} GB, "
          f"{seconds:.1f} s")
    for rank, step in enumerate(result.ranked, 1):
        print(f"#{rank} {describe(step.training)}: step {step.seconds * 1e3:.1f} ms, memory "
              f"{step.memory.total / GB:.1f} GB")
        print_step(step)
    print(f"why: {result.reason()}")
    return 0
