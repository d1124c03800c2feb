"""`colls plan`: predicted times on a GPU cluster, simulated (`sim` transport) and from NCCL's model.

    colls plan collective -c all_reduce -s 1GiB --preset dgx-h100 --nodes 2 [--json]
    colls plan train --params 100e9 --dp 16 --tp 8 --pp 8 --zero 1 --v 2 --nodes 128 [--compare] [--json]
    colls plan search --params 100e9 --layers 80 --global-batch 1024 --nodes 128 --oversubscription 2
    colls plan scale -c all_reduce -s 1G --nodes 1,2,4,8 [--plot f.png]
    colls plan collective -c broadcast --plugin mypkg.algos --algorithm my_tree --nodes 128

Sizes and rates are decimal (`units.SIZE_CONVENTION`); link speeds need a unit (--nic 400Gb/s).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from algorithms import lookup, names
from algorithms.cost import Machine

from . import nccl_model
from .presets import PRESETS, preset
from .simulate import simulate, simulate_hierarchical
from .topology import GB, Cluster
from .units import SIZE_CONVENTION, parse_rate, parse_size, size_label

# what runs across nodes in each hierarchical composition colls plan lists
HIERARCHICAL_INTER = {"all_reduce": ("ring", "rabenseifner", "tree", "recursive_doubling"),
                      "broadcast": ("binomial", "pipeline", "scatter_allgather")}


def parse_bytes(text: str) -> int:
    """A size as `units.parse_size` reads it: '1G' = 1e9 B, '1GiB' = 2**30 B."""
    return parse_size(text)


def add_cluster_options(mode: argparse.ArgumentParser, nodes_default: str) -> None:
    """The options every mode shares: a preset, overrides with units, a straggler."""
    mode.add_argument("--preset", default="dgx-h100", choices=sorted(PRESETS),
                      help="a named machine's GPUs per node, links, HBM and compute (default dgx-h100)")
    mode.add_argument("--nodes", default=nodes_default, help="nodes (scale: a comma-separated list)")
    mode.add_argument("--ranks-per-node", type=int, default=None, help="GPUs per node (preset's)")
    mode.add_argument("--nics-per-node", type=int, default=None, help="NICs per node (preset's)")
    mode.add_argument("--nic", default=None, help="NIC speed per direction with a unit: 400Gb/s or 50GB/s")
    mode.add_argument("--nvlink", default=None,
                      help="NVLink per GPU and direction with a unit: 450GB/s (NVLink 4's '900 GB/s' "
                           "counts both directions)")
    mode.add_argument("--hbm", default=None, help="memory per GPU, e.g. 80G (decimal) or 80GiB")
    mode.add_argument("--nodes-per-leaf", type=int, default=8)
    mode.add_argument("--oversubscription", type=float, default=1.0, help="leaf uplink ratio, e.g. 2")
    mode.add_argument("--slow-rank", type=int, default=None,
                      help="a straggler: its compute, its links and its latency --slow-factor times slower")
    mode.add_argument("--slow-factor", type=float, default=10.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The modes of `colls plan` and the cluster options they share."""
    from .cli_train import add_search_arguments, add_train_arguments

    modes = parser.add_subparsers(dest="mode", required=True, metavar="mode")
    collective = modes.add_parser("collective", help="every algorithm of one collective: simulated "
                                                     "(colls') and NCCL's, priced from link loads")
    collective.add_argument("-c", "--collective", default="all_reduce")
    collective.add_argument("-s", "--size", default="1GiB", help="buffer bytes S (1G = 1e9, 1GiB = 2^30)")
    collective.add_argument("--json", action="store_true", help="machine-readable output")
    train = modes.add_parser("train", help="one step of a DP x TP x PP (x EP) job: time per dimension, "
                                           "memory per GPU")
    add_train_arguments(train)
    search = modes.add_parser("search", help="every layout that fits in memory, priced and ranked")
    add_search_arguments(search)
    scale = modes.add_parser("scale", help="predicted time against cluster size")
    scale.add_argument("-c", "--collective", default="all_reduce")
    scale.add_argument("-s", "--size", default="1GiB")
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
    for mode in (collective, train, search, scale):
        add_cluster_options(mode, "128" if mode in (train, search) else "16")
    for mode in (collective, scale):
        mode.add_argument("--algorithm", default=None, metavar="NAME",
                          help="simulate only this algorithm (beside NCCL's model), with its declared "
                               "alpha-beta cost where it has one (a plugin's `cost=`)")
        mode.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                          help="a module or .py file of colls.algorithm schedules to load first; repeatable")


def only_algorithm(args: argparse.Namespace) -> str | None:
    """Load `--plugin`s, then check `--algorithm` against the collective's names.

    Raises:
        SystemExit: a plugin that does not load, or an algorithm the collective lacks.
    """
    from colls.plugins import load

    try:
        for plugin in args.plugin:
            load(plugin)
    except ValueError as error:
        raise SystemExit(f"colls plan: {error}") from None
    if args.algorithm == "hierarchical":
        raise SystemExit("colls plan: --algorithm hierarchical runs as its compositions across nodes: "
                         "leave --algorithm out to see them")
    if args.algorithm is not None and args.algorithm not in names(args.collective):
        raise SystemExit(f"colls plan: --algorithm {args.algorithm}: {args.collective} has none of that "
                         f"name; choose from {names(args.collective)} (a plugin's: load it with --plugin)")
    return args.algorithm


def alpha_beta(cluster: Cluster) -> Machine:
    """The textbook α, β, γ of `cluster` for a flat algorithm: a message between two nodes (under
    one leaf) when it has several, over NVLink when one; β per rank's share of the NICs."""
    if cluster.nodes == 1:
        return Machine(cluster.intra_latency, 1 / cluster.intra_bandwidth, cluster.gamma)
    share = cluster.nic_bandwidth * cluster.nics_per_node / cluster.ranks_per_node
    return Machine(cluster.nic_latency + cluster.switch_latency, 1 / share, cluster.gamma)


def declared_cost(collective: str, algorithm: str, nbytes: int, cluster: Cluster) -> float | None:
    """`algorithm`'s own α-β cost (`colls.algorithm(cost=)`) on `cluster`, or None without one."""
    cost = lookup(collective, algorithm).cost
    return None if cost is None else float(cost(cluster.size, nbytes, alpha_beta(cluster)))


def cluster_of(args: argparse.Namespace, nodes: int) -> Cluster:
    """The `Cluster` the options describe, with `nodes` nodes.

    Raises:
        SystemExit: a bandwidth without a unit, or a bad size (the message names the option).
    """
    overrides: dict = {"nodes": nodes, "nodes_per_leaf": args.nodes_per_leaf,
                       "oversubscription": args.oversubscription}
    try:
        if args.nic is not None:
            overrides["nic_bandwidth"] = parse_rate(args.nic, "--nic")
        if args.nvlink is not None:
            overrides["intra_bandwidth"] = parse_rate(args.nvlink, "--nvlink")
        if args.hbm is not None:
            overrides["hbm"] = float(parse_size(args.hbm))
    except ValueError as error:
        raise SystemExit(f"colls plan: {error}") from None
    if args.ranks_per_node is not None:
        overrides["ranks_per_node"] = args.ranks_per_node
        if args.nics_per_node is None:
            overrides["nics_per_node"] = min(args.ranks_per_node, PRESETS[args.preset][2])
    if args.nics_per_node is not None:
        overrides["nics_per_node"] = args.nics_per_node
    cluster = preset(args.preset, **overrides)
    slow = slowdown(args, cluster.size)
    if slow:   # its links too: the sim's slow_links by name
        (rank, factor), = slow.items()
        node, local = divmod(rank, cluster.ranks_per_node)
        nic = local * cluster.nics_per_node // cluster.ranks_per_node
        cluster = replace(cluster, slow_links={f"gpu{rank}.out": factor, f"gpu{rank}.in": factor,
                                               f"node{node}.nic{nic}.out": factor,
                                               f"node{node}.nic{nic}.in": factor})
    return cluster


def slowdown(args: argparse.Namespace, size: int) -> dict[int, float] | None:
    """{rank: factor} of --slow-rank and --slow-factor, or None.

    Raises:
        SystemExit: a rank outside the cluster or a factor below 1.
    """
    if args.slow_rank is None:
        return None
    if not 0 <= args.slow_rank < size:
        raise SystemExit(f"colls plan: --slow-rank {args.slow_rank} is not a rank of the {size} GPUs")
    if args.slow_factor < 1:
        raise SystemExit(f"colls plan: --slow-factor {args.slow_factor:g} must be at least 1")
    return {args.slow_rank: args.slow_factor}


def plan_command(args: argparse.Namespace) -> int:
    """Run the chosen mode and print its table."""
    from .cli_train import search_table, train_table

    if args.mode == "collective":
        return collective_table(args)
    if args.mode == "train":
        return train_table(args)
    if args.mode == "search":
        return search_table(args)
    if args.mode == "calibrate":
        from .cli_calibrate import calibrate_table
        return calibrate_table(args)
    return scale_table(args)


def every_algorithm(collective: str, nbytes: int, cluster: Cluster, slowdown=None, only: str | None = None):
    """Simulated results of every flat algorithm and (all_reduce, broadcast) every hierarchical
    composition; hierarchical all_to_all is not simulated (its regrouping needs real buffers).
    `only`: that algorithm alone."""
    if only is not None:
        return [simulate(collective, only, nbytes, cluster.network(), cluster.size, cluster.gamma,
                         slowdown=slowdown)]
    # the registered "hierarchical" needs levels, so it runs below as each composition across nodes
    flat = [name for name in names(collective) if name != "hierarchical"]
    results = [simulate(collective, name, nbytes, cluster.network(), cluster.size, cluster.gamma,
                        slowdown=slowdown) for name in flat]
    if collective in HIERARCHICAL_INTER and cluster.nodes > 1 and cluster.ranks_per_node > 1:
        results += [simulate_hierarchical(nbytes, cluster.network(), cluster.size, cluster.ranks_per_node,
                                          inter, cluster.gamma, slowdown, collective)
                    for inter in HIERARCHICAL_INTER[collective]]
    return results


def nccl_rows(collective: str, nbytes: int, cluster: Cluster, slow=None) -> list[nccl_model.Estimate]:
    """NCCL's algorithms for one call over the whole cluster, priced from link loads."""
    if collective not in nccl_model.ALGORITHMS:
        return []
    return nccl_model.every(collective, nbytes, cluster, nccl_model.whole_cluster(cluster), slow)


def collective_table(args: argparse.Namespace) -> int:
    """Every simulated algorithm and every NCCL one, fastest first (or --json)."""
    try:
        nbytes = parse_bytes(args.size)
    except ValueError as error:
        raise SystemExit(f"colls plan: -s: {error}") from None
    only = only_algorithm(args)
    cluster = cluster_of(args, int(args.nodes))
    slow = slowdown(args, cluster.size)
    simulated = every_algorithm(args.collective, nbytes, cluster, slow, only)
    declared = None if only is None else declared_cost(args.collective, only, nbytes, cluster)
    modelled = nccl_rows(args.collective, nbytes, cluster, slow)
    rows = [(r.algorithm, r.seconds, r.busbw, "sim", r.bytes_sent, r.messages, r.wall_seconds)
            for r in simulated]
    rows += [(f"nccl/{e.algorithm}", e.seconds, e.busbw, f"model ({e.bound})", None, None, None)
             for e in modelled]
    rows.sort(key=lambda row: row[1])
    if args.json:
        print(json.dumps({"collective": args.collective, "nbytes": nbytes, "cluster": cluster.describe(),
                          "units": SIZE_CONVENTION, "slow": slow,
                          **({} if declared is None else {"declared": {"name": only, "time_s": declared}}),
                          "algorithms": [{"name": name, "time_s": seconds, "busbw_GBps": busbw,
                                          "source": source} for name, seconds, busbw, source, *_ in rows]},
                         indent=1))
        return 0
    print(f"# {args.collective} of {size_label(nbytes)} on {cluster.describe()}"
          + (f"; rank {args.slow_rank} {args.slow_factor:g}x slower" if slow else ""))
    print(f"# {SIZE_CONVENTION}; sim: colls' algorithms simulated; model: NCCL's, from link loads")
    print(f"{'algorithm':<32}{'time':>12}{'busbw GB/s':>12}{'sent/rank':>14}{'messages':>10}{'sim s':>8}"
          f"  source")
    for name, seconds, busbw, source, sent, messages, wall in rows:
        sent_text = f"{sent / GB:>12.3f}GB" if sent is not None else f"{'-':>14}"
        print(f"{name:<32}{_time(seconds):>12}{busbw:>12.1f}{sent_text}"
              f"{messages if messages is not None else '-':>10}"
              f"{f'{wall:.1f}' if wall is not None else '-':>8}  {source}")
    if declared is not None:
        machine = alpha_beta(cluster)
        print(f"# {only}'s declared alpha-beta cost: {_time(declared)} (alpha {machine.alpha * 1e6:.2f} us, "
              f"beta 1/({1 / machine.beta / GB:.1f} GB/s), gamma 1/({1 / machine.gamma / GB:.0f} GB/s); "
              f"simulated: {_time(simulated[0].seconds)})")
    return 0


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def scale_table(args: argparse.Namespace) -> int:
    """Predicted time of every algorithm at each cluster size."""
    nbytes = parse_bytes(args.size)
    nodes = [int(n) for n in str(args.nodes).split(",")]
    only = only_algorithm(args)
    rows: dict[str, list[float]] = {}
    for count in nodes:
        cluster = cluster_of(args, count)
        slow = slowdown(args, cluster.size)
        for result in every_algorithm(args.collective, nbytes, cluster, slow, only):
            rows.setdefault(result.algorithm, []).append(result.seconds)
        declared = None if only is None else declared_cost(args.collective, only, nbytes, cluster)
        if declared is not None:
            rows.setdefault(f"{only} (alpha-beta)", []).append(declared)
        for estimate in nccl_rows(args.collective, nbytes, cluster, slow):
            rows.setdefault(f"nccl/{estimate.algorithm}", []).append(estimate.seconds)
    base = cluster_of(args, nodes[0])
    print(f"# {args.collective} of {size_label(nbytes)}; {base.name} nodes of {base.ranks_per_node} GPUs; "
          f"time per call; {SIZE_CONVENTION}")
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
