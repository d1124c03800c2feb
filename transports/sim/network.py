"""The `sim` transport's machine: links, the routes messages take over them, time sharing of cores.

A network object answers `route(src, dst)` (and optionally `route_for`, `exchange_route` and the
other attributes `SimWorld` reads with `getattr`); `IdealNetwork` is the textbook one: a
full-duplex link per rank into a non-blocking switch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .ranks import _Message


class Link:
    """One direction of one wire (or switch port): a capacity in bytes per second, shared fairly."""

    __slots__ = ("name", "capacity", "flows")

    def __init__(self, name: str, capacity: float) -> None:
        self.name = name
        self.capacity = capacity
        self.flows: set[_Message] = set()

    def __repr__(self) -> str:
        return f"Link({self.name}, {self.capacity / 1e9:g} GB/s)"


@dataclass(frozen=True)
class Route:
    """How a message from one rank reaches another: its α, the links it crosses, the sending port;
    `byte_weight` scales the bytes that flow (a protocol that costs more per byte than the links'
    capacities say); `eager`: the sender is done once it posted (as with a copy into a FIFO);
    `rendezvous`: nothing flows before the receiver has posted its receive (it pulls the bytes)."""

    alpha: float
    links: tuple[Link, ...]
    port: str = "net"
    byte_weight: float = 1.0
    eager: bool = False    # the send completes when posted (copied into a buffer), not on arrival
    rendezvous: bool = False   # the bytes move only once the receive is posted (the receiver copies)
    pull: float = 0.0      # seconds per byte the receiver copies itself once its wait ends (on its
                           # own clock, so on its core); its send completes when that copy is done
    pull_contended: float = 0.0   # the same while another rank's pull runs (0: no slower)
    # a second stage: when the bytes have crossed `links`, the sending port is free for the next
    # message and the bytes cross `then`'s links before they arrive (a FIFO: the sender copies in,
    # then the receiver copies out, while the sender copies its next message in)
    then: Route | None = None
    # the receiver's own core reads the sender's buffer (cross-memory attach, not a FIFO's slots):
    # the sender's next write of those lines pays the network's `rewrite_seconds`
    reads_sender: bool = False
    # a fused exchange's own CPU work (a network's `exchange_route`): its sender holds its core
    # `send_busy` seconds before the bytes leave, its receiver `receive_busy` once they are there
    # (and its reduction, if any); an eager message's `send_busy`, what its sender's copy costs
    # on this route beyond the network's `send_busy_seconds`. Only with time sharing does it
    # matter that this is work and not waiting: a rank that waits lends its core to another after
    # its spin; one that copies does not
    send_busy: float = 0.0
    receive_busy: float = 0.0


class IdealNetwork:
    """Every rank has its own full-duplex link of 1/β bytes per second into a non-blocking switch."""

    def __init__(self, size: int, alpha: float, beta: float) -> None:
        capacity = math.inf if beta == 0 else 1 / beta
        self.outgoing = [Link(f"rank{r}.out", capacity) for r in range(size)]
        self.incoming = [Link(f"rank{r}.in", capacity) for r in range(size)]
        self.alpha = alpha

    def route(self, src: int, dst: int) -> Route:
        """The two links between `src` and `dst`, and the one α."""
        return Route(self.alpha, (self.outgoing[src], self.incoming[dst]))


@dataclass(frozen=True)
class TimeSharing:
    """More ranks than `cores` on one machine: a rank that waits spins on its core `spin` seconds,
    then yields it to a rank that can run; taking a core back costs `wake` (switch and scheduler)."""

    cores: int
    spin: float
    wake: float
    # each rank's core (None: any rank takes any free core): the kernel keeps a runnable process on
    # its core's run queue, and one that yields there hands the core only to the ranks queued on it
    placement: tuple[int, ...] | None = None
    # the spin of a wait in a fused sendrecv (the network's `exchange_route`), if it polls apart
    # (shm's one-slot receive polls the slot's head, far cheaper a turn than a request's wait)
    sendrecv_spin: float | None = None
    sendrecv_wake: float | None = None   # and what taking a core back from such a wait costs
    # how long a rank that has returned keeps its core (None: `spin`): what it waits in next is
    # the caller's (`colls bench` waits in MPI's barrier, which polls apart from colls' waits)
    returned_spin: float | None = None
