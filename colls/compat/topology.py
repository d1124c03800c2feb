"""Process topologies: what each rank's neighbours are (`CartTopology`, `GraphTopology`,
`DistGraphTopology`, kept with a communicator's handle), `Compute_dims`, and the constructors of
`Comm` (`Create_cart`, `Create_graph`, `Create_dist_graph[_adjacent]`, `Cart_map`, `Graph_map`);
the communicators themselves and their neighbour collectives are in topocomm.py.

A rank's in-neighbours (`sources`) are the blocks of a neighbour collective's receive buffer, its
out-neighbours (`destinations`) the blocks of its send buffer.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffers import _Constant
from .datatypes import UNDEFINED
from .info import INFO_NULL, Info
from .request import PROC_NULL

CART, GRAPH, DIST_GRAPH = 2, 1, 3   # MPICH's values
UNWEIGHTED = _Constant("UNWEIGHTED")
WEIGHTS_EMPTY = _Constant("WEIGHTS_EMPTY")

# -- descriptions ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class CartTopology:
    """A Cartesian grid: rank r sits at the row-major coordinates of r in `dims`."""

    dims: tuple[int, ...]
    periods: tuple[bool, ...]
    kind = CART

    def coords(self, rank: int) -> list[int]:
        return [int(c) for c in np.unravel_index(rank, self.dims)] if self.dims else []

    def rank_of(self, coords: Sequence[int]) -> int:
        coords = [operator.index(c) for c in coords]
        if len(coords) != len(self.dims):
            raise ValueError(f"Cartcomm: {len(coords)} coordinates for a grid of {len(self.dims)} dimensions")
        wrapped = []
        for c, n, periodic in zip(coords, self.dims, self.periods, strict=False):
            if not periodic and not 0 <= c < n:
                raise ValueError(f"Cartcomm: coordinate {c} is outside 0..{n - 1} of a non-periodic "
                                 f"dimension")
            wrapped.append(c % n)
        return int(np.ravel_multi_index(wrapped, self.dims)) if self.dims else 0

    def shift(self, rank: int, direction: int, disp: int) -> tuple[int, int]:
        if not 0 <= direction < len(self.dims):
            raise ValueError(f"Cartcomm.Shift: direction {direction} is not in 0..{len(self.dims) - 1}")
        coords = self.coords(rank)

        def moved(by: int) -> int:
            c = coords[direction] + by
            if not self.periods[direction] and not 0 <= c < self.dims[direction]:
                return PROC_NULL
            return self.rank_of([*coords[:direction], c, *coords[direction + 1:]])
        return moved(-disp), moved(disp)

    def sources(self, rank: int) -> list[int]:
        return [peer for d in range(len(self.dims)) for peer in self.shift(rank, d, 1)]

    destinations = sources

    def send_order(self, rank: int) -> list[int]:
        # per dimension, the positive-direction block first: it meets the neighbour's first receive
        # from that dimension, the one from its negative side (see the module's docstring)
        return [i for d in range(len(self.dims)) for i in (2 * d + 1, 2 * d)]

    @staticmethod
    def comm_class() -> type:
        from .topocomm import Cartcomm

        return Cartcomm


@dataclass(frozen=True)
class GraphTopology:
    """MPI_Graph_create's graph: node r's neighbours are edges[index[r-1]:index[r]]."""

    index: tuple[int, ...]
    edges: tuple[int, ...]
    kind = GRAPH

    def neighbors(self, rank: int) -> list[int]:
        if not 0 <= rank < len(self.index):
            raise ValueError(f"Graphcomm: rank {rank} is not a node of this graph of {len(self.index)}")
        return list(self.edges[(self.index[rank - 1] if rank else 0):self.index[rank]])

    def sources(self, rank: int) -> list[int]:
        return self.neighbors(rank)

    destinations = sources

    def send_order(self, rank: int) -> list[int]:
        return list(range(len(self.neighbors(rank))))

    @staticmethod
    def comm_class() -> type:
        from .topocomm import Graphcomm

        return Graphcomm


@dataclass(frozen=True)
class DistGraphTopology:
    """This rank's in- and out-neighbours of a distributed graph, with their weights (None: unweighted)."""

    in_ranks: tuple[int, ...]
    out_ranks: tuple[int, ...]
    in_weights: tuple[int, ...] | None
    out_weights: tuple[int, ...] | None
    kind = DIST_GRAPH

    def sources(self, rank: int) -> list[int]:
        return list(self.in_ranks)

    def destinations(self, rank: int) -> list[int]:
        return list(self.out_ranks)

    def send_order(self, rank: int) -> list[int]:
        return list(range(len(self.out_ranks)))

    @staticmethod
    def comm_class() -> type:
        from .topocomm import Distgraphcomm

        return Distgraphcomm


# -- helpers ----------------------------------------------------------------------------------------

def _ints(values: object, what: str) -> list[int]:
    try:
        return [operator.index(v) for v in values]   # type: ignore[attr-defined]
    except TypeError:
        raise TypeError(f"{what}: expecting a sequence of ints, got {values!r}") from None

def _graph_index(index: Sequence[int]) -> list[int]:
    index = _ints(index, "Create_graph index")
    return index[1:] if index and index[0] == 0 else index   # mpi4py accepts it with or without the 0


def cart_map(comm: Any, dims: Sequence[int]) -> int:
    """This rank's rank in a Cartesian grid of `dims` made from `comm` (MPI.UNDEFINED: not in it)."""
    rank = comm.Get_rank()
    return rank if rank < math.prod(_ints(dims, "Cart_map dims")) else UNDEFINED


def graph_map(comm: Any, index: Sequence[int]) -> int:
    """This rank's rank in a graph of `index` made from `comm` (MPI.UNDEFINED: not in it)."""
    rank = comm.Get_rank()
    return rank if rank < len(_graph_index(index)) else UNDEFINED


def compute_dims(nnodes: int, dims: int | Sequence[int]) -> list[int]:
    """MPI_Dims_create: fill the zeros of `dims` (or `dims` zeros) so that the product is `nnodes`,
    as balanced as possible, largest first: each prime factor, largest first, multiplies the
    smallest free dimension so far (MPICH's answers).

    Raises:
        ValueError: `nnodes` is not a multiple of the product of the dimensions given.
    """
    dims = [0] * operator.index(dims) if isinstance(dims, (int, np.integer)) else _ints(dims, "Compute_dims")
    fixed = math.prod(d for d in dims if d > 0)
    free = sum(1 for d in dims if d == 0)
    if any(d < 0 for d in dims) or nnodes % fixed or (not free and nnodes != fixed):
        raise ValueError(f"Compute_dims: {nnodes} nodes do not fit dims {dims}")
    rest, factors, prime = nnodes // fixed, [], 2
    while rest > 1 and prime * prime <= rest:
        while rest % prime == 0:
            factors.append(prime)
            rest //= prime
        prime += 1
    if rest > 1:
        factors.append(rest)
    slots = [1] * free
    for factor in sorted(factors, reverse=True):
        if slots:
            slots[slots.index(min(slots))] *= factor
    filled = iter(sorted(slots, reverse=True))
    return [d if d > 0 else next(filled) for d in dims]


class Constructors:
    """Mixin of `Comm`: the topology constructors (collective over the communicator)."""

    def Create_cart(self, dims: Sequence[int], periods: Sequence[bool] | None = None, reorder: bool = False):
        """A Cartesian grid of `dims` over ranks 0..prod(dims)-1 (the others get a null Cartcomm);
        `periods` says which dimensions wrap around (default: none)."""
        from .topocomm import create_cart

        return create_cart(self, dims, periods)

    def Create_graph(self, index: Sequence[int], edges: Sequence[int], reorder: bool = False):
        """A graph over ranks 0..len(index)-1: node r's neighbours are edges[index[r-1]:index[r]]
        (`index` with or without its leading 0)."""
        from .topocomm import create_graph

        return create_graph(self, index, edges)

    def Create_dist_graph_adjacent(self, sources: Sequence[int], destinations: Sequence[int],
                                   sourceweights: Any = None, destweights: Any = None,
                                   info: Info = INFO_NULL, reorder: bool = False):
        """A distributed graph: each rank names its in-neighbours and out-neighbours (and weights)."""
        from .topocomm import create_dist_graph_adjacent

        return create_dist_graph_adjacent(self, sources, destinations, sourceweights, destweights, info)

    def Create_dist_graph(self, sources: Sequence[int], degrees: Sequence[int], destinations: Sequence[int],
                          weights: Any = None, info: Info = INFO_NULL, reorder: bool = False):
        """A distributed graph from edges any rank may give: `degrees[i]` edges from `sources[i]`."""
        from .topocomm import create_dist_graph

        return create_dist_graph(self, sources, degrees, destinations, weights, info)

    def Cart_map(self, dims: Sequence[int], periods: Sequence[bool] | None = None) -> int:
        """This rank's rank in a Cartesian grid of `dims` (MPI.UNDEFINED: not in it)."""
        return cart_map(self, dims)

    def Graph_map(self, index: Sequence[int], edges: Sequence[int]) -> int:
        """This rank's rank in a graph of `index` (MPI.UNDEFINED: not in it)."""
        return graph_map(self, index)
