"""The colls side of an inter-communicator: one colls `Communicator` over both groups, seen from one.

An inter-communicator joins two disjoint groups. Here it is backed by a colls `Communicator` over
their union (the group holding the lowest world rank first, each group in its own rank order, so
that both sides agree), made collectively by splitting `peer_comm`. `RemoteView` presents that
union as the facade's `MPI.Comm` methods expect a communicator: `rank`, `size` and `members` are
the local group's, and the peers of point-to-point calls (`send`, `recv`, the probes, `mrecv`) are
ranks of the remote group, translated both ways (a status names the source by its remote rank).
Every other verb of a colls `Communicator` raises NotImplementedError naming inter-communicators.

A wildcard receive (ANY_SOURCE) over the union only ever sees the remote group's messages: a rank
never sends point to point to its own group over an inter-communicator, and colls' collectives use
tags no user receive matches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from colls.communicator import Communicator
from transports.base import ANY_SOURCE, Envelope

from .errors import ERR_ARG, ERR_GROUP, MPIException


class _Shifted:
    """A receive's handle whose `status` names the source by its rank in the remote group."""

    def __init__(self, work: Any, offset: int) -> None:
        self._work = work
        self._offset = offset
        self._request = work._request   # (a point-to-point request: one progress pass per poll)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def wait(self, timeout: float | None = None) -> Any:
        return self._work.wait(timeout)

    @property
    def status(self) -> Envelope | None:
        envelope = self._work.status
        if envelope is None:
            return None
        return Envelope(envelope.source - self._offset, envelope.tag, envelope.nbytes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class RemoteView:
    """The union communicator `union` of an inter-communicator, seen from the local group.

    Args:
        union: a colls Communicator over both groups.
        local_offset, local_size: where the local group sits in `union` (consecutive ranks).
        remote_offset, remote_size: where the remote group sits in `union`.
    """

    is_inter = True

    def __init__(self, union: Communicator, local_offset: int, local_size: int, remote_offset: int,
                 remote_size: int) -> None:
        self.union = union
        self.local_offset, self.remote_offset = local_offset, remote_offset
        self.rank = union.rank - local_offset
        self.size = local_size
        self.remote_size = remote_size
        self.members = union.members[local_offset:local_offset + local_size]
        self.remote_members = union.members[remote_offset:remote_offset + remote_size]
        self.timeout = union.timeout
        self.transport = union.transport
        self.name = union.name
        self.layout = union.layout.subset(range(local_offset, local_offset + local_size))

    @property
    def closed(self) -> bool:
        return self.union.closed

    def __repr__(self) -> str:
        return f"<inter-communicator: {self.size} local, {self.remote_size} remote ranks over {self.union!r}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(f"inter-communicators: {name} over an Intercomm is not supported by the "
                                  f"colls mpi4py facade (point-to-point, Barrier, the lowercase "
                                  f"collectives, Merge, Dup, Split and Free are)")

    def close(self) -> None:
        """Release the union communicator."""
        self.union.close()

    # -- point to point over the remote group --------------------------------------------------

    def _peer(self, what: str, peer: Any, wildcard: bool = False) -> Any:
        if wildcard and peer == ANY_SOURCE:
            return peer
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) or \
                not 0 <= peer < self.remote_size:
            raise self.union._check.fail(what, f"rank {peer!r} is not a rank of the remote group of "
                                               f"{self.remote_size} (an inter-communicator's peers are "
                                               f"the remote group's ranks)")
        return int(peer) + self.remote_offset

    def _envelope(self, envelope: Envelope | None) -> Envelope | None:
        if envelope is None:
            return None
        return Envelope(envelope.source - self.remote_offset, envelope.tag, envelope.nbytes, envelope)

    def _received(self, result: Any, async_op: bool) -> Any:
        return _Shifted(result, self.remote_offset) if async_op else result

    def send(self, x: Any, dst: int, tag: int = 0, async_op: bool = False, timeout: float | None = None,
             synchronous: bool = False) -> Any:
        """`Communicator.send` to rank `dst` of the remote group."""
        return self.union.send(x, self._peer("send", dst), tag, async_op, timeout, synchronous)

    def recv(self, x: Any, src: int, tag: int = 0, async_op: bool = False,
             timeout: float | None = None) -> Any:
        """`Communicator.recv` from rank `src` of the remote group (or ANY_SOURCE)."""
        work = self.union.recv(x, self._peer("recv", src, True), tag, async_op, timeout)
        return self._received(work, async_op)

    def iprobe(self, src: int = ANY_SOURCE, tag: int = -1) -> Envelope | None:
        """`Communicator.iprobe`; the envelope names the source by its remote rank."""
        return self._envelope(self.union.iprobe(self._peer("iprobe", src, True), tag))

    def improbe(self, src: int = ANY_SOURCE, tag: int = -1) -> Envelope | None:
        """`Communicator.improbe`; the envelope names the source by its remote rank."""
        return self._envelope(self.union.improbe(self._peer("improbe", src, True), tag))

    def probe(self, src: int = ANY_SOURCE, tag: int = -1, timeout: float | None = None) -> Envelope:
        """`Communicator.probe`; the envelope names the source by its remote rank."""
        return self._envelope(self.union.probe(self._peer("probe", src, True), tag, timeout))

    def mprobe(self, src: int = ANY_SOURCE, tag: int = -1, timeout: float | None = None) -> Envelope:
        """`Communicator.mprobe`; the envelope names the source by its remote rank."""
        return self._envelope(self.union.mprobe(self._peer("mprobe", src, True), tag, timeout))

    def mrecv(self, x: Any, message: Envelope, async_op: bool = False, timeout: float | None = None) -> Any:
        """`Communicator.mrecv` of a message this view's `improbe`/`mprobe` claimed."""
        inner = message.handle if isinstance(message, Envelope) else None
        if not isinstance(inner, Envelope):
            raise self.union._check.fail("mrecv", f"message must be an Envelope that improbe or mprobe "
                                                  f"claimed and that was not received yet, got {message!r}")
        message.handle = None   # received once only
        return self._received(self.union.mrecv(x, inner, async_op, timeout), async_op)

    # -- the union ------------------------------------------------------------------------------

    def remote_slice(self, values: list[Any]) -> list[Any]:
        """The remote group's entries of a list over the union."""
        return values[self.remote_offset:self.remote_offset + self.remote_size]

    def spread(self, items: list[Any]) -> list[Any]:
        """A list over the union holding `items` (one per remote rank) at the remote group's places."""
        full: list[Any] = [None] * self.union.size
        full[self.remote_offset:self.remote_offset + self.remote_size] = items
        return full

    def dup(self) -> RemoteView:
        """A new view over a copy of the union (collective over both groups)."""
        union = self.union
        return RemoteView(union.split(0, union.rank), self.local_offset, self.size, self.remote_offset,
                          self.remote_size)

    def merge(self, high: bool) -> Communicator:
        """The union as an intra-communicator: the group passing high=False first (where both pass
        the same, the union's order); each group in its own rank order (collective over both)."""
        union = self.union
        table = union.all_gather(np.array([[int(bool(high))]], np.int64))
        mine, theirs = bool(table[self.local_offset, 0]), bool(table[self.remote_offset, 0])
        first = self.local_offset == 0 if mine == theirs else not mine
        return union.split(0, (0 if first else self.remote_size) + self.rank)

    def split(self, color: int | None, key: int) -> RemoteView | None:
        """MPI_Comm_split of an inter-communicator: ranks of each group with one color form the two
        groups of a new one, ordered by (key, rank); None where either side has no such rank."""
        union = self.union
        colour = -1 if color is None else int(color)
        table = union.all_gather(np.array([[colour, int(key)]], np.int64))
        groups = []
        for offset, size in sorted([(self.local_offset, self.size), (self.remote_offset, self.remote_size)]):
            ranks = [r for r in range(offset, offset + size) if colour >= 0 and table[r, 0] == colour]
            groups.append(sorted(ranks, key=lambda r: (table[r, 1], r)))
        joined = colour >= 0 and all(groups)
        order = groups[0] + groups[1] if joined else []
        child = union.split(colour if joined else None, order.index(union.rank) if joined else 0)
        if child is None:
            return None
        mine = 0 if self.local_offset == 0 else 1
        local_offset = 0 if mine == 0 else len(groups[0])
        remote_offset = len(groups[0]) if mine == 0 else 0
        return RemoteView(child, local_offset, len(groups[mine]), remote_offset, len(groups[1 - mine]))


def create(local: Any, local_leader: int, peer: Any, remote_leader: int, tag: int) -> RemoteView:
    """The view of a new inter-communicator (MPI_Intercomm_create), collective over both groups:
    the leaders swap their groups' members over `peer` with `tag`, each tells its group, and
    `peer`'s communicator is split into the union.

    Raises:
        MPIException: the two groups share processes.
        NotImplementedError: the two groups together are not all of `peer`'s processes.
    """
    from .comm import Comm

    mine = tuple(local._members())
    if local.Get_rank() == local_leader:
        theirs = Comm.sendrecv(peer, list(mine), remote_leader, tag, None, remote_leader, tag)
    else:
        theirs = None
    theirs = tuple(local._comm.broadcast_object(theirs, local_leader))
    return join(peer, mine, theirs, local.Get_rank(), "Create_intercomm", "peer_comm")


def join(parent: Any, mine: tuple[int, ...], theirs: tuple[int, ...], rank: int, what: str,
         name: str) -> RemoteView:
    """The view of the inter-communicator between the groups of world ranks `mine` (this process
    is its rank `rank`; -1: not in it) and `theirs`, made by splitting the facade communicator
    `parent` (collective over it).

    Raises:
        MPIException: the two groups share processes, or this process is not in `mine`.
        NotImplementedError: the two groups together are not all of `parent`'s processes.
    """
    if set(mine) & set(theirs):
        raise MPIException(ERR_ARG, f"{what}: the local and remote groups share processes (world ranks "
                                    f"{sorted(set(mine) & set(theirs))}); they must be disjoint")
    if sorted(parent._members()) != sorted(mine + theirs):
        raise NotImplementedError(f"inter-communicators ({what}) whose two groups are not together all of "
                                  f"{name}'s processes are not supported by the colls mpi4py facade (colls "
                                  f"makes a communicator collectively over its parent)")
    if rank < 0:
        raise MPIException(ERR_GROUP, f"{what}: this process is not in the local group")
    first = min(mine) < min(theirs)
    local_offset, remote_offset = (0, len(mine)) if first else (len(theirs), 0)
    union = parent._comm.split(0, local_offset + rank)
    return RemoteView(union, local_offset, len(mine), remote_offset, len(theirs))
