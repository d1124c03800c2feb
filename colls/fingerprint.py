"""Mismatch detection: every rank's description of a call, compared across the group.

As torch's ProcessGroupWrapper does under TORCH_DISTRIBUTED_DEBUG=DETAIL, each rank encodes what
it is about to call (kind, sequence number, dtype, count, root, op, algorithm) in eight integers and
all-gathers them *on the call's own number* before any data moves. Ranks that called different things
then all learn it at once and raise `CollectiveMismatch` naming each side, instead of one hanging
and another reading garbage. A rank that skipped the call never joins, so the others time out
naming it. On by COLLS_DEBUG=1 (it costs one small all-gather per call). Without it, each message's
tag carries a smaller fingerprint of the call, checked by the ranks that receive
(`transports.base.fingerprint`).
"""

from __future__ import annotations

import numpy as np

from algorithms import BUILTIN, names
from algorithms.allgather import ring_all_gather_phase
from algorithms.channel import Channel
from transports.base import COLLECTIVE_TAG_BASE, FP_MASK
from transports.errors import CollectiveMismatch

from .describe import Description

KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
         "all_to_all_v", "gather", "scatter", "barrier")
OPS = tuple(BUILTIN)
FIELDS = 8


def encode(description: Description, seq: int) -> np.ndarray:
    """Eight int64s that two ranks making the same call (number `seq`) agree on."""
    kind = KINDS.index(description.collective) if description.collective in KINDS else -1
    dtype = description.dtype.num if description.dtype is not None else -1
    op_name = None if description.op is None else description.op.name
    op = OPS.index(op_name) if op_name in OPS else (-2 if op_name else -1)
    catalogue = names(description.collective)
    name = description.algorithm.name
    algorithm = catalogue.index(name) if name in catalogue else -1
    root = -1 if description.root is None else description.root
    return np.array([kind, seq, dtype, description.count, root, op, algorithm, 0], np.int64)


def decode(fields: np.ndarray) -> str:
    """The call a fingerprint describes, as a user would write it."""
    kind, seq, dtype, count, root, op, algorithm, _ = (int(v) for v in fields)
    collective = KINDS[kind] if 0 <= kind < len(KINDS) else "?"
    parts = [f"count={count}"]
    if dtype >= 0:
        parts.append(f"dtype={_dtype_name(dtype)}")
    if root >= 0:
        parts.append(f"root={root}")
    if op >= 0:
        parts.append(f"op={OPS[op]}")
    elif op == -2:
        parts.append("op=<user Op>")
    catalogue = names(collective) if collective != "?" else []
    if 0 <= algorithm < len(catalogue):
        parts.append(f"algorithm={catalogue[algorithm]!r}")
    return f"#{seq} {collective}({', '.join(parts)})"


def _dtype_name(number: int) -> str:
    for code in np.typecodes["All"]:
        if np.dtype(code).num == number:
            return np.dtype(code).name
    return "structured" if number == np.dtype("V").num else f"<dtype {number}>"


def check(channel: Channel, description: Description, seq: int) -> None:
    """All-gather fingerprints on the call's tag; raise CollectiveMismatch on every rank if they differ."""
    size = channel.size
    # on the call's number without its fingerprint (`transports.base.FP_BITS`), so that ranks that
    # disagree still exchange theirs; not counted
    tag = channel.tag - ((channel.tag - COLLECTIVE_TAG_BASE) & FP_MASK)
    channel = Channel(channel.transport, tag, channel.deadline, channel.what)
    table = np.empty(size * FIELDS, np.int64)
    table[channel.rank * FIELDS:(channel.rank + 1) * FIELDS] = encode(description, seq)
    ring_all_gather_phase(channel, table, [i * FIELDS for i in range(size + 1)])
    rows = table.reshape(size, FIELDS)
    if (rows == rows[0]).all():
        return
    groups: dict[str, list[int]] = {}
    for rank in range(size):
        groups.setdefault(decode(rows[rank]), []).append(rank)
    sides = "; ".join(f"ranks {ranks} called {call}" for call, ranks in groups.items())
    raise CollectiveMismatch(f"rank {channel.rank}: the ranks disagree on call #{seq}: {sides}")
