"""`MPI.Intercomm`: inter-communicators, made by `Intracomm.Create_intercomm`.

An inter-communicator's handle holds a `RemoteView` (`intergroup`): a colls communicator over both
groups, whose point-to-point peers are the remote group's ranks. On top of it: the local and remote
groups, point-to-point (uppercase and lowercase, from `Comm`), `Barrier`, the lowercase object
collectives with MPI's rules for inter-communicators (in a rooted one the root passes MPI.ROOT, the
rest of its group MPI.PROC_NULL, and the other group the root's rank in it; the data goes from one
group to the other), `Merge`, `Dup`, `Split` and `Free`. They run as colls' object collectives over
the union (a rooted one first finds the root's place in it with one small all-reduce, since the
MPI.PROC_NULL ranks do not know it). The blocking Bcast, Gather, Scatter, Allgather, Alltoall and
Allreduce come from `interblocks`; the other buffer collectives and the `I...` forms raise
NotImplementedError naming inter-communicators. `Create_from_groups` works where the two groups
are all of COMM_WORLD's processes; `Comm.Get_parent()` is the null Intercomm (colls spawns no
processes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import ops
from .comm import Comm, Intracomm, _Handle
from .errors import ERROR_CLASSES, MPIException
from .group import Group, group_of, my_world_rank
from .info import info_of
from .interblocks import InterBlockCollectives
from .intergroup import RemoteView, create, join
from .objects import _fold, _lock
from .request import PROC_NULL

ROOT = -3   # MPI.ROOT
ERR_ROOT = ERROR_CLASSES["ERR_ROOT"][0]


def _is_inter(handle: _Handle | None) -> bool:
    return handle is not None and isinstance(handle.communicator, RemoteView)


class Intercomm(InterBlockCollectives, Comm):
    """An inter-communicator: a local and a remote group (made by `Intracomm.Create_intercomm`)."""

    @classmethod
    def _check_kind(cls, handle: _Handle | None) -> None:
        if handle is not None and not _is_inter(handle):
            raise TypeError("Intercomm: the communicator is an intra-communicator")

    @property
    def _view(self) -> RemoteView:
        return self._comm   # type: ignore[return-value] - an inter handle's communicator

    def _refuse(self, what: str) -> None:
        self._handle()   # MPI.COMM_NULL: an invalid communicator, as in MPI
        raise NotImplementedError(f"inter-communicators: Intercomm.{what} is not supported by the colls "
                                  f"mpi4py facade")

    # -- groups ----------------------------------------------------------------------------------

    def Is_inter(self) -> bool:
        """Whether this is an inter-communicator (always)."""
        self._handle()
        return True

    def Is_intra(self) -> bool:
        """Whether this is an intra-communicator (never)."""
        self._handle()
        return False

    is_inter = property(Is_inter, doc="Whether this is an inter-communicator.")
    is_intra = property(Is_intra, doc="Whether this is an intra-communicator.")

    def Get_remote_group(self) -> Group:
        """The group of the other side's processes."""
        return group_of(self._view.remote_members)

    def Get_remote_size(self) -> int:
        """Number of ranks in the remote group."""
        return self._view.remote_size

    remote_group = property(Get_remote_group, doc="The remote group (a new Group).")
    remote_size = property(Get_remote_size, doc="Number of ranks in the remote group.")

    # -- new communicators -----------------------------------------------------------------------

    def _inter(self, view: RemoteView | None) -> Intercomm:
        return self._kind()._wrap(None if view is None else _Handle(view))

    def Dup(self, info: Any = None) -> Intercomm:
        """A new inter-communicator of the same groups, hints, error handler and copied attributes
        (collective over both groups)."""
        handle = self._handle()
        dup = self._inter(self._view.dup())
        dup._h.info = dict(handle.info) if info is None else info_of(info)
        dup._h.errhandler = handle.errhandler
        dup._h.attrs.update(self._copied_attributes())
        return dup

    Clone = Dup

    def Split(self, color: int = 0, key: int = 0) -> Intercomm:
        """The ranks of each group with one color form the two groups of a new inter-communicator,
        ordered by (key, rank); MPI.COMM_NULL where a side has none of that color (or MPI.UNDEFINED)."""
        colour = None if color < 0 else int(color)   # MPI.UNDEFINED is negative
        return self._inter(self._view.split(colour, int(key)))

    def Merge(self, high: bool = False) -> Intracomm:
        """An intra-communicator of both groups: the one passing high=False first, each in its rank
        order (collective over both groups)."""
        self._handle()
        return Intracomm._wrap(_Handle(self._view.merge(high)))

    @classmethod
    def Create_from_groups(cls, local_group: Group, local_leader: int, remote_group: Group,
                           remote_leader: int, stringtag: str = "org.mpi4py", info: Any = None,
                           errhandler: Any = None) -> Intercomm:
        """The inter-communicator between `local_group` (holding this process) and `remote_group`
        (MPI 4; collective over both): supported where the two groups together are all of
        MPI.COMM_WORLD's processes (colls splits it).

        Raises:
            MPIException: this process is not in `local_group`, or the groups share processes.
            NotImplementedError: the two groups leave out some of COMM_WORLD's processes.
        """
        from .comm import COMM_WORLD

        mine, theirs = tuple(local_group._members), tuple(remote_group._members)
        me = my_world_rank()
        rank = mine.index(me) if me in mine else -1
        view = join(COMM_WORLD, mine, theirs, rank, "Intercomm.Create_from_groups", "COMM_WORLD")
        return cls._wrap(_Handle(view))

    # -- collectives -----------------------------------------------------------------------------

    def Barrier(self) -> None:
        """Wait until every rank of both groups has entered the barrier."""
        self._view.union.barrier()

    barrier = Barrier

    def _root(self, root: Any) -> int:
        """`root` checked by MPI's rules for inter-communicators: MPI.ROOT, MPI.PROC_NULL, or a rank
        of the remote group."""
        size = self._view.remote_size
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not (
                root in (ROOT, PROC_NULL) or 0 <= root < size):
            raise MPIException(ERR_ROOT, f"MPI_ERR_ROOT: invalid root {root!r} for an inter-communicator "
                                         f"whose remote group has {size} ranks (MPI.ROOT, MPI.PROC_NULL or "
                                         f"a remote rank)")
        return int(root)

    def _union_root(self, root: int, width: int = -1) -> tuple[int, int]:
        """(the union rank of a rooted collective's root, the largest `width` given), found with one
        small all-reduce over both groups (the MPI.PROC_NULL ranks know neither); every rank checks
        the same maxima.

        Raises:
            MPIException: no rank or several passed MPI.ROOT, or the other group named another.
        """
        view = self._view
        union = view.union
        lowest = -(1 << 62)
        mine = union.rank if root == ROOT else -1
        claim = view.remote_offset + root if root >= 0 else -1
        found = union.all_reduce(np.array([mine, -mine if mine >= 0 else lowest,
                                           claim, -claim if claim >= 0 else lowest, width], np.int64), "max")
        where = int(found[0])
        if where < 0 or -found[1] != where or found[2] != where or -found[3] != where:
            raise MPIException(ERR_ROOT, "MPI_ERR_ROOT: one rank of the root's group must pass MPI.ROOT (the "
                                         "others MPI.PROC_NULL) and every rank of the other group the "
                                         "root's rank in that group")
        return where, int(found[4])

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """The root's object on every rank of the other group; None on the root's group."""
        root = self._root(root)
        with _lock(self, "bcast"):
            where, _ = self._union_root(root)
            received = self._view.union.broadcast_object(obj if root == ROOT else None, where,
                                                         pickler=self._pickler())
        return received if root >= 0 else None

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        """The other group's objects, in rank order, on the root (None elsewhere)."""
        root = self._root(root)
        with _lock(self, "gather"):
            where, _ = self._union_root(root)
            values = self._view.union.gather_object(sendobj if root >= 0 else None, where,
                                                    pickler=self._pickler())
        return self._view.remote_slice(values) if root == ROOT else None

    def scatter(self, sendobj: Sequence[Any] | None, root: int = 0) -> Any:
        """Item i of the root's sequence on rank i of the other group (None on the root's group).

        Raises:
            ValueError: the root's sequence does not hold one item per remote rank.
        """
        root = self._root(root)
        view = self._view
        items = None
        if root == ROOT:
            items = [None] * view.remote_size if sendobj is None else list(sendobj)
            if len(items) != view.remote_size:
                raise ValueError(f"scatter: the root's sequence holds {len(items)} objects; the remote "
                                 f"group has {view.remote_size} ranks")
            items = view.spread(items)
        with _lock(self, "scatter"):
            where, _ = self._union_root(root)
            received = view.union.scatter_object(items, where, pickler=self._pickler())
        return received if root >= 0 else None

    def allgather(self, sendobj: Any) -> list[Any]:
        """The other group's objects, in rank order, on every rank."""
        with _lock(self, "allgather"):
            values = self._view.union.all_gather_object(sendobj, pickler=self._pickler())
        return self._view.remote_slice(values)

    def alltoall(self, sendobj: Sequence[Any] | None) -> list[Any]:
        """Item i of this rank's sequence to rank i of the other group; one object from each of
        its ranks back, in rank order.

        Raises:
            ValueError: the sequence does not hold one item per remote rank.
        """
        view = self._view
        items = [None] * view.remote_size if sendobj is None else list(sendobj)
        if len(items) != view.remote_size:
            raise ValueError(f"alltoall: the sequence holds {len(items)} objects; the remote group has "
                             f"{view.remote_size} ranks")
        with _lock(self, "alltoall"):
            values = view.union.all_to_all_object(view.spread(items), pickler=self._pickler())
        return view.remote_slice(values)

    def reduce(self, sendobj: Any, op: Any = ops.SUM, root: int = 0) -> Any:
        """The other group's objects combined by `op` in rank order, on the root (None elsewhere)."""
        values = self.gather(sendobj, root)
        return None if values is None else _fold(op, values)

    def allreduce(self, sendobj: Any, op: Any = ops.SUM) -> Any:
        """The other group's objects combined by `op` in rank order, on every rank."""
        return _fold(op, self.allgather(sendobj))


def create_intercomm(local: Comm, local_leader: int, peer: Comm, remote_leader: int,
                     tag: int = 0) -> Intercomm:
    """`Intracomm.Create_intercomm` (see there)."""
    local._handle()
    peer._handle()
    view = create(local, int(local_leader), peer, int(remote_leader), int(tag))
    return Intercomm._wrap(_Handle(view))


_BUFFER_COLLECTIVES = (
    "Gatherv Scatterv Allgatherv Alltoallv Alltoallw Reduce Reduce_scatter Reduce_scatter_block Ibarrier "
    "Ibcast Igather Igatherv Iscatter Iscatterv Iallgather Iallgatherv Ialltoall Ialltoallv Ialltoallw "
    "Ireduce Iallreduce Ireduce_scatter Ireduce_scatter_block Split_type Create Create_group scan exscan "
    "ibarrier"
)


def _refusal(name: str) -> Any:
    def refuse(self: Intercomm, *args: object, **kwargs: object) -> None:
        self._refuse(name)
    refuse.__name__ = name
    refuse.__doc__ = f"Not supported over inter-communicators: {name}."
    return refuse


for _name in _BUFFER_COLLECTIVES.split():
    setattr(Intercomm, _name, _refusal(_name))
