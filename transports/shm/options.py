"""The shm transport's options and size thresholds: which protocol a message of a given size takes.

A message moves one of three ways (see the package docstring): through the receiver's FIFO slots
(two copies, pipelined chunk by chunk), by cross-memory attach (the receiver reads the sender's
buffer in one copy), or out of the receiver's mapping of the sender's registered memory. The
thresholds below choose among them by size; they are constants, not measurements read at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TransportError

ALIGN = 4096
PER_RANK_BUDGET = 16 << 20      # at most this much inbound FIFO per rank unless told otherwise
DEFAULT_CHUNK_BYTES = 256 << 10
NEVER = 1 << 62                 # a size no message reaches

# A plain send (not a sendrecv) of at least `rendezvous_bytes` goes by cross-memory attach: by default
# those that would fill the whole FIFO, at least this much. Below that the slots win although they
# copy twice: the two sides pipeline, and a process_vm_readv pins the sender's pages on every call.
MIN_RENDEZVOUS_BYTES = 64 << 10
# In a sendrecv both ranks copy at once, and the slots' copies stay in cache: where each rank has a
# core the FIFO wins up to a few MiB (plain) and further still for a reduction, which reads the
# peer's buffer in pieces.
EXCHANGE_RENDEZVOUS_BYTES = 4 << 20
REDUCE_EXCHANGE_RENDEZVOUS_BYTES = 16 << 20
# A plain sendrecv's message sent from transparent huge pages goes by cross-memory attach from here:
# the receiver's read then pins 512 times fewer pages.
EXCHANGE_HUGE_BYTES = 2 << 20
# A send from registered memory (`transports.registered`) goes by its region from here (the receiver
# maps it once and copies at memory speed); below, through the slots.
MAPPED_BYTES = 128 << 10
# A big plain collective message's sender writes half of it while its receiver reads the other
# half (`help`) from this size: two cores copy one message.
HELP_BYTES = 1 << 20
# An exchange's message sent from small pages into a buffer in huge pages goes by address from this
# size, written whole by its sender rather than read by its receiver (`help`): a process_vm_* call
# pins the other process's pages, 512 times fewer where they are huge.
PUSH_FROM_BYTES = 512 << 10
REDUCE_PIECE_BYTES = 256 << 10  # a rendezvous receive-reduce reads the sender's buffer in such pieces


@dataclass(frozen=True)
class ShmOptions:
    """How a shm group is set up; every rank of a group must pass the same, and subgroups inherit them.

    Attributes:
        slots: chunks in flight in each inbound FIFO.
        chunk_bytes: bytes a slot holds, a multiple of 64; 0: 256 KiB, shrunk so that a rank's inbound
            FIFOs fit in 16 MiB.
        cross_memory_attach: read big messages straight out of the sender (where the kernel allows).
        map_registered: map peers' registered memory (`colls.alloc`) where the kernel allows.
        mapped_bytes: a send from registered memory at least this large goes by its region.
        job: the name segments in /dev/shm carry (a launcher's job id); None: a random one.
    """

    slots: int = 4
    chunk_bytes: int = 0
    cross_memory_attach: bool = True
    map_registered: bool = True
    mapped_bytes: int = MAPPED_BYTES
    job: str | None = None


DEFAULT_OPTIONS = ShmOptions()


def fifo_geometry(size: int, options: ShmOptions = DEFAULT_OPTIONS) -> tuple[int, int]:
    """(chunk_bytes, slots) for a group of `size` ranks.

    Raises:
        TransportError: a chunk size not a multiple of 64, or fewer than one slot.
    """
    slots, chunk = options.slots, options.chunk_bytes
    if chunk <= 0:
        chunk = min(DEFAULT_CHUNK_BYTES, PER_RANK_BUDGET // (size * max(slots, 1)))
        chunk = max(16 << 10, chunk // ALIGN * ALIGN)
    if chunk % 64 or slots < 1:
        raise TransportError(f"shm: chunk_bytes must be a multiple of 64 and slots >= 1 "
                             f"(COLLS_SHM_CHUNK_BYTES, COLLS_SHM_SLOTS), got {chunk} and {slots}")
    return chunk, slots


def rendezvous_bytes(chunk: int, slots: int) -> int:
    """A plain send at least this large goes by cross-memory attach: one that would fill the FIFO."""
    return max(MIN_RENDEZVOUS_BYTES, chunk * slots)


def exchange_rendezvous_bytes(chunk: int, slots: int, reducing: bool = False,
                              shared_cores: bool = False) -> int:
    """A sendrecv's message at least this large goes by cross-memory attach (`reducing`: one whose
    receive is a reduction). Where ranks outnumber the cores (`shared_cores`), every message the
    FIFO cannot hold whole does (and at least a plain send's minimum): filling its slots twice has
    the two ranks take turns on a core, where one read does not (same-run A/B at 3 and 4 ranks on
    2 cores against the thresholds below: all_reduce of 4-8 MiB 1.11-1.43x, all_gather 1.21-1.22x,
    nowhere 10% slower)."""
    if shared_cores:
        return max(MIN_RENDEZVOUS_BYTES, chunk * slots + 1)
    reduce = REDUCE_EXCHANGE_RENDEZVOUS_BYTES if reducing else EXCHANGE_RENDEZVOUS_BYTES
    return max(rendezvous_bytes(chunk, slots), reduce)


def exchange_huge_bytes(chunk: int, slots: int, shared_cores: bool = False) -> int:
    """A plain sendrecv's message sent from huge pages at least this large goes by cross-memory
    attach; never above `exchange_rendezvous_bytes`."""
    return min(EXCHANGE_HUGE_BYTES, exchange_rendezvous_bytes(chunk, slots, shared_cores=shared_cores))
