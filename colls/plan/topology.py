"""The cluster `colls plan` simulates: nodes of GPUs on NVLink, NICs, a leaf-spine fabric.

Ranks sit on GPU slots in order: slot g is GPU g % ranks_per_node of node g // ranks_per_node, and
node k hangs off leaf switch k // nodes_per_leaf. Every link is one direction of a wire:

- inside a node each GPU has its own link into a non-blocking NVSwitch (`intra_bandwidth`, per
  direction: NVLink 4's "900 GB/s" is 450 GB/s each way);
- GPU i of a node uses NIC i·nics/ranks_per_node (GPUs share a NIC when there are fewer NICs);
- each leaf has one aggregate uplink and one downlink to the spine, of capacity
  nodes_per_leaf · nics · nic_bandwidth / oversubscription (ECMP spreading flows perfectly);
- the spine itself does not block.

The defaults are a DGX-H100-like node (8 GPUs, 8 × 400 Gb/s NICs) under 8-node leaves; the named
machines are in `presets`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from transports.sim import Link, Route

GB = 1e9


@dataclass(frozen=True)
class Cluster:
    """A leaf-spine GPU cluster: sizes, bandwidths (bytes/s per direction) and latencies (s)."""

    nodes: int = 1
    ranks_per_node: int = 8
    intra_bandwidth: float = 450 * GB
    intra_latency: float = 3e-6
    nics_per_node: int = 8
    nic_bandwidth: float = 50 * GB          # 400 Gb/s
    nic_latency: float = 5e-6
    nodes_per_leaf: int = 8
    oversubscription: float = 1.0
    switch_latency: float = 0.5e-6
    reduce_bandwidth: float = 1000 * GB     # γ = 1 / this: bytes reduced per second on a GPU
    slow_links: dict[str, float] = field(default_factory=dict, compare=False)   # link name -> factor
    # what NCCL gets of a link's line rate (`colls.plan.presets` says where each figure comes from)
    nvlink_efficiency: float = 0.822        # Simple protocol over NVLink: ~370 of 450 GB/s
    nic_efficiency: float = 0.96            # 48 of 50 GB/s per 400 Gb/s NIC
    nvls_fraction: float = 0.0              # NVLink SHARP all-reduce algbw / NVLink rate (0: no NVLS)
    hbm: float = 80 * GB                    # memory per GPU, bytes
    gpu_flops: float = 989e12               # dense bf16 peak per GPU
    name: str = "custom"

    @property
    def size(self) -> int:
        """GPU slots in the cluster."""
        return self.nodes * self.ranks_per_node

    @property
    def gamma(self) -> float:
        """Seconds per byte reduced."""
        return 1 / self.reduce_bandwidth

    def with_nodes(self, nodes: int) -> Cluster:
        """The same cluster with `nodes` nodes."""
        return replace(self, nodes=nodes)

    def network(self, slots: list[int] | None = None) -> LeafSpine:
        """The links of this cluster, with rank r on GPU slot `slots[r]` (default: slot r)."""
        return LeafSpine(self, slots)

    def describe(self) -> str:
        """One line: the cluster's shape and speeds."""
        leaves = -(-self.nodes // self.nodes_per_leaf)
        return (f"{self.name}: {self.nodes} nodes x {self.ranks_per_node} GPUs ({self.size}), NVLink "
                f"{self.intra_bandwidth / GB:g} GB/s, {self.nics_per_node} NICs x "
                f"{self.nic_bandwidth / GB:g} GB/s, {leaves} leaves of {self.nodes_per_leaf} nodes, "
                f"oversubscription {self.oversubscription:g}:1"
                + (f", NVLS (algbw {self.nvls_fraction * self.intra_bandwidth / GB:.0f} GB/s)"
                   if self.nvls_fraction else "") + f", HBM {self.hbm / GB:g} GB")


class LeafSpine:
    """The routes between GPU slots of a `Cluster`, built lazily (a network for `SimWorld`)."""

    def __init__(self, cluster: Cluster, slots: list[int] | None) -> None:
        self.cluster = cluster
        self.slots = slots
        self.links: dict[str, Link] = {}

    def link(self, name: str, capacity: float) -> Link:
        """The link called `name`, made on first use (a slow link's capacity divided by its factor)."""
        found = self.links.get(name)
        if found is None:
            capacity /= self.cluster.slow_links.get(name, 1.0)
            found = self.links[name] = Link(name, capacity)
        return found

    def route(self, src: int, dst: int) -> Route:
        """GPU to GPU through NVSwitch, NIC to NIC under one leaf, or up and down through the spine."""
        c = self.cluster
        if self.slots is not None:
            src, dst = self.slots[src], self.slots[dst]
        src_node, dst_node = src // c.ranks_per_node, dst // c.ranks_per_node
        if src_node == dst_node:
            return Route(c.intra_latency, (self.link(f"gpu{src}.out", c.intra_bandwidth),
                                           self.link(f"gpu{dst}.in", c.intra_bandwidth)), "intra")
        src_nic = f"node{src_node}.nic{src % c.ranks_per_node * c.nics_per_node // c.ranks_per_node}"
        dst_nic = f"node{dst_node}.nic{dst % c.ranks_per_node * c.nics_per_node // c.ranks_per_node}"
        out = self.link(f"{src_nic}.out", c.nic_bandwidth)
        into = self.link(f"{dst_nic}.in", c.nic_bandwidth)
        src_leaf, dst_leaf = src_node // c.nodes_per_leaf, dst_node // c.nodes_per_leaf
        if src_leaf == dst_leaf:
            return Route(c.nic_latency + c.switch_latency, (out, into))
        uplink = c.nodes_per_leaf * c.nics_per_node * c.nic_bandwidth / c.oversubscription
        return Route(c.nic_latency + 3 * c.switch_latency,
                     (out, self.link(f"leaf{src_leaf}.up", uplink), self.link(f"leaf{dst_leaf}.down", uplink),
                      into))
