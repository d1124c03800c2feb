"""Communicators with a topology (`Cartcomm`, `Graphcomm`, `Distgraphcomm`), how they are made,
and their neighbour collectives.

A topology communicator is a Dup of its parent (or, for ranks beyond the grid, a null one) whose
handle keeps the topology's description (topology.py); `reorder` is ignored, as MPI allows.
Neighbour collectives post every receive and send over a fresh collective channel of the
communicator (one tag per call, the call's deadline), in rounds: round k carries the k-th message
between each pair of ranks, so that repeated neighbours (a periodic dimension of size 1 or 2, a graph
with a repeated edge) are matched in MPI's order. In a Cartesian topology the block sent in the
positive direction of a dimension is the one the neighbour there receives from its negative side.
"""

from __future__ import annotations

import math
import pickle
from collections import Counter
from collections.abc import Sequence

import numpy as np

from . import schedules
from .buffers import Message, simple, vector
from .comm import Comm, Intracomm, _Handle
from .errors import MPIException
from .info import INFO_NULL, Info, info_of
from .request import PROC_NULL, Request
from .topology import (
    CART,
    DIST_GRAPH,
    GRAPH,
    UNWEIGHTED,
    WEIGHTS_EMPTY,
    CartTopology,
    DistGraphTopology,
    GraphTopology,
    _graph_index,
    _ints,
)

# -- creation -------------------------------------------------------------------------------------

def _make(comm: Comm, cls: type, included: bool, topology: object, info: dict | None = None) -> Comm:
    """Collective: a Dup of `comm` for the ranks `included` (ordered as in `comm`), with `topology`."""
    communicator = comm._comm
    child = communicator.split(0 if included else None, communicator.rank)
    return comm._derived(child, cls, info, topology)


def create_cart(comm: Comm, dims: Sequence[int], periods: object) -> Cartcomm:
    """MPI_Cart_create: ranks 0..prod(dims)-1 of `comm` on a row-major grid (the rest: a null Cartcomm).

    Raises:
        ValueError: `periods` has another length than `dims`, or the grid needs more ranks than `comm`.
    """
    dims = _ints(dims, "Create_cart dims")
    if periods is None or isinstance(periods, (bool, int)):
        periods = [bool(periods)] * len(dims)
    periods = [bool(p) for p in periods]   # type: ignore[union-attr]
    if len(periods) != len(dims):
        raise ValueError(f"Create_cart: {len(periods)} periods for {len(dims)} dimensions")
    if any(n < 1 for n in dims):
        raise ValueError(f"Create_cart: dims {dims} must all be >= 1")
    total = math.prod(dims)
    if total > comm.Get_size():
        raise ValueError(f"Create_cart: a grid of {dims} needs {total} ranks; the communicator has "
                         f"{comm.Get_size()}")
    return _make(comm, Cartcomm, comm.Get_rank() < total, CartTopology(tuple(dims), tuple(periods)))

def create_graph(comm: Comm, index: Sequence[int], edges: Sequence[int]) -> Graphcomm:
    """MPI_Graph_create: ranks 0..len(index)-1 of `comm` are the nodes (the rest: a null Graphcomm).

    Raises:
        ValueError: `index` is not non-decreasing up to len(edges), an edge names no node, or there
            are more nodes than ranks.
    """
    index, edges = _graph_index(index), _ints(edges, "Create_graph edges")
    nnodes = len(index)
    if any(b < a for a, b in zip([0, *index], index, strict=False)) or (index and index[-1] != len(edges)):
        raise ValueError(f"Create_graph: index {index} must be non-decreasing and end at len(edges) = "
                         f"{len(edges)}")
    if any(not 0 <= e < nnodes for e in edges) or nnodes > comm.Get_size():
        raise ValueError(f"Create_graph: {nnodes} nodes on {comm.Get_size()} ranks, edges {edges} must "
                         f"name nodes")
    return _make(comm, Graphcomm, comm.Get_rank() < nnodes, GraphTopology(tuple(index), tuple(edges)))


def _weights(weights: object, count: int, what: str) -> list[int] | None:
    if weights is None or weights is UNWEIGHTED:
        return None
    if weights is WEIGHTS_EMPTY:
        if count:
            raise ValueError(f"Create_dist_graph: MPI.WEIGHTS_EMPTY for {count} {what}")
        return []
    weights = _ints(weights, f"Create_dist_graph {what} weights")
    if len(weights) != count:
        raise ValueError(f"Create_dist_graph: {len(weights)} weights for {count} {what}")
    return weights


def _peers(comm: Comm, ranks: object, what: str) -> list[int]:
    peers = [] if ranks is None else _ints(ranks, f"Create_dist_graph {what}")
    if any(not 0 <= p < comm.Get_size() for p in peers):
        raise ValueError(f"Create_dist_graph: {what} {peers} must be ranks of this group of "
                         f"{comm.Get_size()}")
    return peers


def create_dist_graph_adjacent(comm: Comm, sources: object, destinations: object, sourceweights: object,
                               destweights: object, info: Info = INFO_NULL) -> Distgraphcomm:
    """MPI_Dist_graph_create_adjacent: each rank names its own in- and out-neighbours."""
    sources, destinations = _peers(comm, sources, "sources"), _peers(comm, destinations, "destinations")
    in_weights = _weights(sourceweights, len(sources), "sources")
    out_weights = _weights(destweights, len(destinations), "destinations")
    if (in_weights is None) != (out_weights is None):   # one side weighted: the other has no edges
        if in_weights is None:
            in_weights = _weights(WEIGHTS_EMPTY, len(sources), "sources")
        if out_weights is None:
            out_weights = _weights(WEIGHTS_EMPTY, len(destinations), "destinations")
    topology = DistGraphTopology(tuple(sources), tuple(destinations), _tuple(in_weights), _tuple(out_weights))
    return _make(comm, Distgraphcomm, True, topology, info_of(info))


def _tuple(values: list[int] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(values)


def create_dist_graph(comm: Comm, sources: Sequence[int], degrees: Sequence[int], destinations: Sequence[int],
                      weights: object, info: Info = INFO_NULL) -> Distgraphcomm:
    """MPI_Dist_graph_create: any rank may give any edges (source, destination, weight); every rank
    learns its own neighbours by an all-gather of the edges (in the order the ranks gave them)."""
    sources, degrees = _peers(comm, sources, "sources"), _ints(degrees, "Create_dist_graph degrees")
    destinations = _peers(comm, destinations, "destinations")
    if len(degrees) != len(sources) or sum(degrees) != len(destinations):
        raise ValueError(f"Create_dist_graph: {len(sources)} sources, {len(degrees)} degrees summing to "
                         f"{sum(degrees)}, {len(destinations)} destinations")
    edge_weights = _weights(weights, len(destinations), "edges")
    tails = [s for s, degree in zip(sources, degrees, strict=False) for _ in range(degree)]
    mine = np.array([tails, destinations, edge_weights or [1] * len(tails)], np.int64).T.reshape(-1, 3)
    communicator = comm._comm
    counts = communicator.all_gather(np.array([[len(mine), edge_weights is not None]], np.int64))
    longest = int(counts[:, 0].max())
    edges = np.empty((0, 3), np.int64)
    if longest:
        padded = np.zeros((1, longest, 3), np.int64)
        padded[0, :len(mine)] = mine
        gathered = communicator.all_gather(padded)
        edges = np.concatenate([gathered[r, :counts[r, 0]] for r in range(communicator.size)])
    me = communicator.rank
    incoming, outgoing = edges[edges[:, 1] == me], edges[edges[:, 0] == me]
    weighted = bool(counts[:, 1].any())
    topology = DistGraphTopology(tuple(incoming[:, 0].tolist()), tuple(outgoing[:, 1].tolist()),
                                 tuple(incoming[:, 2].tolist()) if weighted else None,
                                 tuple(outgoing[:, 2].tolist()) if weighted else None)
    return _make(comm, Distgraphcomm, True, topology, info_of(info))

# -- communicators ---------------------------------------------------------------------------------

def _rounds(peers: Sequence[int], order: Sequence[int]) -> list[list[tuple[int, int]]]:
    """(block, peer) pairs in `order`, split so that round k holds each peer's k-th block."""
    seen: Counter[int] = Counter()
    rounds: list[list[tuple[int, int]]] = []
    for block in order:
        peer = peers[block]
        if peer == PROC_NULL:
            continue
        k = seen[peer]
        seen[peer] += 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append((block, peer))
    return rounds


def _pickle():
    """mpi4py's `MPI.pickle` where the facade has one (its dumps/loads may be overridden), else pickle."""
    from . import MPI

    return getattr(MPI, "pickle", pickle)


class Topocomm(Intracomm):
    """A communicator with a topology: the neighbour collectives."""

    @classmethod
    def _check_kind(cls, handle: _Handle | None) -> None:
        wanted = {Topocomm: None, Cartcomm: CART, Graphcomm: GRAPH, Distgraphcomm: DIST_GRAPH}.get(
            next(c for c in cls.__mro__ if c in (Topocomm, Cartcomm, Graphcomm, Distgraphcomm)))
        if handle is not None and (handle.topology is None or wanted not in (None, handle.topology.kind)):
            raise TypeError(f"{cls.__name__}: the communicator does not have that topology")

    def _topology(self):
        return self._handle().topology

    @property
    def inedges(self) -> list[int]:
        """The in-neighbours, in the order of a receive buffer's blocks."""
        return self._topology().sources(self._comm.rank)

    @property
    def outedges(self) -> list[int]:
        """The out-neighbours, in the order of a send buffer's blocks."""
        return self._topology().destinations(self._comm.rank)

    inoutedges = property(lambda self: (self.inedges, self.outedges), doc="(inedges, outedges).")
    indegree = property(lambda self: len(self.inedges), doc="Number of in-neighbours.")
    outdegree = property(lambda self: len(self.outedges), doc="Number of out-neighbours.")
    degrees = property(lambda self: (self.indegree, self.outdegree), doc="(indegree, outdegree).")

    def _neighbour_exchange(self, what: str, send: Sequence[np.ndarray], recv: Sequence[np.ndarray]) -> None:
        """Block i of `send` to out-neighbour i, block j of `recv` from in-neighbour j (collective)."""
        rank = self._comm.rank
        topology = self._topology()
        destinations, sources = topology.destinations(rank), topology.sources(rank)
        if len(send) != len(destinations) or len(recv) != len(sources):
            raise ValueError(f"{what}: {len(send)} send and {len(recv)} receive blocks for "
                             f"{len(destinations)} out- and {len(sources)} in-neighbours")
        sends = _rounds(destinations, topology.send_order(rank))
        receives = _rounds(sources, range(len(sources)))
        rounds = [(sends[k] if k < len(sends) else [], receives[k] if k < len(receives) else [])
                  for k in range(max(len(sends), len(receives)))]
        to_self = [([i for i, peer in outgoing if peer == rank], [j for j, peer in incoming if peer == rank])
                   for outgoing, incoming in rounds]
        if any(len(out) != len(back) or any(send[i].size != recv[j].size
                                            for i, j in zip(out, back, strict=False))
               for out, back in to_self):   # checked before any byte moves
            raise MPIException(f"{what}: rank {rank} is its own neighbour, but its blocks to and from itself "
                               f"do not pair up")
        channel = self._channel(what)
        for (outgoing, incoming), (out, back) in zip(rounds, to_self, strict=True):
            requests = [channel.recv(recv[j], peer) for j, peer in incoming if peer != rank and recv[j].size]
            requests += [channel.send(send[i], peer) for i, peer in outgoing if peer != rank and send[i].size]
            for i, j in zip(out, back, strict=True):
                recv[j][...] = send[i]
            channel.wait(*requests)

    def _into_blocks(self, what: str, send: Sequence[np.ndarray], received: Message) -> None:
        """`_neighbour_exchange` of `send` into the blocks of the receive message `received`."""
        self._neighbour_exchange(what, send, [received.block(j) for j in range(self.indegree)])
        received.received()

    def Neighbor_allgather(self, sendbuf, recvbuf) -> None:
        """Send the same buffer to every out-neighbour; block j of `recvbuf` from in-neighbour j."""
        data = simple(sendbuf, writable=False).data()
        self._into_blocks("Neighbor_allgather", [data] * self.outdegree,
                          simple(recvbuf, writable=True, blocks=self.indegree))

    def Neighbor_allgatherv(self, sendbuf, recvbuf) -> None:
        """Neighbor_allgather with per-neighbour counts and displacements in `recvbuf`."""
        data = simple(sendbuf, writable=False).data()
        self._into_blocks("Neighbor_allgatherv", [data] * self.outdegree,
                          vector(recvbuf, writable=True, blocks=self.indegree))

    def Neighbor_alltoall(self, sendbuf, recvbuf) -> None:
        """Block i of `sendbuf` to out-neighbour i; block j of `recvbuf` from in-neighbour j."""
        sent = simple(sendbuf, writable=False, blocks=self.outdegree)
        self._into_blocks("Neighbor_alltoall", [sent.block(i) for i in range(self.outdegree)],
                          simple(recvbuf, writable=True, blocks=self.indegree))

    def Neighbor_alltoallv(self, sendbuf, recvbuf) -> None:
        """Neighbor_alltoall with per-neighbour counts and displacements on both sides."""
        sent = vector(sendbuf, writable=False, blocks=self.outdegree)
        self._into_blocks("Neighbor_alltoallv", [sent.block(i) for i in range(self.outdegree)],
                          vector(recvbuf, writable=True, blocks=self.indegree))

    def Neighbor_alltoallw(self, sendbuf, recvbuf) -> None:
        """Neighbor_alltoall with per-neighbour counts, byte displacements and datatypes."""
        sent = schedules._w_messages(sendbuf, False, self.outdegree)   # (per-peer messages, as Alltoallw)
        received = schedules._w_messages(recvbuf, True, self.indegree)
        self._neighbour_exchange("Neighbor_alltoallw", [message.data() for message in sent],
                                 [message.data() for message in received])
        for message in received:
            message.received()

    def Ineighbor_allgather(self, sendbuf, recvbuf) -> Request:
        """Nonblocking Neighbor_allgather (completes before it returns)."""
        self.Neighbor_allgather(sendbuf, recvbuf)
        return Request()

    def Ineighbor_allgatherv(self, sendbuf, recvbuf) -> Request:
        """Nonblocking Neighbor_allgatherv (completes before it returns)."""
        self.Neighbor_allgatherv(sendbuf, recvbuf)
        return Request()

    def Ineighbor_alltoall(self, sendbuf, recvbuf) -> Request:
        """Nonblocking Neighbor_alltoall (completes before it returns)."""
        self.Neighbor_alltoall(sendbuf, recvbuf)
        return Request()

    def Ineighbor_alltoallv(self, sendbuf, recvbuf) -> Request:
        """Nonblocking Neighbor_alltoallv (completes before it returns)."""
        self.Neighbor_alltoallv(sendbuf, recvbuf)
        return Request()

    def Ineighbor_alltoallw(self, sendbuf, recvbuf) -> Request:
        """Nonblocking Neighbor_alltoallw (completes before it returns)."""
        self.Neighbor_alltoallw(sendbuf, recvbuf)
        return Request()

    def _objects(self, what: str, objects: Sequence[object]) -> list[object]:
        """Pickled `objects[i]` to out-neighbour i; the objects of the in-neighbours (None: PROC_NULL)."""
        codec = _pickle()
        payloads = [np.frombuffer(codec.dumps(obj), np.uint8) for obj in objects]
        sizes = [np.array([p.size], np.int64) for p in payloads]
        incoming_sizes = [np.zeros(1, np.int64) for _ in range(self.indegree)]
        self._neighbour_exchange(what, [size.view(np.uint8) for size in sizes],
                                 [size.view(np.uint8) for size in incoming_sizes])
        incoming = [np.empty(int(s[0]), np.uint8) for s in incoming_sizes]
        self._neighbour_exchange(what, payloads, incoming)
        return [codec.loads(data.tobytes()) if peer != PROC_NULL else None
                for peer, data in zip(self.inedges, incoming, strict=False)]

    def neighbor_allgather(self, sendobj: object) -> list[object]:
        """The object of every in-neighbour (this rank's `sendobj` goes to every out-neighbour)."""
        return self._objects("neighbor_allgather", [sendobj] * self.outdegree)

    def neighbor_alltoall(self, sendobj: Sequence[object]) -> list[object]:
        """`sendobj[i]` to out-neighbour i; the objects the in-neighbours sent this rank."""
        if len(sendobj) != self.outdegree:
            raise ValueError(f"neighbor_alltoall: {len(sendobj)} objects for {self.outdegree} out-neighbours")
        return self._objects("neighbor_alltoall", list(sendobj))


class Cartcomm(Topocomm):
    """A communicator with a Cartesian topology."""

    def Get_dim(self) -> int:
        """Number of dimensions."""
        return len(self._topology().dims)

    dim = ndim = property(Get_dim, doc="Number of dimensions.")

    def Get_topo(self) -> tuple[list[int], list[int], list[int]]:
        """(dims, periods, this rank's coordinates)."""
        topology = self._topology()
        return list(topology.dims), [int(p) for p in topology.periods], topology.coords(self._comm.rank)

    topo = property(Get_topo, doc="(dims, periods, coords).")
    dims = property(lambda self: self.Get_topo()[0], doc="Size of each dimension.")
    periods = property(lambda self: self.Get_topo()[1], doc="Whether each dimension is periodic.")
    coords = property(lambda self: self.Get_topo()[2], doc="This rank's coordinates.")

    def Get_coords(self, rank: int) -> list[int]:
        """The coordinates of `rank`."""
        if not 0 <= rank < self._comm.size:
            raise ValueError(f"Cartcomm.Get_coords: rank {rank} is not in 0..{self._comm.size - 1}")
        return self._topology().coords(rank)

    def Get_cart_rank(self, coords: Sequence[int]) -> int:
        """The rank at `coords` (wrapped in periodic dimensions)."""
        return self._topology().rank_of(coords)

    def Shift(self, direction: int, disp: int) -> tuple[int, int]:
        """(source, dest): the ranks `disp` steps back and forward along `direction` (MPI.PROC_NULL
        past the edge of a non-periodic dimension)."""
        return self._topology().shift(self._comm.rank, direction, disp)

    def Sub(self, remain_dims: Sequence[bool]) -> Cartcomm:
        """The sub-grids keeping the dimensions where `remain_dims` is true (collective)."""
        topology = self._topology()
        keep = [bool(k) for k in remain_dims]
        if len(keep) != len(topology.dims):
            raise ValueError(f"Cartcomm.Sub: {len(keep)} flags for {len(topology.dims)} dimensions")
        coords = topology.coords(self._comm.rank)
        dropped = [d for d, k in enumerate(keep) if not k]
        colour = 0
        if dropped:   # the position of this rank's sub-grid among the others
            colour = int(np.ravel_multi_index([coords[d] for d in dropped],
                                              [topology.dims[d] for d in dropped]))
        sub = CartTopology(tuple(n for n, k in zip(topology.dims, keep, strict=False) if k),
                           tuple(p for p, k in zip(topology.periods, keep, strict=False) if k))
        return self._derived(self._comm.split(colour, self._comm.rank), Cartcomm, topology=sub)


class Graphcomm(Topocomm):
    """A communicator with a graph topology."""

    def Get_dims(self) -> tuple[int, int]:
        """(number of nodes, number of edges)."""
        topology = self._topology()
        return len(topology.index), len(topology.edges)

    dims = property(Get_dims, doc="(nnodes, nedges).")
    nnodes = property(lambda self: self.Get_dims()[0], doc="Number of nodes.")
    nedges = property(lambda self: self.Get_dims()[1], doc="Number of edges.")

    def Get_topo(self) -> tuple[list[int], list[int]]:
        """(index, edges), index without its leading 0."""
        topology = self._topology()
        return list(topology.index), list(topology.edges)

    topo = property(Get_topo, doc="(index, edges).")
    index = property(lambda self: self.Get_topo()[0], doc="Cumulative neighbour counts.")
    edges = property(lambda self: self.Get_topo()[1], doc="Every node's neighbours, one after another.")

    def Get_neighbors_count(self, rank: int) -> int:
        """Number of neighbours of `rank`."""
        return len(self._topology().neighbors(rank))

    def Get_neighbors(self, rank: int) -> list[int]:
        """The neighbours of `rank`."""
        return self._topology().neighbors(rank)

    neighbors = property(lambda self: self.Get_neighbors(self._comm.rank), doc="This rank's neighbours.")
    nneighbors = property(lambda self: len(self.neighbors), doc="Number of this rank's neighbours.")


class Distgraphcomm(Topocomm):
    """A communicator with a distributed graph topology."""

    def Get_dist_neighbors_count(self) -> tuple[int, int, bool]:
        """(indegree, outdegree, weighted)."""
        topology = self._topology()
        return len(topology.in_ranks), len(topology.out_ranks), topology.in_weights is not None

    def Get_dist_neighbors(self) -> tuple[list[int], list[int], tuple[list[int], list[int]] | None]:
        """(sources, destinations, (source weights, destination weights) or None)."""
        topology = self._topology()
        weights = None if topology.in_weights is None else (list(topology.in_weights),
                                                            list(topology.out_weights or ()))
        return list(topology.in_ranks), list(topology.out_ranks), weights
