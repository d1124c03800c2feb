"""Forward and hand-written backward of the model's pieces: layer norm, GeLU, causal attention, loss.

Each `*_forward` returns its output and what its backward needs; each `*_backward` takes that and the
output's gradient. Written with numpy only, so the same code runs in float64 (exact checks) and
float32. The attention core works on whatever heads it is given, so tensor parallelism (Megatron-LM,
Shoeybi et al. 2019) can run it on its own slice of the heads.
"""

from __future__ import annotations

import math

import numpy as np

from colls.device import module_of

LAYER_NORM_EPS = 1e-5
_GELU_C = np.sqrt(2.0 / np.pi)


def layer_norm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta over the last axis (Ba et al. 2016)."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    rstd = 1.0 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + LAYER_NORM_EPS)
    xhat = centred * rstd
    return xhat * gamma + beta, (xhat, rstd, gamma)


def layer_norm_backward(dy: np.ndarray, cache, dgamma: np.ndarray, dbeta: np.ndarray) -> np.ndarray:
    """Accumulate dgamma, dbeta; return dx."""
    xhat, rstd, gamma = cache
    rows = dy.reshape(-1, dy.shape[-1])
    dgamma += (rows * xhat.reshape(rows.shape)).sum(axis=0)
    dbeta += rows.sum(axis=0)
    dxhat = dy * gamma
    return rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                   - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


def gelu_forward(x: np.ndarray):
    """GeLU, tanh approximation (Hendrycks & Gimpel 2016), as GPT-2 and Megatron use it."""
    t = np.tanh(_GELU_C * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1.0 + t), (x, t)


def gelu_backward(dy: np.ndarray, cache) -> np.ndarray:
    """dx of the tanh GeLU."""
    x, t = cache
    du = _GELU_C * (1.0 + 3 * 0.044715 * x * x)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


def linear_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x @ weight (+ bias); weight is (in, out) so column slices are output features."""
    y = x @ weight
    return y if bias is None else y + bias


def linear_backward(dy: np.ndarray, x: np.ndarray, weight: np.ndarray, dweight: np.ndarray,
                    dbias: np.ndarray | None = None) -> np.ndarray:
    """Accumulate dweight (and dbias); return dx."""
    rows_x = x.reshape(-1, x.shape[-1])
    rows_dy = dy.reshape(-1, dy.shape[-1])
    dweight += rows_x.T @ rows_dy
    if dbias is not None:
        dbias += rows_dy.sum(axis=0)
    return dy @ weight.T


def split_heads(x: np.ndarray, head_dim: int) -> np.ndarray:
    """(B, T, H*hd) -> (B, H, T, hd)."""
    batch, time, width = x.shape
    return x.reshape(batch, time, width // head_dim, head_dim).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, T, hd) -> (B, T, H*hd)."""
    batch, heads, time, head_dim = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, time, heads * head_dim)


def causal_attention_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray):
    """softmax(q k^T / sqrt(hd) + causal mask) v on (B, H, T, hd) heads (Vaswani et al. 2017)."""
    time, head_dim = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(0, 1, 3, 2)) / q.dtype.type(np.sqrt(head_dim))   # stays in q's dtype
    future = np.triu(np.ones_like(scores, dtype=bool, shape=(time, time)), k=1)   # where scores live
    scores = np.where(future, -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ v, (q, k, v, weights)


def causal_attention_backward(dout: np.ndarray, cache):
    """(dq, dk, dv) of the causal attention core."""
    q, k, v, weights = cache
    dweights = dout @ v.transpose(0, 1, 3, 2)
    dv = weights.transpose(0, 1, 3, 2) @ dout
    dscores = weights * (dweights - (dweights * weights).sum(axis=-1, keepdims=True))
    dscores /= q.dtype.type(np.sqrt(q.shape[-1]))
    return dscores @ k, dscores.transpose(0, 1, 3, 2) @ q, dv


def cross_entropy(logits: np.ndarray, targets: np.ndarray, scale: float):
    """(scale * sum of -log p[target], dlogits). `scale` = 1 / tokens of the *global* batch, so the
    sum over ranks of their losses and gradients is the serial mean."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    log_probs = shifted - log_norm
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)
    loss = -scale * picked.sum()
    classes = module_of(logits).arange(logits.shape[-1])
    dlogits = np.exp(log_probs) - (targets[..., None] == classes)   # p - 1 at the target, p elsewhere
    return float(loss), dlogits * scale


# -- mixture of experts (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021) --

def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def softmax_backward(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """dx of y = softmax(x)."""
    return y * (dy - (dy * y).sum(axis=-1, keepdims=True))


def expert_capacity(capacity_factor: float, group_tokens: int, experts: int, top_k: int) -> int:
    """Tokens one expert takes from one group: ceil(C * T / E) * k (GShard; Switch with k = 1)."""
    return math.ceil(capacity_factor * group_tokens / experts) * top_k


def experts_forward(w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray, rows: np.ndarray,
                    counts) -> tuple[np.ndarray, list]:
    """Expert MLPs GeLU(x @ W1[e] + b1[e]) @ W2[e] + b2[e] on `rows` sorted by expert, `counts[e]`
    rows for the e-th expert of the stacked weights; (outputs in the same order, cache)."""
    out = np.empty_like(rows)
    cache, start = [], 0
    for e, count in enumerate(counts):
        stop = start + int(count)
        z = linear_forward(rows[start:stop], w1[e], b1[e])
        a, gelu_cache = gelu_forward(z)
        out[start:stop] = linear_forward(a, w2[e], b2[e])
        cache.append((start, stop, a, gelu_cache))
        start = stop
    return out, [rows, cache]


def experts_backward(dout: np.ndarray, cache, w1: np.ndarray, w2: np.ndarray, g: dict[str, np.ndarray]
                     ) -> np.ndarray:
    """Accumulate the experts' g["w1"], g["b1"], g["w2"], g["b2"]; return d rows."""
    rows, parts = cache
    drows = np.empty_like(rows)
    for e, (start, stop, a, gelu_cache) in enumerate(parts):
        if stop == start:
            continue
        da = linear_backward(dout[start:stop], a, w2[e], g["w2"][e], g["b2"][e])
        dz = gelu_backward(da, gelu_cache)
        drows[start:stop] = linear_backward(dz, rows[start:stop], w1[e], g["w1"][e], g["b1"][e])
    return drows
