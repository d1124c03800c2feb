"""Reading a big message whole out of its sender: the shm transport's rendezvous protocols.

Instead of a chunk, the sender publishes one header saying where its buffer is; the receiver copies
(or reduces) the message straight out of the sender and acks it, which completes the send. Two
ways, as MPICH's and Open MPI's shared-memory layers do for big messages:
- cross-memory attach (`transports.cma`): the sender's address, read with process_vm_readv;
- registered memory (`transports.registered`): the region's id and descriptor, which the receiver
  maps once (pidfd_getfd) and then reads with numpy at memory speed.
Each works only where every rank of the group may read or map every other (probed at setup).
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from .. import cma, registered
from ..base import process_alive
from ..errors import PeerLost, TransportError
from .fifo import In
from .options import REDUCE_PIECE_BYTES

MAPPED_CACHE = 8             # peers' regions a rank keeps mapped, per peer (the least recent goes)


class PeerMemory:
    """One rank's reads out of its peers' memory: by address, or through cached mappings of their
    registered regions. `lost(peer, message)` makes the error for a peer found dead."""

    def __init__(self, rank: int, pids: Sequence[int], lost: Callable[[int, str], PeerLost]) -> None:
        self.rank = rank
        self.pids = list(pids)
        self.lost = lost
        self.piece = np.empty(REDUCE_PIECE_BYTES, np.uint8)
        self.pidfds: dict[int, int] = {}   # per peer, opened when a registered message first comes
        self.regions: list[dict[int, np.ndarray]] = [{} for _ in pids]   # per peer: region id -> mapping

    def read(self, peer: int, request: In, address: int) -> None:
        """Copy (or reduce) the message of `request` out of `peer`'s memory at `address`.

        Raises:
            PeerLost: `peer` died meanwhile.
        """
        try:
            if request.reducer is None:
                cma.read(self.pids[peer], address, request.data)
            else:
                self._read_reducing(peer, request, address)
        except (ProcessLookupError, TransportError) as error:
            if not isinstance(error, ProcessLookupError):
                time.sleep(0.05)                 # a dying process may not look dead for a moment
                if process_alive(self.pids[peer]):
                    raise
            raise self.lost(peer, f"rank {peer} (pid {self.pids[peer]}) died while rank {self.rank} was "
                                  f"reading its {request.nbytes} B message") from error

    def _read_reducing(self, peer: int, request: In, address: int) -> None:
        """Read the message in pieces, each combined into the receive buffer while it is in cache."""
        dtype, piece = request.buf.dtype, self.piece
        step = REDUCE_PIECE_BYTES // dtype.itemsize * dtype.itemsize   # whole elements a piece
        if step == 0:   # an element bigger than a piece
            step, piece = dtype.itemsize, np.empty(dtype.itemsize, np.uint8)
        for start in range(0, request.nbytes, step):
            n = min(step, request.nbytes - start)
            cma.read(self.pids[peer], address + start, piece[:n])
            request.reducer(request.data[start:start + n].view(dtype), piece[:n].view(dtype))

    def read_mapped(self, peer: int, request: In, words: Sequence[int]) -> None:
        """Copy (or reduce) the message of `request` out of my mapping of `peer`'s registered region
        that `words` (region id, descriptor, offset, region bytes) locate."""
        source = self._mapped(peer, words, request.size)
        if request.reducer is None:
            np.copyto(request.data, source)
        else:
            dtype = request.buf.dtype
            request.reducer(request.data.view(dtype), source.view(dtype))

    def _mapped(self, peer: int, words: Sequence[int], nbytes: int) -> np.ndarray:
        """The `nbytes` that `words` locate, through my mapping of the region: made on first use,
        kept for the `MAPPED_CACHE` regions of the peer used last."""
        region_id, fd, offset, size = words
        regions = self.regions[peer]
        view = regions.pop(region_id, None)
        if view is None:
            view = self._map_region(peer, fd, size)
            if len(regions) >= MAPPED_CACHE:
                del regions[next(iter(regions))]   # the least recently used
        regions[region_id] = view                  # (re)inserted last: the most recent
        if not 0 <= offset <= view.shape[0] - nbytes:
            raise TransportError(f"rank {self.rank}: rank {peer} named {nbytes} B at offset {offset} "
                                 f"of a registered region of {view.shape[0]} B")
        return view[offset:offset + nbytes]

    def _map_region(self, peer: int, fd: int, size: int) -> np.ndarray:
        try:
            pidfd = self.pidfds.get(peer)
            if pidfd is None:
                pidfd = self.pidfds[peer] = registered.open_pidfd(self.pids[peer])
            return registered.map_peer(pidfd, fd, size)
        except OSError as error:
            if not process_alive(self.pids[peer]):
                raise self.lost(peer, f"rank {peer} (pid {self.pids[peer]}) died while rank {self.rank} "
                                      f"was mapping its registered memory") from error
            raise TransportError(f"rank {self.rank}: cannot map rank {peer}'s registered memory "
                                 f"(descriptor {fd}, {size} B): {error}") from error

    def close(self) -> None:
        """Drop the mappings and close the pidfds."""
        self.regions = [{} for _ in self.pids]
        for pidfd in self.pidfds.values():
            os.close(pidfd)
        self.pidfds = {}


def probe_region(enabled: bool) -> np.ndarray | None:
    """A registered int64 holding my pid, for peers to map (`probe_mapping`); None if registered
    memory cannot be made here or is not `enabled`."""
    if not enabled:
        return None
    try:
        probe = registered.alloc(1, np.int64)
    except TransportError:
        return None
    probe[0] = os.getpid()
    return probe


def probe_mapping(pid: int, fd: int) -> bool:
    """Whether this process can map process `pid`'s registered memory (its probe at `fd`)."""
    if fd < 0:
        return False
    try:
        pidfd = registered.open_pidfd(pid)
        try:
            view = registered.map_peer(pidfd, fd, mmap.PAGESIZE)
        finally:
            os.close(pidfd)
        return int(view[:8].view(np.int64)[0]) == pid
    except (OSError, AttributeError, ValueError):
        return False
