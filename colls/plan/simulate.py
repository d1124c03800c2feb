"""Run registered algorithms, unchanged, on symbolic buffers over the `sim` transport.

`simulate` times one collective call (every rank, or every group of a partition of the ranks at
once, so that concurrent groups contend for the same links); `hierarchical_all_reduce` runs the
registered hierarchical all-reduce (the code real runs across hosts use) over sim sub-groups:
reduce-scatter inside each node, all-reduce across nodes among the ranks with the same local rank,
all-gather inside the node (as NCCL's and Horovod's hierarchical all-reduce).

Where every rank runs the same schedule up to a relabelling of the ranks (`SYMMETRIC`, on a buffer
that splits evenly over the ranks, no straggler), one rank per orbit is simulated
(`transports.sim.symmetry`): the smallest period under which the network is symmetric too, found
by trying each; where none is (a slow link), every rank is. The answer is the same either way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from algorithms import SUM, lookup
from algorithms.blocks import offsets
from algorithms.channel import Channel
from algorithms.hierarchical import Layout, Levels
from transports.base import COLLECTIVE_TAG_BASE, Traffic
from transports.errors import CollectiveMismatch
from transports.sim import NotSymmetric, SimTransport, SimulationFailed, SimWorld, Symmetry, symbolic

from .. import config

ROOTED = {"broadcast", "reduce", "gather", "scatter"}

# the schedules in which rank g(r) does what rank r does, for g a relabelling of this kind
# (`transports.sim.Symmetry`), when the buffer splits evenly: rings shift, halvings xor
SYMMETRIC = {("all_reduce", "ring"): "shift", ("all_reduce", "ring_segmented"): "shift",
             ("all_gather", "ring"): "shift", ("reduce_scatter", "ring"): "shift",
             ("all_reduce", "rabenseifner"): "xor", ("all_reduce", "recursive_doubling"): "xor"}


@dataclass(frozen=True)
class Result:
    """One simulated call: the predicted seconds (slowest rank), messages, and what it cost to run."""

    collective: str
    algorithm: str
    size: int
    nbytes: int
    seconds: float
    messages: int
    wall_seconds: float
    bytes_sent: int = 0        # the most any rank sent
    ranks_simulated: int = 0   # one per orbit where ranks are symmetric (`SYMMETRIC`), else all

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth, GB/s: S / t times the collective's factor."""
        factor = {"all_reduce": 2 * (self.size - 1) / self.size, "broadcast": 1.0, "reduce": 1.0}.get(
            self.collective, (self.size - 1) / self.size)
        return self.nbytes / self.seconds * factor / 1e9 if self.seconds > 0 else 0.0


def arguments(collective: str, rank: int, size: int, nbytes: int, dtype=np.float32,
              root: int = 0, make: Callable = symbolic) -> tuple:
    """Arguments of one rank's call, buffers from `make(count, dtype)` (symbolic by default);
    `nbytes` is S as `algorithms.cost` counts it."""
    itemsize = np.dtype(dtype).itemsize
    count = nbytes // itemsize
    block = count // size

    def buf(n: int):
        return make(n, dtype)

    if collective == "all_reduce":
        return buf(count), SUM
    if collective == "broadcast":
        return buf(count), root
    if collective == "reduce":
        return buf(count), SUM, root
    if collective == "all_gather":
        return buf(block), buf(block * size)
    if collective == "reduce_scatter":
        return buf(block * size), buf(block), SUM
    if collective == "all_to_all":
        return buf(block * size), buf(block * size)
    if collective == "all_to_all_v":
        counts = [block] * size
        return buf(block * size), counts, offsets(counts), buf(block * size), counts, offsets(counts)
    if collective == "gather":
        return buf(block), buf(block * size) if rank == root else None, root
    if collective == "scatter":
        return buf(block * size) if rank == root else None, buf(block), root
    if collective == "barrier":
        return ()
    raise ValueError(f"colls plan cannot simulate {collective!r}")


def run_algorithm(transport: SimTransport, collective: str, algorithm: str, nbytes: int,
                  dtype=np.float32, root: int = 0, source: bool = False,
                  before: Callable[[SimTransport, tuple], None] | None = None,
                  levels: Levels | None = None) -> int:
    """One rank's call of the registered `algorithm` of `collective` on symbolic buffers; returns
    the bytes this rank sent (counted by the same `Traffic` counters real runs use). `source`: an
    all_reduce schedule that reads its input itself gets one apart from its buffer, as
    `Communicator.all_reduce(x, out=...)` passes it. `before(transport, arguments)` runs once the
    buffers are made, before the schedule (the caller's own work on them). `levels`: a
    hierarchical algorithm's sub-groups (as the communicator hands them on the channel)."""
    algo = lookup(collective, algorithm)
    traffic = Traffic(transport.size)
    channel = Channel(transport, COLLECTIVE_TAG_BASE, math.inf, f"{collective} ({algorithm})", traffic,
                      levels)
    args = arguments(collective, transport.rank, transport.size, nbytes, dtype, root)
    if source and collective == "all_reduce" and algo.takes_source:
        args = (*args, symbolic(args[0].size, dtype))
    if before is not None:
        before(transport, args)
    algo.run(channel, *args)
    return sum(traffic.bytes_sent)


def hierarchical_all_reduce(transport: SimTransport, nbytes: int, local_size: int,
                            inter_algorithm: str = "ring", dtype=np.float32,
                            collective: str = "all_reduce", layout: Layout | None = None) -> int:
    """The registered hierarchical all-reduce (reduce-scatter in the node, all-reduce of the shard
    across nodes with `inter_algorithm`, all-gather in the node), or broadcast, over sim sub-groups
    of nodes of `local_size` consecutive ranks; returns the bytes this rank sent. `layout`: those
    nodes' `Layout`, if the caller made it once for every rank."""
    size = transport.size
    if layout is None:
        layout = Layout(tuple(rank // local_size for rank in range(size)))
    node = layout.members[layout.hosts[transport.rank]]
    intra = transport.subgroup(node, None)
    inter = transport.subgroup(layout.cross_members(layout.local_index(transport.rank)), None)

    def choose(level: str, step: str, nbytes: int) -> str:
        return inter_algorithm if level == "cross" else "binomial"   # inside: reduce, broadcast

    return run_algorithm(transport, collective, "hierarchical", nbytes, dtype,
                         levels=Levels(layout, intra, inter, choose))


def run_world(size: int, network, body: Callable[[SimTransport], object], gamma: float = 0.0,
              copy_seconds_per_byte: float = 0.0, slowdown: dict[int, float] | None = None,
              what: tuple[str, str, int] = ("", "", 0), symmetry: str | None = None,
              step: int = 1) -> Result:
    """Run `body` on every rank of a fresh `SimWorld`; the result's time is the slowest rank's.
    `symmetry`: `body` is the same on every rank up to relabellings of this kind ("shift" or
    "xor"): then run one rank per orbit of the smallest period (a multiple of `step`) under which
    the network is symmetric too, and every rank where none is or that run fails."""
    threads = config.get("COLLS_SIM_THREADS")
    start = time.perf_counter()
    world = None
    for period in _periods(size, step, symmetry) if symmetry and not slowdown else ():
        try:
            quotient = SimWorld(size, network, gamma, copy_seconds_per_byte, threads=threads,
                                symmetry=Symmetry(size, period, symmetry))
            sent = quotient.run(body)
        except NotSymmetric:
            continue   # a longer period, or every rank
        except (SimulationFailed, CollectiveMismatch):
            break      # not the same program on every rank after all: every rank, which says why
        world = quotient
        break
    if world is None:
        world = SimWorld(size, network, gamma, copy_seconds_per_byte, slowdown, threads=threads)
        sent = world.run(body)
    wall = time.perf_counter() - start
    collective, algorithm, nbytes = what
    most = max((s for s in sent if isinstance(s, int)), default=0)
    order = 1 if world.symmetry is None else world.symmetry.order
    return Result(collective, algorithm, size, nbytes, max(world.finish_times), world.messages * order,
                  wall, most, len(world.ranks))


def _periods(size: int, step: int, kind: str) -> list[int]:
    """The periods a symmetry of `kind` may have on `size` ranks, multiples of `step`, shortest first."""
    return [period for period in range(step, size, step) if size % period == 0
            and (kind == "shift" or not (period & (period - 1) or size & (size - 1)))]


def _even(nbytes: int, size: int, dtype=np.float32) -> bool:
    """Whether `nbytes` of `dtype` split into `size` equal blocks."""
    return nbytes % (size * np.dtype(dtype).itemsize) == 0


def simulate(collective: str, algorithm: str, nbytes: int, network, size: int, gamma: float = 0.0,
             copy_seconds_per_byte: float = 0.0, groups: list[list[int]] | None = None,
             slowdown: dict[int, float] | None = None, dtype=np.float32, root: int = 0) -> Result:
    """Predicted time of one call on `size` ranks over `network`; with `groups` (a partition of the
    ranks, `groups[r]` the group of rank r), every group makes the call at the same time."""

    def body(transport: SimTransport) -> int:
        if groups is not None:
            transport = transport.subgroup(groups[transport.rank], None)
        return run_algorithm(transport, collective, algorithm, nbytes, dtype, root)

    even = groups is None and _even(nbytes, size, dtype)
    symmetry = SYMMETRIC.get((collective, algorithm)) if even else None
    return run_world(size, network, body, gamma, copy_seconds_per_byte, slowdown,
                     (collective, algorithm, nbytes), symmetry)


def simulate_hierarchical(nbytes: int, network, size: int, local_size: int, inter_algorithm: str = "ring",
                          gamma: float = 0.0, slowdown: dict[int, float] | None = None,
                          collective: str = "all_reduce") -> Result:
    """Predicted time of one hierarchical all-reduce (or broadcast) of `nbytes` on `size` ranks,
    `local_size` a node, `inter_algorithm` across nodes."""
    if size % local_size:
        raise ValueError(f"{size} ranks do not split into nodes of {local_size}")
    layout = Layout(tuple(rank // local_size for rank in range(size)))

    def body(transport: SimTransport) -> int:
        return hierarchical_all_reduce(transport, nbytes, local_size, inter_algorithm,
                                       collective=collective, layout=layout)

    # the nodes' phases are the same in every node: the schedule is as symmetric as the one across
    symmetry = (SYMMETRIC.get(("all_reduce", inter_algorithm))
                if collective == "all_reduce" and _even(nbytes, size) else None)
    return run_world(size, network, body, gamma, slowdown=slowdown,
                     what=(collective, f"hierarchical/{inter_algorithm}", nbytes),
                     symmetry=symmetry, step=local_size)
