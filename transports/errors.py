"""The exceptions every layer of colls raises; `colls` re-exports them.

They live at the bottom of the dependency chain (`colls` -> `algorithms` -> `transports`) so that a
transport can raise the same `CollectiveTimeout` a user catches from `comm.all_reduce`.
"""

from __future__ import annotations


class CollsError(RuntimeError):
    """Base class of every error colls raises about communication (not about arguments)."""


class CollectiveTimeout(CollsError):
    """A blocking wait passed its deadline; the message names the operation and the silent peers."""

    def __init__(self, message: str, peers: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.peers = peers


class PeerLost(CollsError):
    """A peer rank died or closed its end while this rank was waiting on it."""

    def __init__(self, message: str, peer: int) -> None:
        super().__init__(message)
        self.peer = peer


class CommunicatorAborted(CollsError):
    """`comm.abort()` was called on some rank; every call blocked on that communicator is released."""


class CollectiveMismatch(CollsError):
    """Ranks called different collectives, or the same one with different counts, dtypes or roots."""


class MessageTruncated(CollsError):
    """A point-to-point message was longer than the buffer of the receive it matched (MPI_ERR_TRUNCATE).

    Raised on the receiving rank only, by the wait for that receive; the message was consumed whole,
    so later calls on the communicator are not affected.
    """


class TransportError(CollsError):
    """A transport could not be set up or used (no room in /dev/shm, MPI missing, bad segment)."""


class InvalidArgument(ValueError):
    """A bad argument, found on this rank before any byte moved; the message names it and the rank."""
