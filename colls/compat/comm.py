"""`MPI.Comm`/`MPI.Intracomm` over a colls `Communicator`: groups, point-to-point, and what is missing.

`COMM_WORLD` and `COMM_SELF` resolve their communicator when first used: the one `bind` installed
for this thread (ranks as threads, `colls.compat.spawn`), else `colls.init()`'s world (under
`colls run`, `mpiexec`, or a plain `python` as a group of one).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import colls
from colls.communicator import Communicator

from .blocks import BlockCollectives
from .datatypes import UNDEFINED
from .p2p import PointToPoint
from .schedules import ScheduledCollectives

IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3


class MPIException(RuntimeError):
    """An MPI error (mpi4py's MPI.Exception)."""


_bound = threading.local()
_process_self: Communicator | None = None


@contextlib.contextmanager
def bind(world: Communicator) -> Iterator[None]:
    """Make `MPI.COMM_WORLD` be `world` (and `COMM_SELF` a group of one) in this thread."""
    from transports.local import LocalWorld

    previous = getattr(_bound, "world", None), getattr(_bound, "self", None)
    _bound.world, _bound.self = world, Communicator(LocalWorld(1).transport(0), world.timeout, "self")
    try:
        yield
    finally:
        _bound.self.close()
        _bound.world, _bound.self = previous


def _unsupported(feature: str):
    def method(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"{feature} is not supported by the colls mpi4py facade")
    method.__doc__ = f"Not supported: {feature}."
    return method


class Comm(PointToPoint, BlockCollectives, ScheduledCollectives):
    """An MPI communicator backed by a colls `Communicator` (None for MPI.COMM_NULL or after Free)."""

    def __init__(self, communicator: Communicator | None = None) -> None:
        self._held = communicator
        self._name = "" if communicator is None else communicator.name

    @property
    def _comm(self) -> Communicator:
        if self._held is None:
            raise MPIException("invalid communicator: MPI.COMM_NULL, or freed")
        return self._held

    def __bool__(self) -> bool:
        return self._resolved() is not None

    def _resolved(self) -> Communicator | None:
        return self._held

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Comm):
            return NotImplemented
        return self is other or (self._resolved() is None and other._resolved() is None)

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<colls.compat.MPI.{type(self).__name__} {self._resolved()!r}>"

    # -- size, rank, groups ----------------------------------------------------------------------

    def Get_rank(self) -> int:
        """This process's rank in the communicator."""
        return self._comm.rank

    def Get_size(self) -> int:
        """Number of ranks in the communicator."""
        return self._comm.size

    rank = property(Get_rank, doc="This process's rank in the communicator.")
    size = property(Get_size, doc="Number of ranks in the communicator.")

    def Is_inter(self) -> bool:
        """Always false: only intra-communicators exist here."""
        return False

    def Is_intra(self) -> bool:
        """Always true."""
        return True

    def Get_name(self) -> str:
        """The communicator's name."""
        return self._name

    def Set_name(self, name: str) -> None:
        """Rename the communicator (for messages)."""
        self._name = str(name)

    def Dup(self, info: object = None) -> Intracomm:
        """A new communicator with the same ranks in the same order (collective)."""
        comm = self._comm
        return Intracomm(comm.split(0, comm.rank))

    Clone = Dup
    Idup = _unsupported("Comm.Idup")

    def Split(self, color: int = 0, key: int = 0) -> Intracomm:
        """Ranks with the same color form a communicator, ordered by (key, rank); MPI.UNDEFINED: none."""
        colour = None if color == UNDEFINED or color < 0 else int(color)
        sub = self._comm.split(colour, int(key))
        return Intracomm(sub) if sub is not None else COMM_NULL

    def Free(self) -> None:
        """Release a communicator made by Dup or Split (collective)."""
        if self is COMM_WORLD or self is COMM_SELF:
            raise MPIException("MPI.COMM_WORLD and MPI.COMM_SELF cannot be freed")
        comm, self._held = self._comm, None
        comm.close()

    def Compare(self, other: Comm) -> int:
        """MPI.IDENT for the same communicator, MPI.CONGRUENT for the same ranks in the same order,
        MPI.SIMILAR in another order, MPI.UNEQUAL otherwise."""
        if self._comm is other._comm:
            return IDENT
        mine, theirs = self._members(), other._members()
        if mine == theirs:
            return CONGRUENT
        return SIMILAR if sorted(mine) == sorted(theirs) else UNEQUAL

    def _members(self) -> tuple[int, ...]:
        """The world's ranks in this communicator, in its order."""
        return self._comm.members

    def Abort(self, errorcode: int = 0) -> None:
        """Release every rank blocked on this communicator and exit this process with `errorcode`."""
        import os
        import sys

        self._comm.abort(f"MPI Abort with error code {errorcode}")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(errorcode if 0 < errorcode < 256 else 1)

    # -- not supported ---------------------------------------------------------------------------

    Create = Create_group = Get_group = _unsupported("MPI groups (Comm.Get_group, Comm.Create)")
    Create_intercomm = _unsupported("inter-communicators (Create_intercomm)")
    Create_cart = Create_graph = Create_dist_graph = Create_dist_graph_adjacent = _unsupported(
        "process topologies (Create_cart, Create_graph)")
    Spawn = Spawn_multiple = Accept = Connect = _unsupported("dynamic processes (Spawn, Accept, Connect)")
    Split_type = _unsupported("Comm.Split_type")
    Get_attr = Set_attr = Delete_attr = _unsupported("communicator attributes (Get_attr, Set_attr)")
    Neighbor_allgather = Neighbor_alltoall = _unsupported("neighborhood collectives")


class Intracomm(Comm):
    """An intra-communicator: every communicator of the facade."""


class _World(Intracomm):
    """MPI.COMM_WORLD: this thread's bound world, else `colls.init()`."""

    def _resolved(self) -> Communicator | None:
        return getattr(_bound, "world", None) or colls.init()

    @property
    def _comm(self) -> Communicator:
        return self._resolved()   # type: ignore[return-value]

    def Get_name(self) -> str:
        """MPI_COMM_WORLD."""
        return "MPI_COMM_WORLD"


class _Self(Intracomm):
    """MPI.COMM_SELF: a group of one (per bound thread, else per process)."""

    def _resolved(self) -> Communicator | None:
        global _process_self
        bound = getattr(_bound, "self", None)
        if bound is not None:
            return bound
        if _process_self is None:
            from transports.local import LocalWorld

            _process_self = Communicator(LocalWorld(1).transport(0), name="self")
        return _process_self

    @property
    def _comm(self) -> Communicator:
        return self._resolved()   # type: ignore[return-value]

    def _members(self) -> tuple[int, ...]:
        return (COMM_WORLD.Get_rank(),)   # (compared with another, which a world made: it exists)

    def Get_name(self) -> str:
        """MPI_COMM_SELF."""
        return "MPI_COMM_SELF"


COMM_NULL = Intracomm()
COMM_WORLD = _World()
COMM_SELF = _Self()
