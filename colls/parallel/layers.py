"""The model's layers: embedding, causal self-attention block, MLP block, output head.

A layer declares its tensors (`specs`), and runs `forward(params, x) -> (y, cache)` and
`backward(params, grads, cache, dy) -> dx`, where `params` and `grads` are dicts of views into flat
buffers and `backward` *accumulates* into `grads` (so gradient accumulation is free). Blocks are
pre-norm residual blocks as in GPT-2 (Radford et al. 2019): x + f(LN(x)). Attention weights keep the
heads as contiguous column groups of Wq/Wk/Wv and row groups of Wo, and the MLP's W1 columns / W2
rows are its hidden units: the cuts Megatron-LM's tensor parallelism makes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import functional as F

Spec = tuple[str, tuple[int, ...], str]   # name, shape, init ("normal", "zeros", "ones")


@dataclass(frozen=True)
class Embedding:
    """Token embedding plus learned positional embedding."""

    vocab: int
    d_model: int
    seq_len: int
    name: str = "embedding"

    @property
    def specs(self) -> list[Spec]:
        return [("tokens", (self.vocab, self.d_model), "normal"),
                ("positions", (self.seq_len, self.d_model), "normal")]

    def forward(self, p, tokens):
        time = tokens.shape[1]
        return p["tokens"][tokens] + p["positions"][:time], tokens

    def backward(self, p, g, tokens, dy):
        np.add.at(g["tokens"], tokens.reshape(-1), dy.reshape(-1, self.d_model))
        g["positions"][:tokens.shape[1]] += dy.sum(axis=0)
        return None


@dataclass(frozen=True)
class Attention:
    """x + (causal multi-head self-attention of LN(x)) @ Wo + bo. No biases on q, k, v: the key bias
    has a zero gradient in exact arithmetic (softmax ignores a per-query shift), which would leave
    Adam amplifying rounding noise."""

    d_model: int
    heads: int
    name: str = "attention"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def specs(self) -> list[Spec]:
        d = self.d_model
        return [("ln_gamma", (d,), "ones"), ("ln_beta", (d,), "zeros"),
                ("wq", (d, d), "normal"), ("wk", (d, d), "normal"), ("wv", (d, d), "normal"),
                ("wo", (d, d), "normal"), ("bo", (d,), "zeros")]

    def forward(self, p, x):
        h, ln_cache = F.layer_norm_forward(x, p["ln_gamma"], p["ln_beta"])
        q = F.split_heads(h @ p["wq"], self.head_dim)
        k = F.split_heads(h @ p["wk"], self.head_dim)
        v = F.split_heads(h @ p["wv"], self.head_dim)
        heads_out, attention_cache = F.causal_attention_forward(q, k, v)
        merged = F.merge_heads(heads_out)
        return x + F.linear_forward(merged, p["wo"], p["bo"]), (h, ln_cache, attention_cache, merged)

    def backward(self, p, g, cache, dy):
        h, ln_cache, attention_cache, merged = cache
        dmerged = F.linear_backward(dy, merged, p["wo"], g["wo"], g["bo"])
        dq, dk, dv = F.causal_attention_backward(F.split_heads(dmerged, self.head_dim), attention_cache)
        dh = F.linear_backward(F.merge_heads(dq), h, p["wq"], g["wq"])
        dh += F.linear_backward(F.merge_heads(dk), h, p["wk"], g["wk"])
        dh += F.linear_backward(F.merge_heads(dv), h, p["wv"], g["wv"])
        return dy + F.layer_norm_backward(dh, ln_cache, g["ln_gamma"], g["ln_beta"])


@dataclass(frozen=True)
class MLP:
    """x + GeLU(LN(x) @ W1 + b1) @ W2 + b2."""

    d_model: int
    hidden: int
    name: str = "mlp"

    @property
    def specs(self) -> list[Spec]:
        d, f = self.d_model, self.hidden
        return [("ln_gamma", (d,), "ones"), ("ln_beta", (d,), "zeros"),
                ("w1", (d, f), "normal"), ("b1", (f,), "zeros"),
                ("w2", (f, d), "normal"), ("b2", (d,), "zeros")]

    def forward(self, p, x):
        h, ln_cache = F.layer_norm_forward(x, p["ln_gamma"], p["ln_beta"])
        z = F.linear_forward(h, p["w1"], p["b1"])
        a, gelu_cache = F.gelu_forward(z)
        return x + F.linear_forward(a, p["w2"], p["b2"]), (h, ln_cache, a, gelu_cache)

    def backward(self, p, g, cache, dy):
        h, ln_cache, a, gelu_cache = cache
        da = F.linear_backward(dy, a, p["w2"], g["w2"], g["b2"])
        dz = F.gelu_backward(da, gelu_cache)
        dh = F.linear_backward(dz, h, p["w1"], g["w1"], g["b1"])
        return dy + F.layer_norm_backward(dh, ln_cache, g["ln_gamma"], g["ln_beta"])


@dataclass(frozen=True)
class Head:
    """Final layer norm and output projection to vocabulary logits (the loss is taken outside)."""

    d_model: int
    vocab: int
    name: str = "head"

    @property
    def specs(self) -> list[Spec]:
        return [("ln_gamma", (self.d_model,), "ones"), ("ln_beta", (self.d_model,), "zeros"),
                ("w", (self.d_model, self.vocab), "normal"), ("b", (self.vocab,), "zeros")]

    def forward(self, p, x):
        h, ln_cache = F.layer_norm_forward(x, p["ln_gamma"], p["ln_beta"])
        return F.linear_forward(h, p["w"], p["b"]), (h, ln_cache)

    def backward(self, p, g, cache, dlogits):
        h, ln_cache = cache
        dh = F.linear_backward(dlogits, h, p["w"], g["w"], g["b"])
        return F.layer_norm_backward(dh, ln_cache, g["ln_gamma"], g["ln_beta"])
