"""The synthetic next-token task: sequences that follow a hidden successor table, made from a seed.

Each token is followed by `successor[token]` with probability 1 - noise, else by a uniform draw, so
a model can learn the table and the loss falls from log(vocab) towards the noise floor. Batch `step`
depends only on (seed, step): every rank draws the same global batch and keeps its own rows.
"""

from __future__ import annotations

import numpy as np


def global_batch(seed: int, step: int, batch: int, seq_len: int, vocab: int,
                 noise: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, targets), each (batch, seq_len) int64: targets are the tokens shifted by one."""
    successor = np.random.default_rng([seed, 0]).permutation(vocab)
    rng = np.random.default_rng([seed, 1, step])
    sequence = np.empty((batch, seq_len + 1), np.int64)
    sequence[:, 0] = rng.integers(0, vocab, batch)
    for t in range(1, seq_len + 1):
        random = rng.integers(0, vocab, batch)
        follow = rng.random(batch) >= noise
        sequence[:, t] = np.where(follow, successor[sequence[:, t - 1]], random)
    return sequence[:, :-1], sequence[:, 1:]


def shard_rows(batch: int, size: int, rank: int) -> slice:
    """Rank `rank`'s rows of a global batch split as evenly as possible over `size` ranks."""
    base, extra = divmod(batch, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))
