"""`MPI.Group`: an ordered set of processes, named by their ranks in the world communicator.

A group's handle is its membership (a tuple of world ranks), so two groups of the same processes
in the same order are equal handles, as MPICH's cached groups are. Group operations are local;
`Comm.Create` turns a group into a communicator (comm.py).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from .datatypes import UNDEFINED
from .errors import ERR_ARG, ERR_GROUP, MPIException
from .handles import HandleTable, NumberedHandle
from .request import PROC_NULL

IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
_interned: dict[tuple[int, ...], tuple[int, ...]] = {}


def my_world_rank() -> int:
    """This rank's rank in MPI.COMM_WORLD (this thread's, for ranks that are threads)."""
    from .comm import COMM_WORLD

    return COMM_WORLD.Get_rank()


class Group(NumberedHandle):
    """An MPI group (None as handle: MPI.GROUP_NULL)."""

    _h: tuple[int, ...] | None
    _numbers = HandleTable()

    def __new__(cls, group: Group | None = None) -> Group:
        self = object.__new__(cls)
        if group is None:
            self._h = None
        elif isinstance(group, Group):
            self._h = group._h
        else:
            raise TypeError(f"Group: expecting an MPI.Group, got {type(group).__name__}")
        return self

    @classmethod
    def _of(cls, members: Sequence[int]) -> Group:
        group = object.__new__(cls)
        key = tuple(int(member) for member in members)
        group._h = _interned.setdefault(key, key)   # one tuple per membership: a stable handle
        return group

    @property
    def _members(self) -> tuple[int, ...]:
        if self._h is None:
            raise MPIException(ERR_GROUP, "invalid group: MPI.GROUP_NULL (or a freed group)")
        return self._h

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Group):
            return NotImplemented
        return self._h == other._h

    __hash__ = None   # type: ignore[assignment] - handles are unhashable in mpi4py

    def __bool__(self) -> bool:
        return self._h is not None

    def __repr__(self) -> str:
        return f"<colls.compat.MPI.Group {'null' if self._h is None else list(self._h)}>"

    def __reduce__(self) -> object:
        if self is GROUP_NULL:
            return "GROUP_NULL"
        if self is GROUP_EMPTY:
            return "GROUP_EMPTY"
        if self._h is None:
            return (Group, ())
        if self._h == ():
            return (Group, (GROUP_EMPTY,))
        raise ValueError(f"cannot pickle {self!r}: a group names processes of this job only")

    # -- size, rank, translation, comparison -----------------------------------------------------

    def Get_size(self) -> int:
        """Number of processes in the group."""
        return len(self._members)

    def Get_rank(self) -> int:
        """This process's rank in the group, or MPI.UNDEFINED when it is not a member."""
        members = self._members
        me = my_world_rank()
        return members.index(me) if me in members else UNDEFINED

    size = property(Get_size, doc="Number of processes in the group.")
    rank = property(Get_rank, doc="This process's rank in the group (MPI.UNDEFINED: not in it).")

    def Translate_ranks(self, ranks: Sequence[int] | None = None, group: Group | None = None) -> list[int]:
        """The ranks in `group` (default: the world's group) of the processes `ranks` of this group.

        Raises:
            MPIException: a rank is not in 0..size-1 (nor MPI.PROC_NULL).
        """
        members = self._members
        ranks = list(range(len(members))) if ranks is None else [operator.index(r) for r in ranks]
        target = None if group is None else group._members
        translated = []
        for rank in ranks:
            if rank == PROC_NULL:
                translated.append(PROC_NULL)
                continue
            if not 0 <= rank < len(members):
                raise MPIException(ERR_ARG, f"Group.Translate_ranks: rank {rank} is not in this group of "
                                            f"{len(members)}")
            process = members[rank]
            if target is None:
                translated.append(process)
            else:
                translated.append(target.index(process) if process in target else UNDEFINED)
        return translated

    def Compare(self, group: Group) -> int:
        """MPI.IDENT: same processes in the same order; MPI.SIMILAR: another order; else MPI.UNEQUAL."""
        mine, theirs = self._members, group._members
        if mine == theirs:
            return IDENT
        return SIMILAR if sorted(mine) == sorted(theirs) else UNEQUAL

    # -- new groups ------------------------------------------------------------------------------

    def Dup(self) -> Group:
        """A new handle of the same group."""
        return Group._of(self._members)

    @classmethod
    def Union(cls, group1: Group, group2: Group) -> Group:
        """The processes of `group1`, then those of `group2` not in `group1`."""
        first = group1._members
        return cls._of(first + tuple(p for p in group2._members if p not in first))

    @classmethod
    def Intersection(cls, group1: Group, group2: Group) -> Group:
        """The processes of `group1` that are in `group2`, in `group1`'s order."""
        second = set(group2._members)
        return cls._of([p for p in group1._members if p in second])

    Intersect = Intersection

    @classmethod
    def Difference(cls, group1: Group, group2: Group) -> Group:
        """The processes of `group1` that are not in `group2`, in `group1`'s order."""
        second = set(group2._members)
        return cls._of([p for p in group1._members if p not in second])

    def Incl(self, ranks: Sequence[int]) -> Group:
        """The group of the processes `ranks` of this group, in that order.

        Raises:
            MPIException: a rank is out of range or given twice.
        """
        return Group._of([self._members[r] for r in self._checked(ranks, "Incl")])

    def Excl(self, ranks: Sequence[int]) -> Group:
        """This group without the processes `ranks`, in this group's order."""
        dropped = set(self._checked(ranks, "Excl"))
        return Group._of([p for r, p in enumerate(self._members) if r not in dropped])

    def Range_incl(self, ranks: Sequence[tuple[int, int, int]]) -> Group:
        """`Incl` of the ranks of (first, last, stride) triplets, last included."""
        return self.Incl(_ranges(ranks))

    def Range_excl(self, ranks: Sequence[tuple[int, int, int]]) -> Group:
        """`Excl` of the ranks of (first, last, stride) triplets, last included."""
        return self.Excl(_ranges(ranks))

    def _checked(self, ranks: Sequence[int], what: str) -> list[int]:
        ranks = [operator.index(r) for r in ranks]
        size = len(self._members)
        bad = [r for r in ranks if not 0 <= r < size]
        if bad or len(set(ranks)) != len(ranks):
            raise MPIException(ERR_ARG, f"Group.{what}: ranks {ranks} must be distinct ranks of this group "
                                        f"of {size}")
        return ranks

    def Free(self) -> None:
        """Release the group; this handle becomes MPI.GROUP_NULL (MPI.GROUP_EMPTY stays)."""
        self._members   # noqa: B018 - an invalid group raises
        if self is not GROUP_EMPTY:
            self._h = None

    def free(self) -> None:
        """Free, where this is a group that can be freed (not null, not MPI.GROUP_EMPTY)."""
        if self._h is not None and self is not GROUP_EMPTY:
            self.Free()

    @classmethod
    def Create_from_session_pset(cls, session: object, pset_name: str) -> Group:
        """Not supported: MPI sessions (MPI.Session)."""
        raise NotImplementedError("MPI sessions (Group.Create_from_session_pset) are not supported by the "
                                  "colls mpi4py facade")


def _ranges(triplets: Sequence[tuple[int, int, int]]) -> list[int]:
    ranks: list[int] = []
    for first, last, stride in triplets:
        if stride == 0:
            raise MPIException(ERR_ARG, "Group.Range_incl/Range_excl: a stride of 0")
        ranks.extend(range(first, last + (1 if stride > 0 else -1), stride))
    return ranks


def group_of(members: Sequence[int]) -> Group:
    """The group of these world ranks, in this order."""
    return Group._of(members)


GROUP_NULL = Group()
GROUP_EMPTY = Group._of(())
