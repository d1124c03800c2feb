"""Where a communicator's ranks run, and the two-level transports its hierarchical calls use.

Hosts are found through the bootstrap: every rank says its host name (COLLS_HOST, else the real
host name), so several virtual hosts can be tested on one machine. The levels are built on the
first hierarchical call, collectively: inside each host a shared-memory group where the host's
ranks share a machine (whatever the world's transport), across hosts a sub-group of the world's
own transport (MPI between machines).
"""

from __future__ import annotations

import platform
import socket

from algorithms import DEFAULTS
from algorithms.hierarchical import Layout, Levels
from transports.base import Exchange, Transport

from . import config
from .selection import Selector


def host_name() -> str:
    """This process's host for grouping ranks: COLLS_HOST, else the machine's host name."""
    return config.get("COLLS_HOST") or socket.gethostname()


def _identity() -> bytes:
    """(virtual host, machine, whether shared memory works here), as one record for the exchange."""
    usable = platform.machine().lower() in ("x86_64", "amd64")
    return "\0".join((host_name(), socket.gethostname(), "1" if usable else "0")).encode()


def discover(exchange: Exchange) -> tuple[Layout, bool]:
    """Collective over the group `exchange` all-gathers over: (the layout of its ranks, whether
    each host's ranks share one machine on which shared memory works, so that the level inside a
    host can be shm)."""
    records = [entry.decode().split("\0") for entry in exchange(_identity())]
    layout = Layout.from_names([record[0] for record in records])
    same_machine = all(len({records[r][1] for r in group}) == 1 and records[group[0]][2] == "1"
                       for group in layout.members)
    return layout, same_machine


def build_levels(rank: int, layout: Layout, world: Transport, exchange: Exchange, shm_inside: bool) -> Levels:
    """Collective over the group of `world` (whose ranks lie as `layout` says; `exchange`
    all-gathers over it): rank `rank`'s transport inside its host and across hosts."""
    host = layout.members[layout.hosts[rank]]
    across = layout.cross_members(layout.local_index(rank))
    if shm_inside and world.name != "shm" and world.name != "local":
        from transports.shm import shm_group

        local = shm_group(rank, host, exchange, **config.transport_options("shm"))
    else:
        local = world.subgroup(host, exchange)
    cross = world.subgroup(across, exchange)
    assert local is not None and cross is not None
    local.watched = cross.watched = world   # an abort of the whole group ends waits on either level
    selectors = {"local": _selector(local), "cross": _selector(cross)}

    def choose(level: str, collective: str, nbytes: int) -> str:
        name = selectors[level].choose(collective, nbytes)
        return DEFAULTS[collective] if name == "hierarchical" else name   # (COLLS_ALGO pins it)

    return Levels(layout, local, cross, choose)


def _selector(transport: Transport) -> Selector:
    return Selector(transport.name, transport.size)
