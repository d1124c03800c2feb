"""Two-level schedules for ranks spread over hosts: the fast link inside a host, the network between.

The communicator hands each hierarchical call its `levels` on the channel (a `Levels`): a
transport over the ranks of this rank's host (shared memory where it can) and one over the ranks
holding this rank's local index on every host (MPI across hosts). The schedules here compose the
flat algorithms over those two transports, as NCCL's and Horovod's hierarchical all-reduce do,
so that each byte crosses the network once per host rather than once per rank:

- all_reduce: reduce-scatter inside the host, all-reduce of each shard across hosts (every local
  rank drives its own shard, so all of a host's links work at once), all-gather inside the host;
  small buffers, and hosts of unequal size, go through one leader per host instead.
- broadcast: the root scatters the buffer over its host's ranks, each carries its block to every
  host (all NICs at once), and each host all-gathers the blocks; small buffers cross whole, from
  the ranks with the root's local index.
- all_to_all: inside the host, regroup blocks by the local index of their destination; then across
  hosts, one message per host pair carrying the blocks of every local rank (Tutel's 2D all-to-all).

Without levels (an algorithm run directly on a channel) the whole group counts as one host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from transports.base import Transport

from .allgather import ring_all_gather_phase
from .blocks import bounds
from .channel import Channel
from .ops import Op
from .reduce_scatter import ring_reduce_scatter_phase
from .registry import lookup, register

# Below this, a reduce-scatter inside the host costs more in latency than it saves in bandwidth.
LEADER_BYTES = 64 << 10


@dataclass(frozen=True)
class Layout:
    """Which host each rank of a group runs on: `hosts[r]`, hosts numbered by first appearance."""

    hosts: tuple[int, ...]

    @classmethod
    def from_names(cls, names: Sequence[str]) -> Layout:
        """The layout of ranks whose host names are `names` (rank order)."""
        numbers: dict[str, int] = {}
        return cls(tuple(numbers.setdefault(name, len(numbers)) for name in names))

    @classmethod
    def one_host(cls, size: int) -> Layout:
        """Every rank on one host."""
        return cls((0,) * size)

    def subset(self, ranks: Sequence[int]) -> Layout:
        """The layout of the group made of `ranks` (in their new order)."""
        return Layout.from_names([str(self.hosts[r]) for r in ranks])

    @cached_property
    def members(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each host, in rank order."""
        groups: list[list[int]] = [[] for _ in range(max(self.hosts, default=-1) + 1)]
        for rank, host in enumerate(self.hosts):
            groups[host].append(rank)
        return tuple(tuple(group) for group in groups)

    def local_index(self, rank: int) -> int:
        """The position of `rank` among the ranks of its host."""
        return self.members[self.hosts[rank]].index(rank)

    def cross_members(self, index: int) -> list[int]:
        """The ranks with local index `index`, one per host that has so many ranks, in host order."""
        return [group[index] for group in self.members if len(group) > index]

    @property
    def regular(self) -> bool:
        """Whether every host runs the same number of ranks."""
        return len({len(group) for group in self.members}) <= 1

    @property
    def spans_hosts(self) -> bool:
        """Whether two levels differ from one: several hosts, and several ranks on some host."""
        return len(self.members) > 1 and len(self.members) < len(self.hosts)

    def describe(self) -> str:
        """'2 hosts × 2 ranks' or '3 hosts (2, 1, 3 ranks)'."""
        sizes = [len(group) for group in self.members]
        if self.regular:
            return f"{len(sizes)} host{'s' * (len(sizes) != 1)} × {sizes[0] if sizes else 0} ranks"
        return f"{len(sizes)} hosts ({', '.join(map(str, sizes))} ranks)"


@dataclass
class Levels:
    """This rank's two transports and how to choose the flat algorithm run over each."""

    layout: Layout
    local: Transport             # the ranks of my host, in rank order
    cross: Transport | None      # the ranks with my local index, in host order (None: only me)
    # choose(level, collective, nbytes) -> algorithm name; level is "local" or "cross"
    choose: Callable[[str, str, int], str]

    def close(self) -> None:
        """Release both transports."""
        for transport in (self.local, self.cross):
            if transport is not None:
                transport.close()

    def abort(self, reason: str) -> None:
        """Release the ranks blocked on either level."""
        for transport in (self.local, self.cross):
            if transport is not None and transport.aborted is None:
                transport.abort(reason)


class _Mapped:
    """A per-peer counter list of a level, written through to the group's list (peer → rank)."""

    __slots__ = ("counts", "ranks")

    def __init__(self, counts: list[int], ranks: Sequence[int]) -> None:
        self.counts, self.ranks = counts, ranks

    def __getitem__(self, peer: int) -> int:
        return self.counts[self.ranks[peer]]

    def __setitem__(self, peer: int, value: int) -> None:
        self.counts[self.ranks[peer]] = value


class _LevelTraffic:
    """A level's byte counters, kept in the group call's `Traffic` under the group's ranks."""

    __slots__ = ("messages_sent", "bytes_sent", "messages_received", "bytes_received")

    def __init__(self, traffic, ranks: Sequence[int]) -> None:
        self.messages_sent = _Mapped(traffic.messages_sent, ranks)
        self.bytes_sent = _Mapped(traffic.bytes_sent, ranks)
        self.messages_received = _Mapped(traffic.messages_received, ranks)
        self.bytes_received = _Mapped(traffic.bytes_received, ranks)


class _Within:
    """The call's name in a level's timeout messages, formatted only when an error needs it."""

    __slots__ = ("what", "level")

    def __init__(self, what: object, level: str) -> None:
        self.what, self.level = what, level

    def __str__(self) -> str:
        return f"{self.what} ({self.level})"


@dataclass
class _View:
    """One call's two channels and where this rank sits."""

    layout: Layout
    local: Channel
    cross: Channel | None
    choose: Callable[[str, str, int], str]
    host: int
    index: int


def _fixed(level: str, collective: str, nbytes: int) -> str:
    """Without levels: the defaults of the flat algorithms."""
    return {"all_reduce": "ring", "reduce": "binomial", "broadcast": "binomial",
            "all_to_all": "pairwise"}[collective]


def _view(channel: Channel) -> _View:
    """The call's channels over the levels the communicator gave `channel` (one host if none)."""
    levels: Levels | None = channel.levels
    if levels is None:
        return _View(Layout.one_host(channel.size), channel, None, _fixed, 0, channel.rank)
    layout, rank = levels.layout, channel.rank
    host, index = layout.hosts[rank], layout.local_index(rank)
    traffic = channel.traffic

    def level(transport: Transport | None, ranks: Sequence[int], name: str) -> Channel | None:
        if transport is None:
            return None
        counters = None if traffic is None else _LevelTraffic(traffic, ranks)
        return Channel(transport, channel.tag, channel.deadline, _Within(channel.what, name), counters)

    local = level(levels.local, layout.members[host], "inside the host")
    cross = level(levels.cross, layout.cross_members(index), "across hosts")
    assert local is not None
    return _View(layout, local, cross, levels.choose, host, index)


def _run(view: _View, level: str, collective: str, nbytes: int, *args) -> None:
    """Run the flat algorithm `view.choose` picks for `collective` on one level."""
    channel = view.local if level == "local" else view.cross
    if channel is not None and channel.size > 1:
        lookup(collective, view.choose(level, collective, nbytes)).run(channel, *args)


@register("all_reduce", "hierarchical",
          "reduce-scatter inside each host, all-reduce across hosts, all-gather inside the host",
          commutative_only=True)
def all_reduce(channel: Channel, buf: np.ndarray, op: Op) -> None:
    """Two-level all-reduce in place; every element is reduced once, so all ranks agree bitwise."""
    view = _view(channel)
    local = view.local
    if view.layout.regular and buf.nbytes >= LEADER_BYTES and buf.shape[0] >= local.size:
        starts = bounds(buf.shape[0], local.size)
        ring_reduce_scatter_phase(local, buf, starts, op)   # local rank i holds the host's block i
        shard = buf[starts[local.rank]:starts[local.rank + 1]]
        _run(view, "cross", "all_reduce", shard.nbytes, shard, op)   # block i summed over hosts
        ring_all_gather_phase(local, buf, starts)            # and shared inside the host
        return
    # small buffers or uneven hosts: one leader (local index 0) per host speaks for it
    _run(view, "local", "reduce", buf.nbytes, buf, op, 0)
    if view.index == 0:
        _run(view, "cross", "all_reduce", buf.nbytes, buf, op)
    _run(view, "local", "broadcast", buf.nbytes, buf, 0)


@register("broadcast", "hierarchical",
          "scatter in the root's host, each local rank carries its block across hosts, all-gather inside")
def broadcast(channel: Channel, buf: np.ndarray, root: int) -> None:
    """Two-level broadcast in place: the buffer crosses the network once per host, in as many
    blocks as a host has ranks, so that every NIC carries one (small buffers go whole)."""
    view = _view(channel)
    layout, local = view.layout, view.local
    root_host, root_index = layout.hosts[root], layout.local_index(root)
    if layout.regular and buf.nbytes >= LEADER_BYTES and buf.shape[0] >= local.size:
        starts = bounds(buf.shape[0], local.size)
        mine = buf[starts[view.index]:starts[view.index + 1]]
        if view.host == root_host:
            # 1. in the root's host, the root hands local rank i block i
            if view.index == root_index:
                local.wait(*[local.send(buf[starts[i]:starts[i + 1]], i)
                             for i in range(local.size) if i != root_index])
            else:
                local.wait(local.recv(mine, root_index))
        _run(view, "cross", "broadcast", mine.nbytes, mine, root_host)   # 2. block i to every host
        ring_all_gather_phase(local, buf, starts)                        # 3. and around each host
        return
    if len(layout.cross_members(root_index)) == len(layout.members):
        # every host has a rank at the root's local index: those carry it across, then inside
        if view.index == root_index:
            _run(view, "cross", "broadcast", buf.nbytes, buf, root_host)
        _run(view, "local", "broadcast", buf.nbytes, buf, root_index)
        return
    # the root's index is missing on a smaller host: in the root's host first, then leader to leader
    if view.host == root_host:
        _run(view, "local", "broadcast", buf.nbytes, buf, root_index)
    if view.index == 0:
        _run(view, "cross", "broadcast", buf.nbytes, buf, root_host)
    if view.host != root_host:
        _run(view, "local", "broadcast", buf.nbytes, buf, 0)


@register("all_to_all", "hierarchical",
          "regroup blocks inside each host, then one message per pair of hosts (2D all-to-all)")
def all_to_all(channel: Channel, send: np.ndarray, out: np.ndarray) -> None:
    """Two-level all-to-all: (L-1) + (H-1) messages per rank instead of L·H - 1."""
    view = _view(channel)
    layout = view.layout
    if not layout.regular or view.cross is None and len(layout.members) > 1:
        lookup("all_to_all", "pairwise").run(channel, send, out)   # uneven hosts: flat exchange
        return
    hosts, per_host = len(layout.members), view.local.size
    block = send.shape[0] // channel.size
    members = np.array(layout.members)                 # members[h, l]: the rank at (host h, index l)
    blocks = send.reshape(channel.size, block)
    # 1. inside the host, local rank l gets my blocks for every (host h, index l), host-major
    by_index = np.take(blocks, members.T.reshape(-1), axis=0)
    regrouped = np.empty_like(by_index)                # [l, h]: from my host's rank l, to (h, my index)
    _run(view, "local", "all_to_all", by_index.nbytes, by_index.reshape(-1), regrouped.reshape(-1))
    if per_host == 1:
        regrouped = by_index
    # 2. across hosts, host h gets the blocks of every rank of my host for (h, my index)
    by_host = np.ascontiguousarray(regrouped.reshape(per_host, hosts, block).transpose(1, 0, 2))
    arrived = np.empty_like(by_host)                   # [h, l]: from (host h, index l), to me
    _run(view, "cross", "all_to_all", by_host.nbytes, by_host.reshape(-1), arrived.reshape(-1))
    if hosts == 1:
        arrived = by_host
    # 3. into rank order
    out.reshape(channel.size, block)[members.reshape(-1)] = arrived.reshape(channel.size, block)
