"""`Channel`: one collective call's view of a transport, and the only thing an algorithm writes to.

A channel carries the call's tag, its deadline and its name, so that every verb an algorithm uses
is a plain (buffer, peer) step, as in Gloo's `send to the inbox on the right`. It counts the bytes
it moves into the call's `Traffic` (what `Communicator.stats()` reports), and it names the call in
every timeout, so that a hang says "all_reduce #12 (ring, ...) on rank 3", not just a peer.

Six verbs: `send`, `recv` and `recv_reduce` post a message and return its request; `wait` waits
for requests until the call's deadline; `exchange` is a sendrecv (either side may be None, and the
buffer received into may be the one sent, in place), the step of most schedules, and
`exchange_init` its persistent form, the step of a schedule compiled once per call signature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from transports.base import Reducer, Request, Traffic, Transport
from transports.errors import CollectiveTimeout


class Channel:
    """One collective call's tag, deadline, name and byte counters over a transport.

    A communicator keeps one channel and points it at each call in turn (calls run one at a time),
    so keep none beyond the call it was given for. `levels` is what a hierarchical algorithm runs
    over (`algorithms.hierarchical.Levels`), None where the group is one host.
    """

    __slots__ = ("transport", "rank", "size", "tag", "deadline", "what", "traffic", "levels")

    def __init__(self, transport: Transport, tag: int, deadline: float, what: object,
                 traffic: Traffic | None = None, levels: Any = None) -> None:
        self.transport = transport
        self.rank = transport.rank
        self.size = transport.size
        self.tag = tag
        self.deadline = deadline
        self.what = what        # the call's name in timeout messages (formatted only on error)
        self.traffic = traffic
        self.levels = levels

    def send(self, buf: np.ndarray, peer: int) -> Request:
        """Post a send of `buf` to `peer`; `buf` must not change until the request is waited for."""
        traffic = self.traffic
        if traffic is not None:
            traffic.messages_sent[peer] += 1
            traffic.bytes_sent[peer] += buf.nbytes
        return self.transport.isend(buf, peer, self.tag)

    def recv(self, buf: np.ndarray, peer: int) -> Request:
        """Post a receive from `peer` into `buf`."""
        self._count_received(buf.nbytes, peer)
        return self.transport.irecv(buf, peer, self.tag)

    def recv_reduce(self, buf: np.ndarray, peer: int, reducer: Reducer) -> Request:
        """Post a receive from `peer` whose data `reducer` folds into `buf` as it arrives."""
        self._count_received(buf.nbytes, peer)
        return self.transport.irecv_reduce(buf, peer, self.tag, reducer)

    def wait(self, *requests: Request) -> None:
        """Wait for every request until the call's deadline; a timeout names this call and rank."""
        try:
            self.transport.wait_all(requests, self.deadline)
        except CollectiveTimeout as error:
            raise self._named(error) from None

    def exchange(self, send_buf: np.ndarray | None, dst: int | None, recv_buf: np.ndarray | None,
                 src: int | None, reducer: Reducer | None = None) -> None:
        """Send `send_buf` to `dst` and receive into `recv_buf` from `src` (folded into it by
        `reducer` when given), then wait for both: MPI_Sendrecv. Either buffer may be None (a send
        or a receive alone); `recv_buf` may be `send_buf` itself (MPI_Sendrecv_replace: the
        transport sends the old contents and receives over them); otherwise they must not overlap."""
        traffic = self.traffic
        if traffic is not None:   # (counted inline: every step of every schedule comes here)
            if send_buf is not None:
                traffic.messages_sent[dst] += 1
                traffic.bytes_sent[dst] += send_buf.nbytes
            if recv_buf is not None:
                traffic.messages_received[src] += 1
                traffic.bytes_received[src] += recv_buf.nbytes
        try:
            self.transport.sendrecv(send_buf, dst, recv_buf, src, self.tag, self.deadline, reducer)
        except CollectiveTimeout as error:
            raise self._named(error) from None

    def exchange_init(self, dtype: np.dtype, send_count: int, dst: int | None, recv_count: int,
                      src: int | None, reducer: Reducer | None = None) -> Callable[..., None]:
        """`exchange`'s persistent form, for a compiled schedule's step: counts and peers fixed
        once (`Transport.sendrecv_init`), then `step(send_buf, recv_buf)` in whatever call the
        channel is pointed at (its tag, deadline and counters). A step with an empty side is
        `exchange` itself (nothing to set up)."""
        transport = self.transport
        if not send_count or not recv_count:   # (a send or a receive alone: nothing to set up)
            def step(send_buf: np.ndarray | None, recv_buf: np.ndarray | None) -> None:
                self.exchange(send_buf, dst, recv_buf, src, reducer)
            return step
        moved = transport.sendrecv_init(dtype, send_count, dst, recv_count, src, reducer)
        sent, received = send_count * dtype.itemsize, recv_count * dtype.itemsize

        def step(send_buf: np.ndarray, recv_buf: np.ndarray) -> None:
            traffic = self.traffic
            if traffic is not None:
                traffic.messages_sent[dst] += 1
                traffic.bytes_sent[dst] += sent
                traffic.messages_received[src] += 1
                traffic.bytes_received[src] += received
            try:
                moved(send_buf, recv_buf, self.tag, self.deadline)
            except CollectiveTimeout as error:
                raise self._named(error) from None
        return step

    def _named(self, error: CollectiveTimeout) -> CollectiveTimeout:
        """A transport's timeout, naming this call and rank."""
        return CollectiveTimeout(f"{self.what} on rank {self.rank}: {error}", error.peers)

    def _count_received(self, nbytes: int, peer: int) -> None:
        traffic = self.traffic
        if traffic is not None:
            traffic.messages_received[peer] += 1
            traffic.bytes_received[peer] += nbytes
