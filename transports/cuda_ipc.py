"""The `cuda_ipc` transport: processes on one machine moving GPU buffers through CUDA IPC.

Each rank allocates, once, one region of device memory holding an inbound FIFO of `slots` slots of
`chunk_bytes` from every rank, and exports it with `cudaIpcGetMemHandle`; every peer opens it with
`cudaIpcOpenMemHandle` at setup, so a sender copies a chunk straight into its receiver's slot with
one device-to-device `cudaMemcpyAsync` (NCCL's P2P transport with its copy engine, "P2P/IPC").
The FIFO's control words (head, tail, a header per slot: tag, message bytes, offset, chunk bytes)
live in host shared memory, as in the `shm` transport, because the host is what matches messages.

Synchronisation is by CUDA events and stream order: a chunk's copy is queued on the calling
thread's current stream and an event recorded after it; the sender publishes the slot (bumps head)
only once that event has completed, so a receiver never sees a slot before its bytes are there. The
receiver queues its copy or reduction out of the slot (cupy kernels, on the device: the reduction
never passes through the host) on its stream, records an event, and frees the slot (bumps tail) once
that event has completed. Several slots in flight let copies, reductions and the host's bookkeeping
overlap, chunk by chunk, in both directions.

Host (numpy) buffers go through the inherited `shm` machinery, so one group carries both: a
collective's small host messages (all_to_all_v's counts, barrier tokens) and its device data.
Messages between a pair of ranks under one tag keep their order within each kind of buffer.

The current thread's cupy device must be the transport's (`COLLS_CUDA_DEVICE`, else the rank modulo
the number of devices, chosen when the world is made). A process that forks ranks (`colls.spawn`)
must not have initialised CUDA before it forks.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from collections.abc import Sequence

import numpy as np

from .base import Capabilities, Exchange, Reducer, Request, Transport
from .errors import TransportError
from .segment import Segment
from .shm import ShmOptions, ShmTransport, chunk_mismatch, serve_stashed, shm_group, take_posted
from .shm.fifo import Fifo, fifo_bytes
from .shm.options import DEFAULT_OPTIONS

MiB = 1 << 20
DEFAULT_SLOTS = 4
MAX_CHUNK_BYTES = 32 * MiB    # one chunk's copy (~10 us on an H200) outlasts the host's work per chunk
MIN_CHUNK_BYTES = 1 * MiB
HANDLE_BYTES = 64             # sizeof(cudaIpcMemHandle_t)
MEMCPY_DEVICE_TO_DEVICE = 3   # cudaMemcpyDeviceToDevice


def import_cupy():
    """cupy, or a TransportError that says how to get it."""
    try:
        import cupy
    except ImportError as error:
        raise TransportError("the cuda_ipc transport needs cupy on a machine with an NVIDIA GPU: "
                             "pip install cupy-cuda12x (or cupy-cuda13x)") from error
    return cupy


def device_geometry(size: int, device_bytes: int, slots: int = DEFAULT_SLOTS,
                    chunk_bytes: int = 0) -> tuple[int, int]:
    """(chunk_bytes, slots) for a group of `size` on a device of `device_bytes`: 4 slots of at most
    32 MiB from each rank, the whole inbound region at most 1/64 of the device's memory (an H200's
    141 GB gives 32 MiB chunks to 4 ranks; a 16 GB card 15 MiB). `chunk_bytes` > 0 and `slots`
    override it.

    Raises:
        TransportError: a chunk size not a multiple of 4096, or fewer than one slot.
    """
    if chunk_bytes <= 0:
        share = device_bytes // (64 * max(size, 1) * max(slots, 1))
        chunk_bytes = max(MIN_CHUNK_BYTES, min(MAX_CHUNK_BYTES, share)) // MiB * MiB
    if slots < 1 or chunk_bytes < 4096 or chunk_bytes % 4096:
        raise TransportError(f"cuda_ipc: device_chunk_bytes must be a multiple of 4096 (got "
                             f"{chunk_bytes}) and device_slots at least 1 (got {slots})")
    return chunk_bytes, slots


def chunk_step(chunk_bytes: int, itemsize: int) -> int:
    """The bytes a sender puts in one slot: whole elements only, so that a receive-reduce can view
    every chunk as the message's dtype (a 12-byte structured element does not divide 32 MiB)."""
    return max(chunk_bytes // itemsize, 1) * itemsize if itemsize <= chunk_bytes else 0


def pack_entry(pid: int, device: int, chunk_bytes: int, slots: int, handle: bytes, segment: str) -> bytes:
    """One rank's setup entry: its pid, device, geometry, IPC handle and control segment's name."""
    if len(handle) != HANDLE_BYTES:
        raise TransportError(f"cuda_ipc: an IPC handle is {HANDLE_BYTES} B, got {len(handle)}")
    return struct.pack("<qqqq", pid, device, chunk_bytes, slots) + handle + segment.encode()


def unpack_entry(entry: bytes) -> tuple[int, int, int, int, bytes, str]:
    """`pack_entry`'s fields back: (pid, device, chunk_bytes, slots, handle, segment name)."""
    pid, device, chunk_bytes, slots = struct.unpack("<qqqq", entry[:32])
    return pid, device, chunk_bytes, slots, entry[32:32 + HANDLE_BYTES], entry[32 + HANDLE_BYTES:].decode()


class _DeviceOut(Request):
    __slots__ = ("pointer", "pos", "step")

    def __init__(self, peer: int, tag: int, buf, step: int) -> None:
        super().__init__("send", peer, tag, buf.nbytes)
        self.pointer = buf.data.ptr
        self.pos = 0
        self.step = step       # bytes per chunk: whole elements of the buffer's dtype


class _DeviceIn(Request):
    __slots__ = ("buf", "bytes", "reducer", "pos", "stash")

    def __init__(self, peer: int, tag: int, buf, reducer: Reducer | None, stash: bool = False) -> None:
        super().__init__("recv", peer, tag, buf.nbytes)
        self.buf = buf
        self.bytes = buf.reshape(-1).view(np.uint8) if buf.nbytes else buf
        self.reducer = reducer
        self.pos = 0
        self.stash = stash


class CudaIpcTransport(ShmTransport):
    """One process's end of a group moving cupy buffers by CUDA IPC (and numpy ones as `shm` does)."""

    name = "cuda_ipc"
    capabilities = Capabilities(device_buffers=True)
    SETUP_ROUNDS = ShmTransport.SETUP_ROUNDS + 3

    def __init__(self, rank: int, size: int, exchange: Exchange, options: ShmOptions = DEFAULT_OPTIONS,
                 device: int | None = None, device_slots: int = DEFAULT_SLOTS,
                 device_chunk_bytes: int = 0) -> None:
        """Collective over the group: the host side as `ShmTransport`, then each rank's device region.

        Args:
            rank, size, exchange, options: as `ShmTransport`'s.
            device: the GPU this rank uses (None: rank modulo the GPUs visible).
            device_slots, device_chunk_bytes: the device FIFOs' geometry (`device_geometry`).

        Raises:
            TransportError: cupy missing, or a bad geometry.
        """
        cupy = import_cupy()
        self.cupy = cupy
        runtime = cupy.cuda.runtime
        if device is None:
            device = rank % max(runtime.getDeviceCount(), 1)
        self.device = device
        self.device_options = (device_slots, device_chunk_bytes)
        runtime.setDevice(device)
        self.job = options.job
        super().__init__(rank, size, exchange, options)   # the host side: numpy messages, aborts, liveness
        self.opened: list[int] = []
        self.control: Segment | None = None
        try:
            self._connect(exchange)
        except BaseException:
            self.close()
            raise

    def _connect(self, exchange: Exchange) -> None:
        cupy, rank, size = self.cupy, self.rank, self.size
        runtime = cupy.cuda.runtime
        # round 1: every rank proposes a geometry for its device; the group takes the smallest
        free, _total = runtime.memGetInfo()
        proposal = device_geometry(size, free, *self.device_options)
        table = exchange(struct.pack("<qq", *proposal))
        self.device_chunk = min(struct.unpack("<qq", entry)[0] for entry in table)
        self.device_slots = min(struct.unpack("<qq", entry)[1] for entry in table)
        chunk, slots = self.device_chunk, self.device_slots
        region = slots * chunk                        # one sender's FIFO in my device memory
        self.memory = cupy.cuda.memory.Memory(size * region)  # cudaMalloc: its IPC handle is its own base
        self.inbound_slots = cupy.ndarray((size, slots, chunk), cupy.uint8,
                                          cupy.cuda.MemoryPointer(self.memory, 0))
        control_bytes = fifo_bytes(0, slots)
        self.control = Segment.create(control_bytes * size, self.job)
        # round 2: handles and control segments; each rank opens every peer's region and segment
        handle = bytes(runtime.ipcGetMemHandle(self.memory.ptr))
        table = exchange(pack_entry(os.getpid(), self.device, chunk, slots, handle, self.control.name))
        self.peer_controls: list[Segment] = []
        self.peer_regions: list[int] = []
        try:
            for peer, entry in enumerate(table):
                _pid, peer_device, peer_chunk, peer_slots, peer_handle, name = unpack_entry(entry)
                if (peer_chunk, peer_slots) != (chunk, slots):
                    raise TransportError(f"cuda_ipc: rank {peer} uses {peer_slots} slots of {peer_chunk} B, "
                                         f"rank {rank} {slots} of {chunk} B")
                if peer == rank:
                    self.peer_controls.append(self.control)
                    self.peer_regions.append(self.memory.ptr)
                    continue
                self.peer_controls.append(Segment.attach(name, control_bytes * size))
                try:
                    pointer = runtime.ipcOpenMemHandle(peer_handle, runtime.cudaIpcMemLazyEnablePeerAccess)
                except Exception as error:   # cupy's CUDARuntimeError: another device, no peer access
                    raise TransportError(f"cuda_ipc: rank {rank} (device {self.device}) cannot open the IPC "
                                         f"memory of rank {peer} (device {peer_device}): {error}") from error
                self.opened.append(pointer)
                self.peer_regions.append(pointer)
            exchange(b"mapped")   # round 3: every region and segment is open; names can go
        finally:
            self.control.unlink()
        # device_inbound[p]: the FIFO from p (my segment, my memory); device_outbound[p]: the FIFO
        # to p (p's segment; p's memory at `device_targets[p]`)
        self.device_inbound = [Fifo(self.control.array, p * control_bytes, 0, slots) for p in range(size)]
        self.device_outbound = [Fifo(self.peer_controls[p].array, rank * control_bytes, 0, slots)
                                for p in range(size)]
        self.device_targets = [self.peer_regions[p] + rank * region for p in range(size)]
        self.device_sources = [self.memory.ptr + p * region for p in range(size)]
        self.device_sends: list[deque[_DeviceOut]] = [deque() for _ in range(size)]
        self.copying: list[deque] = [deque() for _ in range(size)]    # (event, send, last) per chunk
        self.issued = [0] * size           # chunks whose copy I queued, per peer (>= published)
        self.published = [0] * size        # chunks I published (head), per peer
        self.device_posted: list[list[_DeviceIn]] = [[] for _ in range(size)]
        self.device_current: list[_DeviceIn | None] = [None] * size
        self.device_stashed: list[list[_DeviceIn]] = [[] for _ in range(size)]
        self.consuming: list[deque] = [deque() for _ in range(size)]  # (event, request, last) per chunk
        self.taken = [0] * size            # chunks I queued the consumption of, per peer (>= freed)
        self.freed = [0] * size            # chunks I freed (tail), per peer
        self.device_out: set[int] = set()
        self.device_in: set[int] = set()
        self.spare_events: list = []

    # -- posting ---------------------------------------------------------------------------------

    def _on_device(self, buf, what: str) -> bool:
        """Whether `buf` is a device buffer (else numpy, for the host side); TypeError otherwise."""
        if type(buf) is np.ndarray:
            return False
        if not isinstance(buf, self.cupy.ndarray) or buf.ndim != 1 or not buf.flags.c_contiguous:
            raise TypeError(f"{what} needs a 1-D C-contiguous numpy or cupy array, got "
                            f"{type(buf).__name__} {getattr(buf, 'shape', '')}")
        if buf.device.id != self.device:
            raise TypeError(f"{what}: rank {self.rank}'s buffer is on device {buf.device.id}; this "
                            f"transport moves buffers of device {self.device}")
        self._use_device()
        return True

    def _use_device(self) -> None:
        """Make the transport's device the calling thread's (cupy's current device is per thread: an
        async call runs on the communicator's worker thread, whose device is 0 until set)."""
        runtime = self.cupy.cuda.runtime
        if runtime.getDevice() != self.device:
            runtime.setDevice(self.device)

    def isend(self, buf, peer: int, tag: int) -> Request:
        if not self._on_device(buf, "cuda_ipc send"):
            return super().isend(buf, peer, tag)
        request = _DeviceOut(peer, tag, buf, chunk_step(self.device_chunk, buf.dtype.itemsize))
        if request.step == 0 and buf.nbytes:
            raise TypeError(f"cuda_ipc send: elements of {buf.dtype.itemsize} B do not fit one "
                            f"{self.device_chunk} B slot")
        self.device_sends[peer].append(request)
        self.device_out.add(peer)
        self._device_push(peer)
        return request

    def irecv(self, buf, peer: int, tag: int) -> Request:
        if not self._on_device(buf, "cuda_ipc receive"):
            return super().irecv(buf, peer, tag)
        return self._device_post(_DeviceIn(peer, tag, buf, None))

    def irecv_reduce(self, buf, peer: int, tag: int, reducer: Reducer) -> Request:
        if not self._on_device(buf, "cuda_ipc receive-reduce"):
            return super().irecv_reduce(buf, peer, tag, reducer)
        return self._device_post(_DeviceIn(peer, tag, buf, reducer))

    def _device_post(self, request: _DeviceIn) -> Request:
        self.device_posted[request.peer].append(request)
        self.device_in.add(request.peer)
        self._serve_device_stash(request.peer)
        return request

    def sendrecv(self, send_buf, dst: int, recv_buf, src: int, tag: int, deadline: float,
                 reducer: Reducer | None = None) -> None:
        if all(buf is None or type(buf) is np.ndarray for buf in (send_buf, recv_buf)):
            return super().sendrecv(send_buf, dst, recv_buf, src, tag, deadline, reducer)
        return Transport.sendrecv(self, send_buf, dst, recv_buf, src, tag, deadline, reducer)

    # -- progress --------------------------------------------------------------------------------

    def progress(self) -> bool:
        moved = super().progress()
        if self.device_out or self.device_in:
            self._use_device()
            for peer in tuple(self.device_out):
                moved |= self._device_push(peer)
            for peer in tuple(self.device_in):
                moved |= self._device_pull(peer)
        return moved

    def _event(self):
        """An event recorded now on the current stream (from a pool: creating one costs)."""
        event = self.spare_events.pop() if self.spare_events else self.cupy.cuda.Event(
            block=False, disable_timing=True)
        event.record()
        return event

    def _retire(self, pending: deque, count: int, control: np.ndarray, word: int) -> tuple[int, list]:
        """Pop the chunks at the front of `pending` whose events have completed (in order: they
        ran on one stream), counting each into `control[word]` (a sender's head, a receiver's
        tail); returns the new count and the requests whose last chunk was among them."""
        finished = []
        while pending and pending[0][0].done:
            event, request, last = pending.popleft()
            self.spare_events.append(event)
            count += 1
            control[word] = count
            if last:
                finished.append(request)
        return count, finished

    def _device_push(self, peer: int) -> bool:
        """Publish the chunks to `peer` whose copies have completed, then queue copies of queued
        sends into as many of its free slots as there are."""
        fifo, copying = self.device_outbound[peer], self.copying[peer]
        before = self.published[peer]
        # head: the bytes are in the slot, the receiver may read it
        self.published[peer], finished = self._retire(copying, before, fifo.control, 0)
        for send in finished:
            send.done = True
        moved = self.published[peer] > before
        queue, issued = self.device_sends[peer], self.issued[peer]
        slots, chunk = self.device_slots, self.device_chunk
        if queue:
            tail = int(fifo.control[8])
            runtime, stream = self.cupy.cuda.runtime, self.cupy.cuda.get_current_stream().ptr
            while queue and issued - tail < slots:
                send = queue[0]
                slot = issued % slots
                n = min(send.step, send.nbytes - send.pos)
                fifo.headers[slot] = (send.tag, send.nbytes, send.pos, n)
                if n:
                    runtime.memcpyAsync(self.device_targets[peer] + slot * chunk, send.pointer + send.pos, n,
                                        MEMCPY_DEVICE_TO_DEVICE, stream)
                send.pos += n
                issued += 1
                last = send.pos >= send.nbytes
                copying.append((self._event(), send, last))
                if last:
                    queue.popleft()
                moved = True
            self.issued[peer] = issued
        if not queue and not copying:
            self.device_out.discard(peer)
        return moved

    def _device_pull(self, peer: int) -> bool:
        """Free the slots from `peer` whose contents have been consumed, then queue the consumption
        (a copy or a reduction, on the device) of the chunks it has published since."""
        fifo, consuming = self.device_inbound[peer], self.consuming[peer]
        before = self.freed[peer]
        # tail: the slot is free, the sender may overwrite it
        self.freed[peer], finished = self._retire(consuming, before, fifo.control, 8)
        for request in finished:
            request.done = True
            if request.stash:
                self._serve_device_stash(peer)
        moved = self.freed[peer] > before
        taken, head = self.taken[peer], int(fifo.control[0])
        while taken < head:
            slot = taken % self.device_slots
            tag, message_bytes, offset, n = fifo.headers[slot].tolist()
            request = self.device_current[peer]
            if request is None:
                request = self._device_match(peer, tag, message_bytes)
                if request is None:
                    break                        # nobody wants it yet: leave it in the FIFO
                self.device_current[peer] = request
            if (offset != request.pos or n < 0 or n > self.device_chunk or offset + n > message_bytes
                    or message_bytes != request.nbytes or tag != request.tag):
                raise chunk_mismatch(self.rank, peer, request, (tag, message_bytes, offset, n))
            if n:
                self._consume(peer, slot, request, n)
            request.pos += n
            taken += 1
            last = request.pos >= request.nbytes
            consuming.append((self._event(), request, last))
            if last:
                self.device_current[peer] = None
            moved = True
        self.taken[peer] = taken
        if not consuming and not self.device_posted[peer] and self.device_current[peer] is None:
            self.device_in.discard(peer)
        return moved

    def _consume(self, peer: int, slot: int, request: _DeviceIn, n: int) -> None:
        """Queue the copy or reduction of `n` bytes of slot `slot` from `peer` into `request`."""
        if request.reducer is None:
            self.cupy.cuda.runtime.memcpyAsync(
                request.buf.data.ptr + request.pos, self.device_sources[peer] + slot * self.device_chunk, n,
                MEMCPY_DEVICE_TO_DEVICE, self.cupy.cuda.get_current_stream().ptr)
            return
        dtype = request.buf.dtype
        target = request.bytes[request.pos:request.pos + n].view(dtype)
        request.reducer(target, self.inbound_slots[peer, slot, :n].view(dtype))

    def _device_match(self, peer: int, tag: int, message_bytes: int) -> _DeviceIn | None:
        """The earliest posted device receive for a new message with `tag`; a stash (a device buffer
        of its own) when receives wait for other tags, so that the FIFO keeps moving."""
        posted = self.device_posted[peer]
        request = take_posted(posted, self.rank, peer, tag, message_bytes)
        if request is not None or not posted:
            return request
        stash = _DeviceIn(peer, tag, self.cupy.empty(message_bytes, self.cupy.uint8), None, stash=True)
        self.device_stashed[peer].append(stash)
        return stash

    def _serve_device_stash(self, peer: int) -> None:
        """Complete posted device receives from fully stashed messages with their tag, oldest first
        (the rare path: point-to-point messages taken out of tag order)."""
        if not self.device_stashed[peer]:
            return

        def deliver(request: _DeviceIn, stash: _DeviceIn) -> None:
            if request.nbytes:
                if request.reducer is None:
                    request.bytes[...] = stash.buf
                else:
                    request.reducer(request.buf, stash.buf.view(request.buf.dtype))
                self.cupy.cuda.get_current_stream().synchronize()
            request.pos = request.nbytes
            request.done = True

        serve_stashed(self.device_stashed[peer], self.device_posted[peer], self.rank, peer, deliver)

    # -- groups and teardown ---------------------------------------------------------------------

    def subgroup(self, ranks: Sequence[int], exchange: Exchange) -> Transport | None:
        slots, chunk_bytes = self.device_options
        return shm_group(self.rank, ranks, exchange, CudaIpcTransport, options=self.options,
                         device=self.device, device_slots=slots, device_chunk_bytes=chunk_bytes)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if hasattr(self, "spare_events"):
                self.cupy.cuda.get_current_stream().synchronize()   # no copy of mine still in flight
            for pointer in self.opened:
                self.cupy.cuda.runtime.ipcCloseMemHandle(pointer)
        finally:
            self.opened = []
            self.inbound_slots = self.memory = None
            self.device_inbound = self.device_outbound = []
            for segment in getattr(self, "peer_controls", []):
                if segment is not self.control:
                    segment.close()
            if self.control is not None:
                self.control.close()
            super().close()
