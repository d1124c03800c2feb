"""The `shm` transport: processes on one machine exchanging messages through POSIX shared memory.

- `fifo`: a FIFO's layout in a segment, the requests, message matching;
- `options`: `ShmOptions` and the size thresholds that pick a message's protocol;
- `rendezvous`: reading a big message whole out of its sender (cross-memory attach, registered memory);
- `help`: rendezvous acks, and help copies (a waiting sender writes half of its big message);
- `matching`: which receive a message goes to (MPI's order, wildcards, sizes) and the probes;
- `transport`: `ShmTransport` itself (posting, the blocking `sendrecv`, progress, aborts) and `shm_group`.
"""

from .fifo import chunk_mismatch, serve_stashed, take_posted
from .options import (
    MAPPED_BYTES,
    ShmOptions,
    exchange_huge_bytes,
    exchange_rendezvous_bytes,
    fifo_geometry,
    rendezvous_bytes,
)
from .transport import ShmTransport, shm_group

__all__ = [
    "MAPPED_BYTES", "ShmOptions", "ShmTransport", "chunk_mismatch", "exchange_huge_bytes",
    "exchange_rendezvous_bytes", "fifo_geometry", "rendezvous_bytes", "serve_stashed", "shm_group",
    "take_posted",
]
