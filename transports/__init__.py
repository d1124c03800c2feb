"""How bytes move between ranks: one small interface (`base`), several transports behind it."""

from .base import COLLECTIVE_TAG_BASE, Capabilities, Exchange, Reducer, Request, Traffic, Transport
from .errors import (
    CollectiveMismatch,
    CollectiveTimeout,
    CollsError,
    CommunicatorAborted,
    InvalidArgument,
    PeerLost,
    TransportError,
)

__all__ = [
    "COLLECTIVE_TAG_BASE", "Capabilities", "Exchange", "Reducer", "Request", "Traffic", "Transport",
    "CollectiveMismatch", "CollectiveTimeout", "CollsError", "CommunicatorAborted", "InvalidArgument",
    "PeerLost",
    "TransportError",
]
