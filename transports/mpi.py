"""The `mpi` transport: mpi4py's buffer methods (`Isend`/`Irecv` on raw bytes), never pickle.

Collectives, the user's point-to-point messages and colls' own (tags from RESERVED_TAG_BASE, sent
there with the tag less that base) travel on three duplicates of the communicator, so a user's tag
(or ANY_TAG) can never match a collective's or a reserved one. A synchronous send is MPI_Issend. A
fused receive-reduce lands in a scratch buffer taken from a pool that grows to the largest message
once and is then reused, and is reduced on completion.

Point-to-point semantics are MPI's own: ANY_SOURCE and ANY_TAG are MPI's (the user's tags have a
communicator of their own, so ANY_TAG never matches a collective's message), a shorter message's
count comes from the status, a longer one fails only its receive (MPI_ERR_TRUNCATE, raised as
MessageTruncated; MPI has consumed it), and probes are MPI_Iprobe/MPI_Improbe. Several threads may
share a transport: each progress pass, probe and receive-reduce holds one lock per transport (our
status, scratch buffers and requests are shared), released while a wait backs off; where MPI gives
less than MPI_THREAD_MULTIPLE one lock for all transports is held by every call into MPI.

A rank of this host that dies is seen through /proc (a long wait polls every POLL_SECONDS) and named in
a PeerLost on every survivor; why that needs `colls run --transport mpi` (or its mpiexec options) under
MPICH's Hydra is in docs/reliability.md.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import socket
import threading
import time
from collections.abc import Sequence

import numpy as np

from .base import (
    ANY_SOURCE,
    ANY_TAG,
    COLLECTIVE_TAG_BASE,
    RESERVED_TAG_BASE,
    Backoff,
    Capabilities,
    Envelope,
    Exchange,
    Reducer,
    Request,
    Transport,
    check_buffer,
    process_alive,
    timeout_error,
)
from .errors import CollectiveMismatch, MessageTruncated, PeerLost, TransportError

_MPI = None
ABORT_NOTICE_BYTES = 512   # an abort notice: the reason, UTF-8, zero-padded
LOSS_TAG = 1               # on the abort context: "rank N has died", from the first rank to see it
POLL_SECONDS = 0.1         # how often a long wait checks for abort notices and dead local peers
_finalize_barrier_off = False
# transports not closed yet: at exit each is closed before MPI finalizes (mpi4py finalizes after
# every atexit callback), or the notice receives it keeps posted stay open into MPI_Finalize, where
# UCX prints a warning per receive (a sub-group the program never closed, as torch users never
# destroy theirs)
_open: dict[int, MpiTransport] = {}
# the lock every transport shares where MPI is not MPI_THREAD_MULTIPLE (one thread in MPI at a time)
_SERIALIZED = threading.RLock()


def _close_open_transports() -> None:
    for transport in list(_open.values()):
        transport.close()


atexit.register(_close_open_transports)


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


def _mapped_files() -> set[str]:
    """The paths of the files this process has mapped, from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as maps:
            rows = [line.split(None, 5) for line in maps]
    except OSError:
        return set()
    return {fields[5].strip() for fields in rows if len(fields) == 6}


def unlink_mpich_init_segments() -> None:
    """Remove the names of the MPICH segments this process has mapped (/dev/shm/mpich_shm_*).

    Every rank on the host maps them inside MPI_Init, and MPICH unlinks them only in MPI_Finalize,
    so a job whose ranks die by SIGKILL (Hydra kills them all when one dies) leaves a few MB behind.
    Once MPI_Init has returned the name is never used again: unlink it now, as shm does ours."""
    for path in _mapped_files():
        path = path.removesuffix(" (deleted)")
        if path.startswith("/dev/shm/mpich_shm_"):
            try:
                os.unlink(path)
            except OSError:
                pass   # another rank of the host was first


def finalize_without_barrier(MPI) -> bool:
    """Let MPI_Finalize return without waiting for every rank; False where the library can't.

    MPICH's UCX finalize hook waits in a PMI barrier for all ranks, which a dead rank never joins, so
    a survivor would hang at exit. MPIR_CVAR_NO_COLLECTIVE_FINALIZE turns the barrier off; it is set
    here, at run time through MPI_T (which mpi4py does not wrap), only once a peer is known dead."""
    global _finalize_barrier_off
    if _finalize_barrier_off:
        return True
    libraries = [path for path in _mapped_files() if re.search(r"/libmpi(_abi)?\.so", path)]
    if not libraries:
        return False
    try:
        library = ctypes.CDLL(libraries[0])
        provided, index, count, handle = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
        if library.MPI_T_init_thread(MPI.THREAD_SINGLE, ctypes.byref(provided)) != 0:
            return False
        try:
            if (library.MPI_T_cvar_get_index(b"MPIR_CVAR_NO_COLLECTIVE_FINALIZE", ctypes.byref(index)) != 0
                    or library.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle),
                                                       ctypes.byref(count)) != 0):
                return False
            _finalize_barrier_off = library.MPI_T_cvar_write(handle, ctypes.byref(ctypes.c_int(1))) == 0
            library.MPI_T_cvar_handle_free(ctypes.byref(handle))
        finally:
            library.MPI_T_finalize()
    except (OSError, AttributeError):   # not MPICH, or an MPI without MPI_T
        return False
    return _finalize_barrier_off


class _MpiRequest(Request):
    __slots__ = ("handle", "buf", "scratch", "reducer", "message_bytes")

    def __init__(self, kind: str, peer: int, tag: int, buf: np.ndarray) -> None:
        super().__init__(kind, peer, tag, buf.nbytes)
        self.handle = None
        self.buf = buf
        self.scratch: np.ndarray | None = None
        self.reducer: Reducer | None = None
        self.message_bytes: int | None = None   # the message's size, where known before it arrives (mrecv)


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
    capabilities = Capabilities(spin_polls=Backoff.SPIN_POLLS)   # `wait_all` polls MPI_Testall so

    def __init__(self, comm=None) -> None:
        MPI = import_mpi()
        self.MPI = MPI
        base = comm if comm is not None else MPI.COMM_WORLD
        self.collective_comm = base.Dup()
        self.p2p_comm = base.Dup()
        self.reserved_comm = base.Dup()   # colls' own point-to-point tags, less RESERVED_TAG_BASE
        # a third context only for abort notices: one receive from anyone, always posted
        self.abort_comm = base.Dup()
        self.abort_notice = np.zeros(ABORT_NOTICE_BYTES, np.uint8)   # the aborter's reason, UTF-8
        self.abort_request = self.abort_comm.Irecv([self.abort_notice, MPI.BYTE], MPI.ANY_SOURCE, 0)
        # and one for loss notices: a survivor that raised PeerLost and exited looks dead too, so the
        # first to see a death names it to the others (as shm does in its headers)
        self.loss_notice = np.zeros(2, np.int64)   # [dead rank, rank that saw it]
        self.loss_request = self.abort_comm.Irecv([self.loss_notice, MPI.BYTE], MPI.ANY_SOURCE, LOSS_TAG)
        _open[id(self)] = self
        self.lost: tuple[int, int] | None = None   # (dead rank, who saw it), once known
        self.rank = base.Get_rank()
        self.size = base.Get_size()
        self.tag_limit = int(base.Get_attr(MPI.TAG_UB)) + 1
        self.user_tag_limit = self.tag_limit
        self.collective_tag_wrap = self.tag_limit   # (`_route`; see `Transport.check_fingerprints`)
        # pids of the ranks on this host, to tell a dead peer from a slow one (mpiexec may keep the
        # survivors running: -disable-auto-cleanup); exchanged once, pickled, off the data path
        host = socket.gethostname()
        table = base.allgather((host, os.getpid()))
        self.local_pids = {peer: pid for peer, (peer_host, pid) in enumerate(table) if peer_host == host}
        unlink_mpich_init_segments()   # every rank is past MPI_Init now, so all have mapped them
        self.scratch = ScratchPool()
        self.status = MPI.Status()
        # held for each progress pass (our status, scratch buffers and requests are shared); posting
        # a send or receive shares nothing of ours, so it takes the lock only where MPI needs it
        self.serialized = MPI.Query_thread() < MPI.THREAD_MULTIPLE
        self.lock = _SERIALIZED if self.serialized else threading.RLock()
        self.closed = False

    def _route(self, tag: int):
        if tag >= COLLECTIVE_TAG_BASE:
            return self.collective_comm, (tag - COLLECTIVE_TAG_BASE) % self.tag_limit
        if tag >= RESERVED_TAG_BASE:
            if tag - RESERVED_TAG_BASE >= self.tag_limit:
                raise ValueError(f"rank {self.rank}: reserved tag {tag} is past MPI's range: at most "
                                 f"RESERVED_TAG_BASE + {self.tag_limit - 1} (MPI_TAG_UB)")
            return self.reserved_comm, tag - RESERVED_TAG_BASE
        if tag == ANY_TAG:
            return self.p2p_comm, self.MPI.ANY_TAG
        if not 0 <= tag < self.tag_limit:
            raise ValueError(f"rank {self.rank}: tag {tag} is outside MPI's range 0..{self.tag_limit - 1}")
        return self.p2p_comm, tag

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "mpi send")
        comm, mpi_tag = self._route(tag)
        request = _MpiRequest("send", peer, tag, buf)
        if self.serialized:
            with self.lock:
                request.handle = comm.Isend([buf.view(np.uint8), self.MPI.BYTE], peer, mpi_tag)
        else:
            request.handle = comm.Isend([buf.view(np.uint8), self.MPI.BYTE], peer, mpi_tag)
        return request

    def issend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "mpi synchronous send")
        comm, mpi_tag = self._route(tag)
        request = _MpiRequest("send", peer, tag, buf)
        with self.lock:
            request.handle = comm.Issend([buf.view(np.uint8), self.MPI.BYTE], peer, mpi_tag)
        return request

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "mpi receive")
        comm, mpi_tag = self._route(tag)
        request = _MpiRequest("recv", peer, tag, buf)
        source = self.MPI.ANY_SOURCE if peer == ANY_SOURCE else peer
        if self.serialized:
            with self.lock:
                request.handle = comm.Irecv([buf.view(np.uint8), self.MPI.BYTE], source, mpi_tag)
        else:
            request.handle = comm.Irecv([buf.view(np.uint8), self.MPI.BYTE], source, mpi_tag)
        return request

    def irecv_reduce(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer) -> Request:
        check_buffer(buf, "mpi receive-reduce")
        comm, mpi_tag = self._route(tag)
        request = _MpiRequest("recv", peer, tag, buf)
        request.reducer = reducer
        with self.lock:
            request.scratch = self.scratch.take(buf.nbytes)
            landing = request.scratch[:buf.nbytes]
            request.handle = comm.Irecv([landing, self.MPI.BYTE], peer, mpi_tag)
        return request

    def iprobe(self, peer: int, tag: int) -> Envelope | None:
        comm, mpi_tag = self._route(tag)
        status = self.status
        with self.lock:
            if not comm.Iprobe(self.MPI.ANY_SOURCE if peer == ANY_SOURCE else peer, mpi_tag, status):
                return None
            return Envelope(status.Get_source(), status.Get_tag() if tag == ANY_TAG else tag,
                            status.Get_count(self.MPI.BYTE))

    def improbe(self, peer: int, tag: int) -> Envelope | None:
        comm, mpi_tag = self._route(tag)
        status = self.status
        with self.lock:
            message = comm.Improbe(self.MPI.ANY_SOURCE if peer == ANY_SOURCE else peer, mpi_tag, status)
            if message is None:
                return None
            return Envelope(status.Get_source(), status.Get_tag() if tag == ANY_TAG else tag,
                            status.Get_count(self.MPI.BYTE), message)

    def mrecv(self, buf: np.ndarray, message: Envelope) -> Request:
        check_buffer(buf, "mpi receive")
        handle = message.handle
        if not isinstance(handle, self.MPI.Message):
            raise ValueError(f"rank {self.rank}: mrecv needs a message improbe claimed and not yet "
                             f"received, got {message!r}")
        request = _MpiRequest("recv", message.source, message.tag, buf)
        request.message_bytes = message.nbytes
        message.handle = None   # received once only
        with self.lock:
            request.handle = handle.Irecv([buf.view(np.uint8), self.MPI.BYTE])
        return request

    def _test(self, request: _MpiRequest) -> bool:
        """Test one request (with the lock held); on completion check the size, fill in what a
        wildcard or shorter receive got, and apply a pending reduction."""
        status = self.status
        try:
            finished = request.handle.Test(status)
        except self.MPI.Exception as error:
            if error.Get_error_class() == self.MPI.ERR_TRUNCATE:
                return self._truncated(request)
            self._find_dead(error)             # MPI fails requests once a peer is gone: name it
            raise TransportError(f"rank {self.rank}: MPI failed the {request.kind} of {request.nbytes} B "
                                 f"with rank {request.peer}: {str(error).splitlines()[0]}") from error
        if not finished:
            return False
        if request.kind == "recv":
            got = status.Get_count(self.MPI.BYTE)
            if got != request.nbytes:
                if request.tag >= COLLECTIVE_TAG_BASE or request.reducer is not None:
                    raise CollectiveMismatch(
                        f"rank {self.rank} posted a receive of {request.nbytes} B from rank {request.peer} "
                        f"(tag {request.tag}) but rank {request.peer} sent {got} B")
                request.count = got
            if request.peer == ANY_SOURCE or request.tag == ANY_TAG:
                request.source, request.received_tag = status.Get_source(), status.Get_tag()
            if request.reducer is not None:
                scratch = request.scratch
                dtype = request.buf.dtype
                request.reducer(request.buf, scratch[:request.nbytes].view(dtype))
                self.scratch.give(scratch)
                request.scratch = None
        request.done = True
        return True

    def _truncated(self, request: _MpiRequest) -> bool:
        """A message longer than the receive's buffer: MPI consumed it and failed the receive. A
        point-to-point one completes the request with MessageTruncated (raised by the wait for it);
        in a collective it is a mismatch. MPI does not tell the message's size unless mrecv knew it."""
        status = self.status
        if request.tag >= COLLECTIVE_TAG_BASE or request.reducer is not None:
            raise CollectiveMismatch(
                f"rank {self.rank} posted a receive of {request.nbytes} B from rank {request.peer} "
                f"(tag {request.tag}) but a larger message arrived")
        source, tag = status.Get_source(), status.Get_tag() if request.tag == ANY_TAG else request.tag
        size = "longer than that" if request.message_bytes is None else f"of {request.message_bytes} B"
        request.error = MessageTruncated(
            f"rank {self.rank}: a message {size} from rank {source} (tag {tag}) does not fit the "
            f"receive buffer of {request.nbytes} B")
        request.source, request.received_tag = source, tag
        request.done = True
        return True

    def wait_all(self, requests: Sequence[Request], deadline: float) -> None:
        backoff = Backoff()
        next_abort_check = time.monotonic() + POLL_SECONDS
        lock = self.lock
        while True:
            progressed = False
            finished = True
            with lock:   # released while backing off, so other threads' calls go on meanwhile
                for request in requests:
                    if not request.done:
                        if not self._test(request):  # type: ignore[arg-type]
                            finished = False
                            continue
                        progressed = True
                    if request.error is not None:
                        raise request.error
            if finished:
                return
            if progressed:
                backoff.reset()
            now = time.monotonic()
            if now >= deadline:
                raise timeout_error(requests, deadline)
            if now >= next_abort_check:
                next_abort_check = now + POLL_SECONDS
                with lock:
                    self.check_fingerprints(requests)
                    self.check_aborted()
                    self._check_alive(requests)
            backoff.pause()

    def _unreceived(self, peer: int) -> list[int]:
        """`Transport._unreceived`: the earliest (MPI_Iprobe; call with the lock held)."""
        found = self.collective_comm.Iprobe(peer, self.MPI.ANY_TAG, self.status)
        return [COLLECTIVE_TAG_BASE + self.status.Get_tag()] if found else []

    def _find_dead(self, error: Exception) -> None:
        """After an MPI error: CommunicatorAborted if a peer aborted (a rank that failed inside a
        call aborts the group, and MPI may fail our request on its freed buffer first), PeerLost
        naming a local rank that has died, if one has."""
        for _ in range(10):                    # a killed rank takes a moment to look dead
            self.check_aborted()
            dead = self._dead_peer(set(range(self.size)))
            if dead is not None:
                raise self._lost(dead, f"rank {self.rank}'s MPI calls failed with: "
                                       f"{str(error).splitlines()[0]}") from error
            time.sleep(0.05)

    def _check_alive(self, requests: Sequence[Request]) -> None:
        """PeerLost if a local rank this wait depends on has died: the peer of a pending request,
        and in a collective any rank of the communicator (a survivor waiting on a live neighbour is,
        through it, waiting on the dead rank too, and would otherwise sit out the whole timeout)."""
        pending = [request for request in requests if not request.done]
        if any(request.tag >= COLLECTIVE_TAG_BASE or request.peer == ANY_SOURCE for request in pending):
            depends_on = set(range(self.size))
        else:
            depends_on = {request.peer for request in pending}
        dead = self._dead_peer(depends_on)
        if dead is not None:
            waited = next((r for r in pending if r.peer == dead), pending[0])
            raise self._lost(dead, f"rank {self.rank} was waiting for its {waited!r}")

    def _dead_peer(self, depends_on: set[int]) -> int | None:
        """The rank that has died, if one of `depends_on` has: the one a peer named in a loss notice
        when there is one (the rank we see dead may be a survivor that raised PeerLost and exited),
        else the one we see dead on this host."""
        seen = next((peer for peer, pid in self.local_pids.items()
                     if peer in depends_on and not process_alive(pid)), None)
        if self._heard_of_loss() is None and seen is not None:
            for _ in range(4):                 # a survivor's notice is sent before it exits
                time.sleep(0.02)
                if self._heard_of_loss() is not None:
                    break
        heard = self._heard_of_loss()
        if heard is not None and (seen is not None or heard in depends_on):
            return heard
        return seen

    def _heard_of_loss(self) -> int | None:
        """The dead rank a peer's loss notice named, once one has arrived."""
        if self.lost is None and self.loss_request is not None and self.loss_request.Test():
            self.loss_request = None
            self.lost = (int(self.loss_notice[0]), int(self.loss_notice[1]))
        return None if self.lost is None else self.lost[0]

    def _lost(self, peer: int, context: str) -> PeerLost:
        """The PeerLost for dead `peer`. The first time: tell the other ranks, and from now on let
        this process's MPI_Finalize skip the barrier that `peer` would never join."""
        if self.lost is None:
            self.lost = (peer, self.rank)
            self._loss_sent = np.array(self.lost, np.int64)   # kept alive; never waited: best effort
            for other in range(self.size):
                if other not in (self.rank, peer):
                    try:
                        self.abort_comm.Isend([self._loss_sent, self.MPI.BYTE], other, LOSS_TAG)
                    except self.MPI.Exception:
                        pass                   # that one is gone too
        finalize_without_barrier(self.MPI)
        dead, seen_by = self.lost
        witness = "" if seen_by == self.rank else f" (rank {seen_by} saw it)"
        pid = f" (pid {self.local_pids[dead]})" if dead in self.local_pids else ""
        return PeerLost(f"rank {dead}{pid} has died{witness}; {context}", dead)

    def abort(self, reason: str) -> None:
        self.aborted = reason
        notice = np.zeros(ABORT_NOTICE_BYTES, np.uint8)
        text = reason.encode()[:ABORT_NOTICE_BYTES]
        notice[:len(text)] = np.frombuffer(text, np.uint8)
        self._notice = notice   # kept alive for the sends, which are never waited: best effort
        with self.lock:
            for peer in range(self.size):
                if peer != self.rank:
                    self.abort_comm.Isend([notice, self.MPI.BYTE], peer, 0)

    def check_aborted(self) -> None:
        with self.lock:
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
        _open.pop(id(self), None)
        if not self.MPI.Is_finalized():
            for request in (self.abort_request, self.loss_request):
                if request is not None:
                    request.Cancel()
                    request.Wait()
            for comm in (self.collective_comm, self.p2p_comm, self.reserved_comm, self.abort_comm):
                comm.Free()
