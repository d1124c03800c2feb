"""How bytes move between ranks: one small interface (`base`), several transports behind it."""

from .base import (
    ANY_SOURCE,
    ANY_TAG,
    COLLECTIVE_TAG_BASE,
    Capabilities,
    Envelope,
    Exchange,
    Reducer,
    Request,
    Traffic,
    Transport,
)
from .errors import (
    CollectiveMismatch,
    CollectiveTimeout,
    CollsError,
    CommunicatorAborted,
    InvalidArgument,
    MessageTruncated,
    PeerLost,
    TransportError,
)

__all__ = [
    "ANY_SOURCE", "ANY_TAG", "COLLECTIVE_TAG_BASE", "Capabilities", "Envelope",
    "Exchange", "Reducer", "Request", "Traffic", "Transport",
    "CollectiveMismatch", "CollectiveTimeout", "CollsError", "CommunicatorAborted", "InvalidArgument",
    "MessageTruncated", "PeerLost",
    "TransportError",
]
