"""colls: collective communication from scratch, over pluggable transports.

    comm = colls.init()
    y = comm.all_reduce(x, op=colls.SUM)
    h = comm.all_reduce_init(x, out=y)   # persistent: checked once, then h() or h.start(); h.wait()
"""

from algorithms import AVG, BAND, BOR, BXOR, MAX, MIN, PROD, SUM, Op
from algorithms import names as _names
from algorithms.registry import algorithm
from transports.base import ANY_SOURCE, ANY_TAG, Envelope
from transports.errors import (
    CollectiveMismatch,
    CollectiveTimeout,
    CollsError,
    CommunicatorAborted,
    InvalidArgument,
    MessageTruncated,
    PeerLost,
    TransportError,
)
from transports.registered import alloc

from .bootstrap import init
from .communicator import Communicator
from .executor import Work
from .persistent import Persistent
from .selection import explain
from .spawn import SpawnError, spawn

__version__ = "0.1.0"


def algorithms(collective: str) -> list[str]:
    """The names that `algorithm=` accepts for `collective` ("all_reduce", "broadcast", ...)."""
    return _names(collective)


__all__ = [
    "AVG", "BAND", "BOR", "BXOR", "MAX", "MIN", "PROD", "SUM", "Op",
    "CollectiveMismatch", "CollectiveTimeout", "CollsError", "CommunicatorAborted", "InvalidArgument",
    "PeerLost", "MessageTruncated", "ANY_SOURCE", "ANY_TAG", "Envelope",
    "TransportError", "Communicator", "Persistent", "Work", "SpawnError", "algorithm", "algorithms", "alloc",
    "explain", "init", "spawn",
]
