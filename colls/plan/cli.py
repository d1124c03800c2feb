"""`colls plan`: predicted times on a simulated cluster, from the `sim` transport.

    colls plan collective -c all_reduce -s 1G --nodes 16       every algorithm, flat and hierarchical
    colls plan train --params 100e9 --dp 16 --tp 8 --pp 8 --nodes 128 [--compare]
    colls plan scale -c all_reduce -s 1G --nodes 1,2,4,8 [--plot f.png]
"""

from __future__ import annotations

import argparse

from algorithms import names

from .simulate import simulate, simulate_hierarchical
from .topology import GB, Cluster
from .training import StepPlan, Training, compare_placements, plan_step

# what runs across nodes in each hierarchical composition colls plan lists
HIERARCHICAL_INTER = {"all_reduce": ("ring", "rabenseifner", "tree", "recursive_doubling"),
                      "broadcast": ("binomial", "pipeline", "scatter_allgather")}


def parse_bytes(text: str) -> int:
    """'1G', '64M', '512K', '100' -> bytes (binary multiples)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(float(text))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The modes of `colls plan` and the cluster options they share."""
    modes = parser.add_subparsers(dest="mode", required=True, metavar="mode")
    collective = modes.add_parser("collective",
                                  help="every algorithm of one collective, flat and hierarchical")
    collective.add_argument("-c", "--collective", default="all_reduce")
    collective.add_argument("-s", "--size", default="1G", help="buffer bytes S (K/M/G suffixes)")
    train = modes.add_parser("train", help="communication per step of a DP x TP x PP (x EP) job")
    for name, default, kind in (("params", 100e9, float), ("layers", 80, int), ("hidden", 10240, int),
                                ("seq", 2048, int), ("micro-batch", 1, int), ("micro-batches", 16, int),
                                ("dp", 16, int), ("tp", 8, int), ("pp", 8, int), ("ep", 1, int),
                                ("top-k", 1, int)):
        train.add_argument(f"--{name}", type=kind, default=default)
    train.add_argument("--placement", default="tp,dp,pp", help="dimensions from innermost to outermost")
    train.add_argument("--compare", action="store_true",
                       help="also place TP across nodes and PP under one leaf, side by side")
    scale = modes.add_parser("scale", help="predicted time against cluster size")
    scale.add_argument("-c", "--collective", default="all_reduce")
    scale.add_argument("-s", "--size", default="1G")
    scale.add_argument("--plot", default=None, metavar="FILE.png", help="draw it (needs matplotlib)")
    calibrate = modes.add_parser("calibrate", help="predictions beside measured `colls bench --json` times")
    calibrate.add_argument("--bench", nargs="+", action="append", required=True, metavar="FILE.json",
                           help="bench results; several runs of the same points give their median; "
                                "given again, another batch: the batches are also compared with each "
                                "other")
    calibrate.add_argument("--profile", nargs="+", required=True, metavar="FILE.json",
                           help="`colls run -n N -m colls.tune --profile FILE` at each N benched; "
                                "several of one N give their median")
    calibrate.add_argument("--cores", type=int, default=None, help="CPUs (default: the profile's)")
    calibrate.add_argument("--runs", choices=("median", "fastest"), default="median",
                           help="how several runs of one point (bench or profile) combine")
    calibrate.add_argument("--round-trip", default=None, metavar="LO-HI",
                           help="only profiles and bench points measured in one mode of the machine: "
                                "ranks 0 and 1's cache-line round trip before and after them within "
                                "[LO, HI) ns (recorded by colls bench and colls tune --profile)")
    calibrate.add_argument("--exchange", default=None, metavar="LO-HI",
                           help="likewise by ranks 0 and 1's 256 KiB exchange through shared memory, "
                                "within [LO, HI) us (e.g. 0-80 where it reads ~40 in one state of a VM "
                                "and ~140 in another)")
    calibrate.add_argument("--by-placement", action="store_true",
                           help="a row per placement that colls bench saw unpinned ranks at (each "
                                "rank's core, recorded around every point), predicted there; without "
                                "it, the mean over every placement")
    for mode in (collective, train, scale):
        mode.add_argument("--nodes", default="16" if mode is not train else "128",
                          help="nodes (scale: a comma-separated list)")
        mode.add_argument("--ranks-per-node", type=int, default=8)
        mode.add_argument("--nics-per-node", type=int, default=8)
        mode.add_argument("--nic-gbps", type=float, default=50.0, help="GB/s per NIC and direction")
        mode.add_argument("--nvlink-gbps", type=float, default=450.0, help="GB/s per GPU and direction")
        mode.add_argument("--nodes-per-leaf", type=int, default=8)
        mode.add_argument("--oversubscription", type=float, default=1.0, help="leaf uplink ratio, e.g. 2")
        mode.add_argument("--slow-rank", type=int, default=None, help="a straggler rank (10x slower)")


def cluster_of(args: argparse.Namespace, nodes: int) -> Cluster:
    """The `Cluster` the options describe, with `nodes` nodes."""
    return Cluster(nodes=nodes, ranks_per_node=args.ranks_per_node, nics_per_node=args.nics_per_node,
                   nic_bandwidth=args.nic_gbps * GB, intra_bandwidth=args.nvlink_gbps * GB,
                   nodes_per_leaf=args.nodes_per_leaf, oversubscription=args.oversubscription)


def plan_command(args: argparse.Namespace) -> int:
    """Run the chosen mode and print its table."""
    if args.mode == "collective":
        return collective_table(args)
    if args.mode == "train":
        return train_table(args)
    if args.mode == "calibrate":
        return calibrate_table(args)
    return scale_table(args)


def calibrate_table(args: argparse.Namespace) -> int:
    from .calibrate import (
        batches_apart,
        compare,
        load_profiles,
        placements_seen,
        reproducibility,
        summary,
        table,
    )

    batches, args.bench = args.bench, [path for batch in args.bench for path in batch]

    window = {}
    for option, field, text, unit in (("--round-trip", "round_trip_ns", args.round_trip, "ns"),
                                       ("--exchange", "exchange_us", args.exchange, "us")):
        if text is not None:
            try:
                low, high = (float(bound) for bound in text.split("-"))
            except ValueError:
                raise SystemExit(f"colls plan calibrate: {option} takes LO-HI in {unit}, "
                                 f"got {text!r}") from None
            window[field] = (low, high)
    profiles = load_profiles(args.profile, args.runs, window or None)
    points = compare(args.bench, profiles, args.cores, args.runs, window or None, args.by_placement)
    if window:
        labels = {"round_trip_ns": ("a round trip of", "ns"), "exchange_us": ("a 256 KiB exchange of", "us")}
        print("# measured with " + " and ".join(f"{labels[field][0]} {low:g}-{high:g} {labels[field][1]}"
                                                 for field, (low, high) in window.items())
              + ": profiles at "
              + (", ".join(f"{ranks} ranks" for ranks in sorted(profiles)) or "no rank count")
              + f", {len(points)} bench points")
    for ranks, profile in sorted(profiles.items()):
        alpha, beta = profile.message_cost(1 << 20)
        print(f"# {ranks} ranks on {args.cores or profile.cores} cores: 8 B message "
              f"{profile.message[0][1] * 1e6:.2f} us, 1 MiB {(alpha + beta * (1 << 20)) * 1e6:.1f} us, "
              f"start {profile.start * 1e6:.2f} us, "
              f"spin {profile.spin * 1e6:.1f} us, wake {profile.wake * 1e6:.1f} us"
              + (f", 8 B send (the sender's) {profile.send_seconds(8) * 1e6:.2f} us"
                 if profile.send_seconds(8) is not None else "")
              + (f", 8 B sendrecv {profile.exchange_seconds(8) * 1e6:.2f} us"
                 if profile.exchange_seconds(8) is not None else "")
              + (f" (one-slot spin {profile.one_slot_spin * 1e6:.1f} us, "
                 f"wake {profile.one_slot_wake * 1e6:.1f} us)"
                 if profile.one_slot_spin is not None and profile.one_slot_wake is not None else "")
              + (f", MPI barrier's hold {profile.barrier_hold * 1e6:.1f} us"
                 if profile.barrier_hold is not None else "")
              + "; calls "
              + ", ".join(f"{name} {seconds * 1e6:.2f} us" for name, seconds in sorted(profile.call.items())))
    print(table(points))
    seen = placements_seen(args.bench, window or None)
    for ranks in sorted({p.ranks for p in points}):
        shared = ranks > (args.cores or profiles[ranks].cores)   # where the placement matters at all
        if shared and any(label != "-" for label in seen.get(ranks, {})):
            print(f"{ranks} ranks: points by where the bench saw the ranks (each one's core; -: "
                  "unrecorded, or a rank moved): "
                  + ", ".join(f"{label} {count}" for label, count in sorted(seen[ranks].items())))
    for ranks in sorted({p.ranks for p in points}):
        mean, worst = summary([p for p in points if p.ranks == ranks])
        print(f"{ranks} ranks: geometric-mean error {mean * 100:.1f}%, largest {worst * 100:.1f}%")
    # what the machine itself reproduces: no model can be shown closer than the runs agree
    for ranks, (mean, worst, count) in sorted(reproducibility(args.bench, args.runs, window or None,
                                                              args.by_placement).items()):
        print(f"{ranks} ranks: the bench against itself (alternate runs, each half's {args.runs}; "
              f"{count} point{'s' * (count != 1)}): {mean * 100:.1f}%, largest {worst * 100:.1f}%")
    if len(batches) > 1:
        for ranks, (mean, worst, count) in sorted(batches_apart(batches, args.runs, window or None,
                                                                args.by_placement).items()):
            print(f"{ranks} ranks: the {len(batches)} batches against each other ({count} "
                  f"point{'s' * (count != 1)} in all of them): a model that predicts a point alike for "
                  f"every batch is at best {mean * 100:.1f}% off, {worst * 100:.1f}% the largest (each "
                  f"point at the middle of its batches' {args.runs}s)")
    return 0


def _slowdown(args: argparse.Namespace) -> dict[int, float] | None:
    return None if args.slow_rank is None else {args.slow_rank: 10.0}


def every_algorithm(collective: str, nbytes: int, cluster: Cluster, slowdown=None):
    """Simulated results of every flat algorithm and (all_reduce, broadcast) every hierarchical
    composition; hierarchical all_to_all is not simulated (its regrouping needs real buffers)."""
    # the registered "hierarchical" needs levels, so it runs below as each composition across nodes
    flat = [name for name in names(collective) if name != "hierarchical"]
    results = [simulate(collective, name, nbytes, cluster.network(), cluster.size, cluster.gamma,
                        slowdown=slowdown) for name in flat]
    if collective in HIERARCHICAL_INTER and cluster.nodes > 1 and cluster.ranks_per_node > 1:
        results += [simulate_hierarchical(nbytes, cluster.network(), cluster.size, cluster.ranks_per_node,
                                          inter, cluster.gamma, slowdown, collective)
                    for inter in HIERARCHICAL_INTER[collective]]
    return results


def collective_table(args: argparse.Namespace) -> int:
    nbytes = parse_bytes(args.size)
    cluster = cluster_of(args, int(args.nodes))
    print(f"# {args.collective} of {nbytes} B on {cluster.describe()}")
    print(f"{'algorithm':<32}{'time':>12}{'busbw GB/s':>12}{'sent/rank':>14}{'messages':>10}{'sim s':>8}")
    results = every_algorithm(args.collective, nbytes, cluster, _slowdown(args))
    for result in sorted(results, key=lambda r: r.seconds):
        print(f"{result.algorithm:<32}{_time(result.seconds):>12}{result.busbw:>12.1f}"
              f"{result.bytes_sent / GB:>12.3f}GB{result.messages:>10}{result.wall_seconds:>8.1f}")
    return 0


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def train_table(args: argparse.Namespace) -> int:
    training = Training(params=args.params, layers=args.layers, hidden=args.hidden, seq=args.seq,
                        micro_batch=args.micro_batch, micro_batches=args.micro_batches, dp=args.dp,
                        tp=args.tp, pp=args.pp, ep=args.ep, top_k=args.top_k, placement=args.placement)
    cluster = cluster_of(args, int(args.nodes))
    print(f"# {training.params / 1e9:g}B parameters, dp {training.dp} x tp {training.tp} x pp {training.pp}"
          f" (ep {training.ep}), {training.micro_batches} micro-batches of {training.micro_batch} x "
          f"{training.seq} tokens, on {cluster.describe()}")
    gradient = training.params * training.bytes_per_value
    print(f"gradient of the whole model: {gradient / GB:.0f} GB; a ring all-reduce over n ranks sends "
          f"2(n-1)/n of it per rank: {2 * (training.dp - 1) / training.dp * gradient / GB:.0f} GB at n = dp "
          f"= {training.dp} without model parallelism")
    plans = compare_placements(training, cluster) if args.compare else [plan_step(training, cluster)]
    print(f"{'placement':<11}{'dim':<5}{'calls':>7}{'bytes/call':>12}{'per call':>12}{'per step':>12}"
          f"{'sent/rank':>12}  algorithm")
    for plan in plans:
        _print_plan(plan)
    return 0


def _print_plan(plan: StepPlan) -> None:
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


def scale_table(args: argparse.Namespace) -> int:
    nbytes = parse_bytes(args.size)
    nodes = [int(n) for n in str(args.nodes).split(",")]
    rows: dict[str, list[float]] = {}
    for count in nodes:
        for result in every_algorithm(args.collective, nbytes, cluster_of(args, count)):
            rows.setdefault(result.algorithm, []).append(result.seconds)
    base = cluster_of(args, nodes[0])
    print(f"# {args.collective} of {nbytes} B; nodes of {base.ranks_per_node} GPUs; time per call")
    print(f"{'algorithm':<32}" + "".join(f"{n * base.ranks_per_node:>11}" for n in nodes))
    for name, times in rows.items():
        if len(times) == len(nodes):
            print(f"{name:<32}" + "".join(f"{_time(t):>11}" for t in times))
    if args.plot:
        _plot(args.plot, [n * base.ranks_per_node for n in nodes], rows, args.collective, nbytes)
    return 0


def _plot(path: str, sizes: list[int], rows: dict[str, list[float]], collective: str, nbytes: int) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed)")
        return
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, times in rows.items():
        if len(times) == len(sizes):
            axes.plot(sizes, times, marker="o", label=name)
    axes.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="predicted seconds",
             title=f"{collective} of {nbytes} B (colls plan, simulated)")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)
    print(f"plot: {path}")
