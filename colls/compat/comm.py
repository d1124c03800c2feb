"""`MPI.Comm`/`MPI.Intracomm` over a colls `Communicator`: handles, groups, Dup/Split/Create.

A `Comm` object holds a handle (`_Handle`): the colls communicator and what MPI keeps with it (name,
info, attributes, error handler, topology). `MPI.Comm(comm)` is a second object of the same handle,
equal to the first, as in mpi4py; `Free` makes the freed object MPI.COMM_NULL. `COMM_WORLD` and
`COMM_SELF` resolve their communicator when used: the one `bind` installed for this thread (ranks
as threads, `colls.compat.spawn`), else `colls.init()`'s world (under `colls run`, `mpiexec`, or a
plain `python` as a group of one). Processes are named by their world rank (`Group`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Iterator

import colls
from colls.communicator import Communicator

from .attributes import Attributes, default_errhandler
from .blocks import BlockCollectives
from .datatypes import UNDEFINED
from .errors import ERR_COMM, ERR_GROUP, MPIException
from .group import CONGRUENT, IDENT, SIMILAR, UNEQUAL, Group, group_of, my_world_rank
from .handles import HandleTable, NumberedHandle
from .info import INFO_NULL, Info, info_of, info_with
from .p2p import PointToPoint
from .request import Request
from .schedules import ScheduledCollectives
from .topology import Constructors

__all__ = ["COMM_NULL", "COMM_SELF", "COMM_WORLD", "CONGRUENT", "IDENT", "SIMILAR", "UNEQUAL", "Comm",
           "Intracomm", "MPIException", "bind"]

COMM_TYPE_SHARED, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED, COMM_TYPE_RESOURCE_GUIDED = 1, 2, 3, 4
_HW_RESOURCE, _SHARED_MEMORY = "mpi_hw_resource_type", "mpi_shared_memory"

_bound = threading.local()
_process_self: Communicator | None = None
_self_lock = threading.Lock()


class _Lifecycle:
    """MPI_Init/MPI_Finalize state. `mpi4py.rc.initialize = False` (read when first needed, since the
    facade's module is imported before the script sets it) means: nothing works before MPI.Init."""

    initialized: bool | None = None   # None: not decided yet
    finalized = False

    def ready(self) -> bool:
        if self.initialized is None:
            package = sys.modules.get("mpi4py")   # the facade's (`install`), not the real mpi4py's
            installed = getattr(package, "MPI", None) is sys.modules.get("colls.compat.MPI")
            self.initialized = not installed or getattr(package, "rc", None) is None or \
                package.rc.initialize is not False
        return self.initialized

    def require(self, what: str) -> None:
        if not self.ready():
            raise MPIException(f"{what} used before MPI.Init (mpi4py.rc.initialize is False): call "
                               f"MPI.Init() or MPI.Init_thread() first")


lifecycle = _Lifecycle()


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


class _Handle:
    """One MPI communicator: the colls communicator and what MPI keeps with it."""

    __slots__ = ("communicator", "name", "info", "attrs", "errhandler", "topology", "from_self",
                 "predefined", "__weakref__")

    def __init__(self, communicator: Communicator, name: str = "", from_self: bool = False,
                 info: dict[str, str] | None = None, topology: object = None) -> None:
        self.communicator = communicator
        self.name = name
        self.from_self = from_self   # made from COMM_SELF: its one process is this one
        self.info = {} if info is None else info
        self.attrs: dict[int, object] = {}
        self.errhandler = default_errhandler()
        self.topology = topology
        self.predefined = False


_predefined_handles: weakref.WeakKeyDictionary[Communicator, _Handle] = weakref.WeakKeyDictionary()


class Comm(Attributes, Constructors, PointToPoint, BlockCollectives, ScheduledCollectives, NumberedHandle):
    """An MPI communicator: a handle of a colls `Communicator` (none: MPI.COMM_NULL, or freed)."""

    _h: _Handle | None
    _numbers = HandleTable()

    def __new__(cls, comm: Comm | None = None) -> Comm:
        self = object.__new__(cls)
        if comm is None:
            self._h = None
        elif isinstance(comm, Comm):
            handle = comm._handle_or_none()
            cls._check_kind(handle)
            self._h = handle
        else:
            raise TypeError(f"{cls.__name__}: expecting an MPI communicator, got {type(comm).__name__}")
        return self

    @classmethod
    def _check_kind(cls, handle: _Handle | None) -> None:
        """Raise TypeError where `handle` is not a communicator of this class (a topology's)."""

    @classmethod
    def _wrap(cls, handle: _Handle | None) -> Comm:
        comm = object.__new__(cls)
        comm._h = handle
        return comm

    def _handle_or_none(self) -> _Handle | None:
        return self._h

    def _handle(self) -> _Handle:
        handle = self._handle_or_none()
        if handle is None:
            raise _null_communicator()
        return handle

    @property
    def _comm(self) -> Communicator:
        handle = self._h
        if handle is None:
            raise _null_communicator()
        return handle.communicator

    def _kind(self) -> type:
        """The class of a communicator made from this one (Dup keeps it; not the predefined ones')."""
        return type(self)

    def __bool__(self) -> bool:
        return self._handle_or_none() is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Comm):
            return NotImplemented
        return self._handle_or_none() is other._handle_or_none()

    __hash__ = None   # type: ignore[assignment] - handles are unhashable in mpi4py

    def __repr__(self) -> str:
        handle = self._handle_or_none()
        return f"<colls.compat.MPI.{type(self).__name__} {None if handle is None else handle.communicator!r}>"

    def __reduce__(self) -> object:
        for name in ("COMM_NULL", "COMM_WORLD", "COMM_SELF"):
            if self is globals()[name]:
                return name
        handle = self._handle_or_none()
        if handle is None:
            return (type(self), ())
        if handle.predefined:
            return (type(self), (COMM_SELF if handle.from_self else COMM_WORLD,))
        raise ValueError(f"cannot pickle {self!r}: only MPI.COMM_WORLD and MPI.COMM_SELF name the same "
                         f"communicator in another process")

    def _numbered(self) -> _Handle | None:
        return self._handle_or_none()

    @classmethod
    def _from_numbered(cls, handle: _Handle | None) -> Comm:
        """The communicator of a numbered handle (`fromint`), of the class its topology implies."""
        if cls in (Comm, Intracomm) and handle is not None and handle.topology is not None:
            return handle.topology.comm_class()._wrap(handle)
        if cls in (Comm, Intracomm) and getattr(getattr(handle, "communicator", None), "is_inter", False):
            from .intercomm import Intercomm

            return Intercomm._wrap(handle)
        return cls._wrap(handle)

    # -- size, rank, names -----------------------------------------------------------------------

    def Get_rank(self) -> int:
        """This process's rank in the communicator."""
        return self._comm.rank

    def Get_size(self) -> int:
        """Number of ranks in the communicator."""
        return self._comm.size

    rank = property(Get_rank, doc="This process's rank in the communicator.")
    size = property(Get_size, doc="Number of ranks in the communicator.")

    def Is_inter(self) -> bool:
        """Whether this is an inter-communicator (never: only intra-communicators exist here)."""
        self._handle()
        return False

    def Is_intra(self) -> bool:
        """Whether this is an intra-communicator (always)."""
        self._handle()
        return True

    is_inter = property(Is_inter, doc="Whether this is an inter-communicator.")
    is_intra = property(Is_intra, doc="Whether this is an intra-communicator.")

    def Get_name(self) -> str:
        """The communicator's name ("" for one made by Dup or Split until Set_name)."""
        handle = self._handle_or_none()
        return "MPI_COMM_NULL" if handle is None else handle.name

    def Set_name(self, name: str) -> None:
        """Name the communicator (every handle of it sees the name)."""
        self._handle().name = str(name)

    name = property(Get_name, Set_name, doc="The communicator's name.")

    def Get_topology(self) -> int:
        """MPI.CART, MPI.GRAPH or MPI.DIST_GRAPH for a topology, else MPI.UNDEFINED."""
        topology = self._handle().topology
        return UNDEFINED if topology is None else topology.kind

    topology = property(Get_topology, doc="The kind of topology (MPI.UNDEFINED: none).")
    is_topo = property(lambda self: self._handle().topology is not None, doc="Whether it has a topology.")

    # -- info, group -----------------------------------------------------------------------------

    def Get_info(self) -> Info:
        """A new Info holding the hints set on this communicator."""
        return info_with(self._handle().info)

    def Set_info(self, info: Info) -> None:
        """Add the hints of `info` to this communicator's (colls reads none of them)."""
        self._handle().info.update(info_of(info))

    info = property(Get_info, Set_info, doc="The communicator's hints (a new Info).")

    def _members(self) -> tuple[int, ...]:
        """The world ranks of this communicator's processes, in its rank order."""
        handle = self._handle()
        if handle.from_self:
            return (my_world_rank(),) * handle.communicator.size
        return handle.communicator.members

    def Get_group(self) -> Group:
        """The group of this communicator's processes."""
        return group_of(self._members())

    group = property(Get_group, doc="The communicator's group (a new Group).")

    def Compare(self, other: Comm) -> int:
        """MPI.IDENT for the same communicator, MPI.CONGRUENT for the same ranks in the same order,
        MPI.SIMILAR in another order, MPI.UNEQUAL otherwise."""
        if self._handle() is other._handle():
            return IDENT
        mine, theirs = self._members(), other._members()
        if mine == theirs:
            return CONGRUENT
        return SIMILAR if sorted(mine) == sorted(theirs) else UNEQUAL

    # -- new communicators -----------------------------------------------------------------------

    def _derived(self, communicator: Communicator | None, cls: type, info: dict[str, str] | None = None,
                 topology: object = None) -> Comm:
        """A handle of `communicator`, made from this one (None: a null `cls`)."""
        if communicator is None:
            return cls._wrap(None)
        return cls._wrap(_Handle(communicator, "", self._handle().from_self, info, topology))

    def Dup(self, info: Info | None = None) -> Comm:
        """A new communicator of the same ranks, order, topology, hints (or `info`'s), error handler and
        copied attributes (collective)."""
        handle = self._handle()
        hints = dict(handle.info) if info is None else info_of(info)
        communicator = handle.communicator
        dup = self._derived(communicator.split(0, communicator.rank), self._kind(), hints, handle.topology)
        dup._h.errhandler = handle.errhandler
        dup._h.attrs.update(self._copied_attributes())
        return dup

    Clone = Dup

    def Dup_with_info(self, info: Info) -> Comm:
        """Dup, with the hints of `info` instead of this communicator's."""
        return self.Dup(info if info is not None else INFO_NULL)

    def Idup(self, info: Info | None = None) -> tuple[Comm, Request]:
        """Dup, returned with a request that is already complete."""
        return self.Dup(info), Request()

    def Idup_with_info(self, info: Info) -> tuple[Comm, Request]:
        """Dup_with_info, returned with a request that is already complete."""
        return self.Dup_with_info(info), Request()

    def Split(self, color: int = 0, key: int = 0) -> Intracomm:
        """Ranks with the same color form a communicator, ordered by (key, rank); MPI.UNDEFINED: none."""
        colour = None if color == UNDEFINED or color < 0 else int(color)
        return self._derived(self._comm.split(colour, int(key)), Intracomm)

    def Split_type(self, split_type: int, key: int = 0, info: Info = INFO_NULL) -> Intracomm:
        """Ranks that share memory (MPI.COMM_TYPE_SHARED: the same host, by colls' layout) form a
        communicator; MPI.UNDEFINED: none. COMM_TYPE_HW_GUIDED and RESOURCE_GUIDED split by host
        when `info` asks for "mpi_hw_resource_type" = "mpi_shared_memory" (else MPI.COMM_NULL);
        COMM_TYPE_HW_UNGUIDED splits by host when that makes smaller groups (else MPI.COMM_NULL)."""
        communicator = self._comm
        layout = communicator.layout
        host = layout.hosts[communicator.rank]
        colour = None
        hints = info_of(info)
        if split_type == COMM_TYPE_SHARED:
            colour = host
        elif split_type in (COMM_TYPE_HW_GUIDED, COMM_TYPE_RESOURCE_GUIDED):
            colour = host if hints.get(_HW_RESOURCE) == _SHARED_MEMORY else None
        elif split_type == COMM_TYPE_HW_UNGUIDED:
            if len(layout.members[host]) < communicator.size:
                colour = host
                if info:
                    info.Set(_HW_RESOURCE, _SHARED_MEMORY)
        elif split_type != UNDEFINED:
            raise ValueError(f"Split_type: split_type={split_type!r} is not MPI.COMM_TYPE_SHARED, another "
                             f"MPI.COMM_TYPE_* or MPI.UNDEFINED")
        hints.pop(_HW_RESOURCE, None)
        return self._derived(communicator.split(colour, int(key)), Intracomm, hints)

    def Create(self, group: Group) -> Comm:
        """The communicator of `group`'s processes, in its order (collective over this communicator;
        ranks outside `group` get MPI.COMM_NULL; disjoint groups on different ranks are allowed).

        Raises:
            MPIException: `group` holds a process that is not in this communicator.
        """
        mine = self._members()
        members = group._members
        strangers = set(members) - set(mine)
        if strangers:
            raise MPIException(ERR_GROUP, f"Comm.Create: the group holds processes (world ranks "
                                          f"{sorted(strangers)}) that are not in this communicator")
        me = mine[self._comm.rank]
        colour, key = (min(members), members.index(me)) if me in members else (None, 0)
        return self._derived(self._comm.split(colour, key), Intracomm)

    def Create_group(self, group: Group, tag: int = 0) -> Intracomm:
        """Create, called by the members of `group` only: supported where `group` holds every process
        of this communicator (colls makes a communicator collectively over its parent).

        Raises:
            NotImplementedError: `group` leaves out some of this communicator's processes.
        """
        if set(group._members) != set(self._members()):
            raise NotImplementedError("Comm.Create_group over part of a communicator is not supported by "
                                      "the colls mpi4py facade: use Comm.Create (collective over the "
                                      "communicator)")
        return self.Create(group)

    @classmethod
    def Create_from_group(cls, group: Group, stringtag: str = "org.mpi4py", info: Info = INFO_NULL,
                          errhandler: object = None) -> Intracomm:
        """The communicator of `group` (MPI 4 sessions): supported for the processes of COMM_WORLD or
        of COMM_SELF, by `Create_group` over that communicator."""
        for base in (COMM_WORLD, COMM_SELF):
            if set(group._members) == set(base._members()) and len(group._members) == base.Get_size():
                return base.Create_group(group)
        raise NotImplementedError("Intracomm.Create_from_group of a group other than COMM_WORLD's or "
                                  "COMM_SELF's processes is not supported by the colls mpi4py facade")

    def Free(self) -> None:
        """Release the communicator (its attributes' delete functions run); this object becomes
        MPI.COMM_NULL.

        Raises:
            MPIException: MPI.COMM_NULL, or MPI.COMM_WORLD / MPI.COMM_SELF (never freed).
        """
        handle = self._handle()
        if handle.predefined:
            raise MPIException(ERR_COMM, "MPI.COMM_WORLD and MPI.COMM_SELF cannot be freed")
        self._delete_attributes()
        self._h = None
        self._numbers.forget(handle)
        handle.communicator.close()

    def free(self) -> None:
        """Free, where this is a communicator that can be freed (not null, not predefined)."""
        handle = self._handle_or_none()
        if handle is not None and not handle.predefined:
            self.Free()

    def Abort(self, errorcode: int = 0) -> None:
        """Release every rank blocked on this communicator and exit this process with `errorcode`."""
        import os

        self._comm.abort(f"MPI Abort with error code {errorcode}")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(errorcode if 0 < errorcode < 256 else 1)

    @classmethod
    def Get_parent(cls) -> Comm:
        """The communicator to a parent that spawned this job: none (MPI.COMM_NULL), as colls spawns
        no processes."""
        from .intercomm import Intercomm

        return Intercomm()


class Intracomm(Comm):
    """An intra-communicator (an inter-communicator is an `MPI.Intercomm`)."""

    @classmethod
    def _check_kind(cls, handle: _Handle | None) -> None:
        if handle is not None and getattr(handle.communicator, "is_inter", False):
            raise TypeError(f"{cls.__name__}: the communicator is an inter-communicator")

    def Create_intercomm(self, local_leader: int, peer_comm: Comm, remote_leader: int,
                         tag: int = 0) -> Comm:
        """An inter-communicator between this group and another (collective over both): the
        leaders (`local_leader` here, `remote_leader` its rank in `peer_comm`) swap their groups
        over `peer_comm` with `tag`. Supported where the two groups together are all of
        `peer_comm`'s processes (colls makes the inter-communicator by splitting it).

        Raises:
            MPIException: the two groups share processes.
            NotImplementedError: the two groups leave out some of `peer_comm`'s processes.
        """
        from .intercomm import create_intercomm

        return create_intercomm(self, local_leader, peer_comm, remote_leader, tag)


class _World(Intracomm):
    """MPI.COMM_WORLD: this thread's bound world, else `colls.init()`."""

    def _handle_or_none(self) -> _Handle:
        if not lifecycle.initialized:
            lifecycle.require("MPI.COMM_WORLD")
        return _predefined(getattr(_bound, "world", None) or colls.init(), "MPI_COMM_WORLD", False)

    @property
    def _comm(self) -> Communicator:
        if not lifecycle.initialized:
            lifecycle.require("MPI.COMM_WORLD")
        return getattr(_bound, "world", None) or colls.init()

    def _kind(self) -> type:
        return Intracomm


class _Self(Intracomm):
    """MPI.COMM_SELF: a group of one (per bound thread, else per process)."""

    def _handle_or_none(self) -> _Handle:
        return _predefined(self._comm, "MPI_COMM_SELF", True)

    @property
    def _comm(self) -> Communicator:
        global _process_self
        if not lifecycle.initialized:
            lifecycle.require("MPI.COMM_SELF")
        bound = getattr(_bound, "self", None)
        if bound is not None:
            return bound
        with _self_lock:   # two threads asking at once get the one COMM_SELF
            if _process_self is None:
                from transports.local import LocalWorld

                _process_self = Communicator(LocalWorld(1).transport(0), name="self")
        return _process_self

    def _kind(self) -> type:
        return Intracomm


def _null_communicator() -> MPIException:
    return MPIException(ERR_COMM, "invalid communicator: MPI.COMM_NULL (or a freed communicator)")


def _predefined(communicator: Communicator, name: str, from_self: bool) -> _Handle:
    handle = _predefined_handles.get(communicator)
    if handle is None:
        handle = _predefined_handles.setdefault(communicator, _Handle(communicator, name, from_self))
        handle.predefined = True
    return handle


COMM_NULL = Intracomm()
COMM_WORLD = _World._wrap(None)
COMM_SELF = _Self._wrap(None)
