"""NCCL's large-message algorithms priced from link loads: what a GPU cluster actually runs.

The `sim` transport runs colls' own algorithms message by message; NCCL on a GPU cluster runs
others, which this module prices in closed form from the loads they put on every link of a
`Cluster` (every group of a partition running at once, so groups sharing a NIC or a leaf uplink
slow each other):

- **ring** with many channels (NCCL's several rings at once): each channel leaves a node through a
  different NIC, so a node's cross-node traffic is spread over the NICs of the group's GPUs there,
  and a GPU's NVLink carries (g-1)/g of the ring's rate when g of the group's GPUs share its node;
  busbw = min over links (capacity x efficiency / load).
- **tree** (NCCL's double binary tree across nodes, a chain inside each node), pipelined: the chain
  and the network run at once, so the time is the slower of the two. A node sends and receives S
  per direction on 2 nodes and 2S beyond (interior in one tree, leaf in the other).
- **nvls** (NVLink SHARP, one node): the NVSwitch reduces and multicasts; algbw is a fixed share of
  the NVLink rate (`Cluster.nvls_fraction`), per GPU, whatever the group size.
- **nvls_tree** (several nodes): NVLS inside each node pipelined with the tree across nodes.

Latency per step follows NCCL's tuning model (src/graph/tuning.cc): about 3.4 us per NVLink step
and 9.6 us per network step for the Simple protocol.

A straggler (`slow={rank: factor}`) has its NVLink port, its NIC and its NVLS share divided by the
factor; as every group waits for its slowest member, the call takes the slowest group's time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from .topology import Cluster

INTRA_STEP = 3.4e-6
NET_STEP = 9.6e-6
BASE = 8.4e-6

FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
          "broadcast": lambda n: 1.0}
ALGORITHMS = {"all_reduce": ("ring", "tree", "nvls", "nvls_tree"), "all_gather": ("ring",),
              "reduce_scatter": ("ring",), "broadcast": ("ring",), "all_to_all": ("pairwise",)}


@dataclass(frozen=True)
class Estimate:
    """One priced call: seconds, nccl-tests' busbw (GB/s) and the link class that bounds it."""

    collective: str
    algorithm: str
    size: int           # ranks per group
    nbytes: int
    seconds: float
    bound: str

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth in GB/s: S / t times the collective's factor."""
        if self.size < 2 or self.seconds <= 0:
            return 0.0
        return self.nbytes / self.seconds * FACTOR[self.collective](self.size) / 1e9


class Loads:
    """Per-link loads of every group at once, and the capacities of those links."""

    def __init__(self, cluster: Cluster, slow: dict[int, float] | None) -> None:
        self.cluster = cluster
        self.slow = slow or {}
        self.load: dict[tuple, float] = defaultdict(float)

    def node(self, slot: int) -> int:
        """The node of GPU slot `slot`."""
        return slot // self.cluster.ranks_per_node

    def nic(self, slot: int) -> tuple:
        """("nic", node, index) of the NIC GPU slot `slot` uses (its rail)."""
        c = self.cluster
        return ("nic", self.node(slot), slot % c.ranks_per_node * c.nics_per_node // c.ranks_per_node)

    def capacity(self, link: tuple) -> float:
        """Bytes per second the model lets through `link` (a straggler's own links slowed)."""
        c = self.cluster
        kind = link[0]
        if kind == "nvl":
            return c.intra_bandwidth * c.nvlink_efficiency / self.slow.get(link[1], 1.0)
        if kind == "nic":
            slowest = max((f for r, f in self.slow.items() if self.nic(r) == link[:3]), default=1.0)
            return c.nic_bandwidth * c.nic_efficiency / slowest
        # a leaf's uplink or downlink: every NIC under it, divided by the oversubscription
        return c.nodes_per_leaf * c.nics_per_node * c.nic_bandwidth * c.nic_efficiency / c.oversubscription

    def add(self, link: tuple, amount: float) -> None:
        """`amount` more load on `link`."""
        self.load[link] += amount

    def bottleneck(self) -> tuple[float, str]:
        """(the most seconds any link needs per unit of load, that link's class)."""
        worst, name = 0.0, "none"
        for link, load in self.load.items():
            seconds = load / self.capacity(link)
            if seconds > worst:
                worst, name = seconds, {"nvl": "nvlink", "nic": "nic", "up": "leaf uplink",
                                        "down": "leaf uplink"}[link[0]]
        return worst, name

    def spread_nics(self, members: list[int], direction: str, amount: float) -> None:
        """`amount` through the NICs of `members` (one node's), evenly."""
        nics = sorted({self.nic(m) for m in members})
        for nic in nics:
            self.add((*nic, direction), amount / len(nics))


def _by_node(loads: Loads, group: list[int]) -> list[list[int]]:
    nodes: dict[int, list[int]] = {}
    for slot in sorted(group):
        nodes.setdefault(loads.node(slot), []).append(slot)
    return list(nodes.values())


def _leaf(cluster: Cluster, node: int) -> int:
    return node // cluster.nodes_per_leaf


def unique_groups(groups: list[list[int]]) -> list[list[int]]:
    """The distinct groups of a partition given as groups[rank]."""
    return [list(g) for g in sorted({tuple(sorted(g)) for g in groups})]


_CACHE: dict[tuple, tuple[float, str]] = {}


def _cached(kind: str, cluster: Cluster, groups: list[list[int]], slow, compute) -> tuple[float, str]:
    """`compute()` once per (kind, cluster, groups, straggler): the loads grow linearly with the
    bytes, so each is kept per byte (`colls plan search` prices one layout's groups many times)."""
    key = (kind, cluster, tuple(map(tuple, groups)), tuple(sorted((slow or {}).items())))
    found = _CACHE.get(key)
    if found is None:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        found = _CACHE[key] = compute()
    return found


def ring_time_per_unit(cluster: Cluster, groups: list[list[int]], slow=None) -> tuple[float, str]:
    """Seconds per byte each rank sends in a multi-channel ring, every group at once."""
    return _cached("ring", cluster, groups, slow, lambda: _ring_loads(cluster, groups, slow))


def _ring_loads(cluster: Cluster, groups: list[list[int]], slow) -> tuple[float, str]:
    loads = Loads(cluster, slow)
    for group in groups:
        if len(group) < 2:
            continue
        nodes = _by_node(loads, group)
        if len(nodes) == 1:
            for m in group:
                loads.add(("nvl", m, "out"), 1.0)
                loads.add(("nvl", m, "in"), 1.0)
            continue
        for k, members in enumerate(nodes):
            following = nodes[(k + 1) % len(nodes)]
            for m in members:   # g-1 of the g hops inside a node are NVLink, channels rotating
                loads.add(("nvl", m, "out"), (len(members) - 1) / len(members))
                loads.add(("nvl", m, "in"), (len(members) - 1) / len(members))
            loads.spread_nics(members, "out", 1.0)
            loads.spread_nics(following, "in", 1.0)
            here, there = _leaf(cluster, loads.node(members[0])), _leaf(cluster, loads.node(following[0]))
            if here != there:
                loads.add(("up", here), 1.0)
                loads.add(("down", there), 1.0)
    return loads.bottleneck()


def tree_network_seconds(cluster: Cluster, groups: list[list[int]], nbytes: float, slow=None,
                         chain: bool = True) -> tuple[float, str]:
    """Seconds of the tree phase across nodes (and of the chain inside them, if `chain`), the
    slower of the two, every group at once."""
    per_byte, bound = _cached(f"tree{chain}", cluster, groups, slow,
                              lambda: _tree_loads(cluster, groups, 1.0, slow, chain))
    return per_byte * nbytes, bound


def _tree_loads(cluster: Cluster, groups: list[list[int]], nbytes: float, slow, chain: bool):
    loads = Loads(cluster, slow)
    for group in groups:
        nodes = _by_node(loads, group)
        count = len(nodes)
        per_node = nbytes if count == 2 else 2 * nbytes
        leaves = defaultdict(int)
        for members in nodes:
            leaves[_leaf(cluster, loads.node(members[0]))] += 1
        for members in nodes:
            if chain and len(members) > 1:   # the chain: up and down through every GPU
                for m in members:
                    loads.add(("nvl", m, "out"), 2 * nbytes)
                    loads.add(("nvl", m, "in"), 2 * nbytes)
            if count < 2:
                continue
            loads.spread_nics(members, "out", per_node)
            loads.spread_nics(members, "in", per_node)
            leaf = _leaf(cluster, loads.node(members[0]))
            away = (count - leaves[leaf]) / (count - 1)   # tree edges to nodes under other leaves
            loads.add(("up", leaf), per_node * away)
            loads.add(("down", leaf), per_node * away)
    return loads.bottleneck()


def _latency(cluster: Cluster, algorithm: str, collective: str, size: int, nodes: int) -> float:
    local = size // nodes
    if algorithm == "ring":
        steps = (2 if collective == "all_reduce" else 1) * (size - 1)
        inter = (2 if collective == "all_reduce" else 1) * (nodes - 1) if nodes > 1 else 0
        return BASE + (steps - inter) * INTRA_STEP + inter * NET_STEP
    if algorithm == "pairwise":
        return BASE + (local - 1) * INTRA_STEP + (size - local) * NET_STEP / max(local, 1)
    tree_depth = math.ceil(math.log2(nodes)) if nodes > 1 else 0
    intra = 2 * INTRA_STEP if algorithm.startswith("nvls") else 2 * (local - 1) * INTRA_STEP
    return BASE + intra + 2 * tree_depth * NET_STEP


def price(collective: str, algorithm: str, nbytes: int, cluster: Cluster, groups: list[list[int]],
          slow: dict[int, float] | None = None) -> Estimate | None:
    """One call of `collective` by `algorithm` on every group at once; None where the algorithm
    does not apply (NVLS without NVLink SHARP, NVLS tree on one node, tree on one node).

    Args:
        collective: all_reduce, all_gather, reduce_scatter, broadcast or all_to_all.
        algorithm: one of `ALGORITHMS[collective]`.
        nbytes: S, nccl-tests' size (the whole buffer of an all_reduce; the gathered one of an
            all_gather; the sent one of an all_to_all).
        cluster: the machine.
        groups: the distinct groups of GPU slots calling at once.
        slow: straggler ranks and their factors.

    Returns:
        The estimate (the slowest group's), or None.

    Raises:
        ValueError: an unknown collective or algorithm.
    """
    if algorithm not in ALGORITHMS.get(collective, ()):
        raise ValueError(f"no NCCL model of {collective} by {algorithm!r}")
    groups = [g for g in groups if len(g) > 1]
    if not groups:
        return Estimate(collective, algorithm, 1, nbytes, 0.0, "none")
    size = max(len(g) for g in groups)
    nodes = max(len({slot // cluster.ranks_per_node for slot in g}) for g in groups)
    slow = slow or {}
    factor = FACTOR[collective](size)
    if algorithm == "ring":
        per_byte, bound = ring_time_per_unit(cluster, groups, slow)
        seconds = factor * nbytes * per_byte
    elif algorithm == "pairwise":
        seconds, bound = _all_to_all_seconds(cluster, groups, nbytes, slow)
    else:
        nvls = algorithm.startswith("nvls")
        if nvls and (cluster.nvls_fraction <= 0 or size // nodes < 2):
            return None
        if (algorithm == "nvls") != (nodes == 1) or (algorithm == "tree" and nodes == 1):
            return None
        seconds, bound = tree_network_seconds(cluster, groups, nbytes, slow, chain=not nvls)
        if nvls:   # the switch's reduction and multicast, per GPU, beside the network phase
            slowest = max((slow.get(m, 1.0) for g in groups for m in g), default=1.0)
            switch = nbytes * slowest / (cluster.nvls_fraction * cluster.intra_bandwidth)
            if switch >= seconds:
                seconds, bound = switch, "nvls"
    return Estimate(collective, algorithm, size, nbytes,
                    seconds + _latency(cluster, algorithm, collective, size, nodes), bound)


def _all_to_all_seconds(cluster: Cluster, groups: list[list[int]], nbytes: int,
                        slow: dict[int, float]) -> tuple[float, str]:
    """Every rank sends nbytes / n to each other member: NVLink inside the node, NICs across."""
    per_byte, bound = _cached("all_to_all", cluster, groups, slow,
                              lambda: _all_to_all_loads(cluster, groups, 1.0, slow))
    return per_byte * nbytes, bound


def _all_to_all_loads(cluster: Cluster, groups: list[list[int]], nbytes: float, slow):
    loads = Loads(cluster, slow)
    for group in groups:
        n = len(group)
        block = nbytes / n
        nodes = _by_node(loads, group)
        for members in nodes:
            local = len(members)
            for m in members:
                loads.add(("nvl", m, "out"), block * (local - 1))
                loads.add(("nvl", m, "in"), block * (local - 1))
            away = block * local * (n - local)   # what this node's members send off the node
            loads.spread_nics(members, "out", away)
            loads.spread_nics(members, "in", away)
            leaf = _leaf(cluster, loads.node(members[0]))
            same_leaf = sum(len(o) for o in nodes if _leaf(cluster, loads.node(o[0])) == leaf)
            off_leaf = block * local * (n - same_leaf)
            loads.add(("up", leaf), off_leaf)
            loads.add(("down", leaf), off_leaf)
    return loads.bottleneck()


def best(collective: str, nbytes: int, cluster: Cluster, groups: list[list[int]],
         slow: dict[int, float] | None = None) -> Estimate:
    """The fastest of NCCL's algorithms for this call (what its tuner would pick)."""
    found = [price(collective, name, nbytes, cluster, groups, slow) for name in ALGORITHMS[collective]]
    return min((e for e in found if e is not None), key=lambda e: e.seconds)


def every(collective: str, nbytes: int, cluster: Cluster, groups: list[list[int]],
          slow: dict[int, float] | None = None) -> list[Estimate]:
    """Every applicable NCCL algorithm for this call, fastest first."""
    found = [price(collective, name, nbytes, cluster, groups, slow)
             for name in ALGORITHMS.get(collective, ())]
    return sorted((e for e in found if e is not None), key=lambda e: e.seconds)


def whole_cluster(cluster: Cluster) -> list[list[int]]:
    """One group of every GPU slot of the cluster."""
    return [list(range(cluster.size))]
