"""The `mpi` transport: mpi4py's buffer methods (`Isend`/`Irecv` on raw bytes), never pickle.

Collectives and the user's point-to-point messages travel on two duplicates of the communicator, so
a user's tag can never match a collective's. A fused receive-reduce lands in a scratch buffer taken
from a pool that grows to the largest message once and is then reused, and is reduced on completion.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence

import numpy as np

from .base import (
    COLLECTIVE_TAG_BASE,
    Backoff,
    Exchange,
    Reducer,
    Request,
    Transport,
    check_buffer,
    process_alive,
    timeout_error,
)
from .errors import CollectiveMismatch, PeerLost, TransportError

_MPI = None
ABORT_NOTICE_BYTES = 512   # an abort notice: the reason, UTF-8, zero-padded


def import_mpi():
    """mpi4py's MPI module (the real one, cached at first use, so that a facade installed later as
    `mpi4py` — see colls.compat — never stands in for it), or a TransportError saying how to get it."""
    global _MPI
    if _MPI is None:
        try:
            from mpi4py import MPI
        except ImportError as error:
            raise TransportError("the mpi transport needs mpi4py: pip install 'colls[mpi]'") from error
        _MPI = MPI
    return _MPI


class _MpiRequest(Request):
    __slots__ = ("handle", "buf", "scratch", "reducer")

    def __init__(self, kind: str, peer: int, tag: int, buf: np.ndarray) -> None:
        super().__init__(kind, peer, tag, buf.nbytes)
        self.handle = None
        self.buf = buf
        self.scratch: np.ndarray | None = None
        self.reducer: Reducer | None = None


class ScratchPool:
    """Reusable byte buffers for receive-reduce; grows to the largest size seen, then stops."""

    def __init__(self) -> None:
        self.free: list[np.ndarray] = []

    def take(self, nbytes: int) -> np.ndarray:
        """A buffer of at least `nbytes`, reused when one is free."""
        for i, buf in enumerate(self.free):
            if buf.nbytes >= nbytes:
                return self.free.pop(i)
        if self.free:
            self.free.pop(0)   # too small: replace it by a larger one
        return np.empty(max(nbytes, 4096), np.uint8)

    def give(self, buf: np.ndarray) -> None:
        """Return a buffer for the next receive-reduce."""
        self.free.append(buf)


class MpiTransport(Transport):
    """One rank's end of an MPI communicator."""

    name = "mpi"

    def __init__(self, comm=None) -> None:
        MPI = import_mpi()
        self.MPI = MPI
        base = comm if comm is not None else MPI.COMM_WORLD
        self.collective_comm = base.Dup()
        self.p2p_comm = base.Dup()
        # a third context only for abort notices: one receive from anyone, always posted
        self.abort_comm = base.Dup()
        self.abort_notice = np.zeros(ABORT_NOTICE_BYTES, np.uint8)   # the aborter's reason, UTF-8
        self.abort_request = self.abort_comm.Irecv([self.abort_notice, MPI.BYTE], MPI.ANY_SOURCE, 0)
        self.rank = base.Get_rank()
        self.size = base.Get_size()
        self.tag_limit = int(base.Get_attr(MPI.TAG_UB)) + 1
        self.user_tag_limit = self.tag_limit
        # pids of the ranks on this host, to tell a dead peer from a slow one (mpiexec may keep the
        # survivors running: -disable-auto-cleanup); exchanged once, pickled, off the data path
        host = socket.gethostname()
        table = base.allgather((host, os.getpid()))
        self.local_pids = {peer: pid for peer, (peer_host, pid) in enumerate(table) if peer_host == host}
        self.scratch = ScratchPool()
        self.status = MPI.Status()
        self.closed = False

    def _route(self, tag: int):
        if tag >= COLLECTIVE_TAG_BASE:
            return self.collective_comm, (tag - COLLECTIVE_TAG_BASE) % self.tag_limit
        if not 0 <= tag < self.tag_limit:
            raise ValueError(f"rank {self.rank}: tag {tag} is outside MPI's range 0..{self.tag_limit - 1}")
        return self.p2p_comm, tag

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "mpi send")
        comm, mpi_tag = self._route(tag)
        request = _MpiRequest("send", peer, tag, buf)
        request.handle = comm.Isend([buf.view(np.uint8), self.MPI.BYTE], peer, mpi_tag)
        return request

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "mpi receive")
        comm, mpi_tag = self._route(tag)
        request = _MpiRequest("recv", peer, tag, buf)
        request.handle = comm.Irecv([buf.view(np.uint8), self.MPI.BYTE], peer, mpi_tag)
        return request

    def irecv_reduce(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer) -> Request:
        check_buffer(buf, "mpi receive-reduce")
        comm, mpi_tag = self._route(tag)
        request = _MpiRequest("recv", peer, tag, buf)
        request.scratch = self.scratch.take(buf.nbytes)
        request.reducer = reducer
        landing = request.scratch[:buf.nbytes]
        request.handle = comm.Irecv([landing, self.MPI.BYTE], peer, mpi_tag)
        return request

    def _test(self, request: _MpiRequest) -> bool:
        """Test one request; on completion check the size and apply a pending reduction."""
        try:
            finished = request.handle.Test(self.status)
        except self.MPI.Exception as error:
            self._find_dead(error)             # MPI fails requests once a peer is gone: name it
            if error.Get_error_class() == self.MPI.ERR_TRUNCATE:
                raise CollectiveMismatch(
                    f"rank {self.rank} posted a receive of {request.nbytes} B from rank {request.peer} "
                    f"(tag {request.tag}) but a larger message arrived") from None
            raise TransportError(f"rank {self.rank}: MPI failed the {request.kind} of {request.nbytes} B "
                                 f"with rank {request.peer}: {str(error).splitlines()[0]}") from error
        if not finished:
            return False
        if request.kind == "recv":
            got = self.status.Get_count(self.MPI.BYTE)
            if got != request.nbytes:
                raise CollectiveMismatch(
                    f"rank {self.rank} posted a receive of {request.nbytes} B from rank {request.peer} "
                    f"(tag {request.tag}) but rank {request.peer} sent {got} B")
            if request.reducer is not None:
                scratch = request.scratch
                dtype = request.buf.dtype
                request.reducer(request.buf, scratch[:request.nbytes].view(dtype))
                self.scratch.give(scratch)
                request.scratch = None
        request.done = True
        return True

    def wait_all(self, requests: Sequence[Request], deadline: float) -> None:
        backoff = Backoff()
        next_abort_check = time.monotonic() + 0.2
        while True:
            progressed = False
            for request in requests:
                if not request.done and self._test(request):  # type: ignore[arg-type]
                    progressed = True
            if all(r.done for r in requests):
                return
            if progressed:
                backoff.reset()
            now = time.monotonic()
            if now >= deadline:
                raise timeout_error(requests, deadline)
            if now >= next_abort_check:
                next_abort_check = now + 0.2
                self.check_aborted()
                self._check_alive(requests)
            backoff.pause()

    def _find_dead(self, error: Exception) -> None:
        """After an MPI error: CommunicatorAborted if a peer aborted (a rank that failed inside a
        call aborts the group, and MPI may fail our request on its freed buffer first), PeerLost
        naming a local rank that has died, if one has."""
        for _ in range(10):                    # a killed rank takes a moment to look dead
            self.check_aborted()
            for peer, pid in self.local_pids.items():
                if not process_alive(pid):
                    raise PeerLost(f"rank {peer} (pid {pid}) has died; rank {self.rank}'s MPI calls "
                                   f"failed with: {str(error).splitlines()[0]}", peer) from error
            time.sleep(0.05)

    def _check_alive(self, requests: Sequence[Request]) -> None:
        for request in requests:
            pid = self.local_pids.get(request.peer)
            if not request.done and pid is not None and not process_alive(pid):
                raise PeerLost(f"rank {request.peer} (pid {pid}) has died; rank {self.rank} was waiting "
                               f"for its {request!r}", request.peer)

    def abort(self, reason: str) -> None:
        self.aborted = reason
        notice = np.zeros(ABORT_NOTICE_BYTES, np.uint8)
        text = reason.encode()[:ABORT_NOTICE_BYTES]
        notice[:len(text)] = np.frombuffer(text, np.uint8)
        self._notice = notice   # kept alive for the sends, which are never waited: best effort
        for peer in range(self.size):
            if peer != self.rank:
                self.abort_comm.Isend([notice, self.MPI.BYTE], peer, 0)

    def check_aborted(self) -> None:
        if self.abort_request is not None and self.abort_request.Test():
            self.abort_request = None
            self.aborted = self.abort_notice.tobytes().rstrip(b"\0").decode(errors="replace")
        super().check_aborted()

    def subgroup(self, ranks: Sequence[int], exchange: Exchange) -> Transport | None:
        MPI = self.MPI
        color = ranks[0] if ranks else MPI.UNDEFINED
        key = list(ranks).index(self.rank) if ranks else 0
        comm = self.collective_comm.Split(color, key)
        if comm == MPI.COMM_NULL:
            return None
        transport = MpiTransport(comm)
        comm.Free()
        return transport

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.MPI.Is_finalized():
            if self.abort_request is not None:
                self.abort_request.Cancel()
                self.abort_request.Wait()
            for comm in (self.collective_comm, self.p2p_comm, self.abort_comm):
                comm.Free()
