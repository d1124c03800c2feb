"""Optimizers on flat buffers: Adam (Kingma & Ba 2015) and SGD with momentum.

Both are elementwise, so updating a shard of the flat buffer gives bit for bit what updating the
whole buffer gives on those elements: the property ZeRO's sharded optimizer step relies on
(Rajbhandari et al. 2020). State is kept in `state_dtype` (float32 for mixed precision, the K = 12
bytes per parameter of the ZeRO paper being fp32 master weights + Adam's two moments).
"""

from __future__ import annotations

import numpy as np


class Adam:
    """Adam with bias correction; `step(params, grads)` updates `params` in place."""

    def __init__(self, size: int, lr: float = 1e-2, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, state_dtype=np.float64, xp=np) -> None:
        self.lr, self.betas, self.eps = lr, betas, eps
        self.m = xp.zeros(size, state_dtype)   # xp: numpy, or cupy for state on a GPU
        self.v = xp.zeros(size, state_dtype)
        self.t = 0

    @property
    def state_arrays(self) -> list[np.ndarray]:
        """The arrays that make up the optimizer state (for the memory accounting)."""
        return [self.m, self.v]

    def step(self, params: np.ndarray, grads: np.ndarray) -> None:
        """One update of `params` (in place) from `grads`."""
        beta1, beta2 = self.betas
        self.t += 1
        self.m *= beta1
        self.m += (1 - beta1) * grads
        self.v *= beta2
        self.v += (1 - beta2) * grads * grads
        m_hat = self.m / (1 - beta1 ** self.t)
        v_hat = self.v / (1 - beta2 ** self.t)
        params -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


class SGD:
    """SGD with (optional) heavy-ball momentum."""

    def __init__(self, size: int, lr: float = 1e-1, momentum: float = 0.9, state_dtype=np.float64,
                 xp=np) -> None:
        self.lr, self.momentum = lr, momentum
        self.velocity = xp.zeros(size if momentum else 0, state_dtype)

    @property
    def state_arrays(self) -> list[np.ndarray]:
        """The arrays that make up the optimizer state."""
        return [self.velocity]

    def step(self, params: np.ndarray, grads: np.ndarray) -> None:
        """One update of `params` (in place) from `grads`."""
        if self.momentum:
            self.velocity *= self.momentum
            self.velocity += grads
            params -= self.lr * self.velocity
        else:
            params -= self.lr * grads


def make_optimizer(name: str, size: int, lr: float | None = None, state_dtype=np.float64, xp=np):
    """'adam' or 'sgd' over `size` elements (default learning rates 1e-2 and 1e-1), state made by
    `xp` (numpy, or cupy on a GPU)."""
    if name == "adam":
        return Adam(size, 1e-2 if lr is None else lr, state_dtype=state_dtype, xp=xp)
    if name == "sgd":
        return SGD(size, 1e-1 if lr is None else lr, state_dtype=state_dtype, xp=xp)
    raise ValueError(f"optimizer {name!r}: choose 'adam' or 'sgd'")
