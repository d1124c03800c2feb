"""The model's layers: embedding, causal self-attention block, MLP block, output head.

A layer declares its tensors (`specs`), and runs `forward(params, x) -> (y, cache)` and
`backward(params, grads, cache, dy) -> dx`, where `params` and `grads` are dicts of views into flat
buffers and `backward` *accumulates* into `grads` (so gradient accumulation is free). Blocks are
pre-norm residual blocks as in GPT-2 (Radford et al. 2019): x + f(LN(x)). Attention weights keep the
heads as contiguous column groups of Wq/Wk/Wv and row groups of Wo, and the MLP's W1 columns / W2
rows are its hidden units: the cuts Megatron-LM's tensor parallelism makes. With `experts > 0` every
MLP is an `MoE` block (router, top-k gating, capacity, load-balancing loss), whose experts expert
parallelism (`expert.py`) spreads over ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import functional as F
from .placement import like, scatter_add, to_host

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
        scatter_add(g["tokens"], tokens.reshape(-1), dy.reshape(-1, self.d_model))
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


@dataclass
class Routing:
    """Where one batch's tokens go. Groups are the batch's rows (one sequence each): routing,
    capacity and the load-balancing loss are per group, so any split of the rows over ranks,
    micro-batches or stages routes every token exactly as the serial run does (GShard's groups)."""

    tokens: np.ndarray     # (A,) flat token index of each kept assignment, sorted by expert
    experts: np.ndarray    # (A,) its expert
    slots: np.ndarray      # (A,) which of the token's k choices it is
    gates: np.ndarray      # (A,) its gate weight
    kept: np.ndarray       # (E,) kept assignments per expert
    routed: np.ndarray     # (E,) assignments per expert before the capacity cut
    aux: float             # sum over groups of alpha * E * sum_i f_i * P_i
    probs: np.ndarray      # (G, T, E) router probabilities
    choices: np.ndarray    # (G, T, k) the chosen experts, best first
    weights: np.ndarray    # (G, T, k) the gates of all choices, dropped ones too
    fractions: np.ndarray  # (G, E) f_i: share of the group's tokens whose first choice is expert i

    @property
    def dropped(self) -> int:
        """Assignments cut by the capacity (those tokens keep only the residual path)."""
        return int(self.routed.sum() - self.kept.sum())


@dataclass
class MoECache:
    """What an MoE block's backward needs; `loss` is its load-balancing term of the model's loss."""

    loss: float
    routing: Routing
    scale: float
    h: np.ndarray
    ln_cache: tuple
    out: np.ndarray
    expert_cache: object


@dataclass(frozen=True)
class MoE:
    """x + sum over the token's kept choices e of gate_e * Expert_e(LN(x)), a mixture-of-experts
    block in place of the MLP (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et
    al. 2021). Router: softmax(LN(x) @ Wr) and the top-k experts; top-1 gates are the probability
    (Switch), top-2 gates the two probabilities renormalised (GShard). `router="uniform"` forces
    every probability to 1/E and sends token t of a group to experts t, t+1, ... mod E. Each expert
    takes at most capacity = ceil(C * T / E) * k assignments of a group of T tokens, first choices
    in token order before second choices; the rest are dropped (residual only). The block adds
    alpha * E * sum_i f_i * P_i, averaged over the global batch's groups, to the loss.

    `forward(p, x, scale)` takes the loss scale (1 / tokens of the global batch) because its loss
    term is its own: `adds_loss` tells the model to pass it and to add `cache.loss`. The experts
    run in `experts_forward`/`experts_backward`; expert parallelism overrides just those two."""

    d_model: int
    hidden: int
    experts: int
    top_k: int = 1
    capacity_factor: float = 1.0
    aux_alpha: float = 0.01
    router: str = "learned"
    name: str = "moe"
    adds_loss = True
    EXPERT_TENSORS = ("w1", "b1", "w2", "b2")   # stacked along axis 0, one slice per expert

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"{self.name}: top_k={self.top_k} must be between 1 and experts={self.experts}")
        if self.router not in ("learned", "uniform"):
            raise ValueError(f"{self.name}: router={self.router!r}: choose 'learned' or 'uniform'")

    @property
    def shared_specs(self) -> list[Spec]:
        """The tensors every token uses: the layer norm and the router."""
        d = self.d_model
        return [("ln_gamma", (d,), "ones"), ("ln_beta", (d,), "zeros"),
                ("router", (d, self.experts), "normal")]

    def expert_specs(self, count: int) -> list[Spec]:
        """The tensors of `count` experts, stacked ("experts": N(0, 1/fan_in) with fan_in = shape[1])."""
        d, f = self.d_model, self.hidden
        return [("w1", (count, d, f), "experts"), ("b1", (count, f), "zeros"),
                ("w2", (count, f, d), "experts"), ("b2", (count, d), "zeros")]

    @property
    def specs(self) -> list[Spec]:
        return self.shared_specs + self.expert_specs(self.experts)

    def route(self, p, h) -> Routing:
        """Choose experts for the tokens of `h` (G, T, d) and apply the capacity of each group.
        The bookkeeping runs on the host (small integer arrays; also for a model on the GPU, whose
        router probabilities come over once); only the gates go back to `h`'s device."""
        groups, time = h.shape[:2]
        experts, k = self.experts, self.top_k
        if self.router == "uniform":
            probs = np.full((groups, time, experts), 1.0 / experts)
            rotation = (np.arange(time)[:, None] + np.arange(k)) % experts
            choices = np.broadcast_to(rotation, (groups, time, k)).copy()
        else:
            probs = to_host(F.softmax(h @ p["router"]))
            choices = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
        picked = np.take_along_axis(probs, choices, -1)
        weights = picked if k == 1 else picked / picked.sum(axis=-1, keepdims=True)
        # a group's assignments in priority order: every token's first choice, then the second
        order = choices.transpose(0, 2, 1).reshape(groups, k * time)
        seen = np.cumsum(order[..., None] == np.arange(experts), axis=1)
        position = np.take_along_axis(seen, order[..., None], -1)[..., 0] - 1
        capacity = F.expert_capacity(self.capacity_factor, time, experts, k)
        group, assignment = np.nonzero(position < capacity)
        slots, steps = np.divmod(assignment, time)
        chosen = order[group, assignment]
        by_expert = np.argsort(chosen, kind="stable")
        group, slots, steps, chosen = group[by_expert], slots[by_expert], steps[by_expert], chosen[by_expert]
        fractions = (choices[..., 0][..., None] == np.arange(experts)).mean(axis=1)
        aux = self.aux_alpha * experts * float((fractions * probs.mean(axis=1)).sum()) if groups else 0.0
        return Routing(tokens=group * time + steps, experts=chosen, slots=slots,
                       gates=like(h, weights[group, steps, slots]),
                       kept=np.bincount(chosen, minlength=experts),
                       routed=np.bincount(order.reshape(-1), minlength=experts), aux=aux, probs=probs,
                       choices=choices, weights=weights, fractions=fractions)

    def experts_forward(self, p, rows: np.ndarray, routing: Routing):
        """The experts on `rows` (one per kept assignment, sorted by expert): (outputs, cache)."""
        return F.experts_forward(p["w1"], p["b1"], p["w2"], p["b2"], rows, routing.kept)

    def experts_backward(self, p, g, cache, dout: np.ndarray) -> np.ndarray:
        """Accumulate the experts' gradients; return the gradient of their input rows."""
        return F.experts_backward(dout, cache, p["w1"], p["w2"], g)

    def forward(self, p, x, scale: float = 1.0):
        h, ln_cache = F.layer_norm_forward(x, p["ln_gamma"], p["ln_beta"])
        routing = self.route(p, h)
        out, expert_cache = self.experts_forward(p, h.reshape(-1, self.d_model)[routing.tokens], routing)
        y = x.reshape(-1, self.d_model).copy()
        for slot in range(self.top_k):   # a token appears at most once per slot
            mine = routing.slots == slot
            y[routing.tokens[mine]] += routing.gates[mine, None] * out[mine]
        # the groups' mean load-balancing loss over the global batch: scale * T * sum over groups
        loss = scale * x.shape[1] * routing.aux
        return y.reshape(x.shape), MoECache(loss, routing, scale, h, ln_cache, out, expert_cache)

    def backward(self, p, g, cache: MoECache, dy):
        routing, h = cache.routing, cache.h
        time = h.shape[1]
        rows_dy = dy.reshape(-1, self.d_model)[routing.tokens]
        drows = self.experts_backward(p, g, cache.expert_cache, rows_dy * routing.gates[:, None])
        dh = np.zeros_like(h, shape=(h.shape[0] * time, self.d_model))
        for slot in range(self.top_k):
            mine = routing.slots == slot
            dh[routing.tokens[mine]] += drows[mine]
        dh = dh.reshape(h.shape)
        if self.router == "learned":   # the uniform router has no parameters in play
            dweights = np.zeros_like(routing.weights)
            where = (routing.tokens // time, routing.tokens % time, routing.slots)
            dweights[where] = to_host((rows_dy * cache.out).sum(-1))   # d loss / d gate (host routing)
            picked = np.take_along_axis(routing.probs, routing.choices, -1)
            if self.top_k > 1:   # gate_j = p_j / sum_i p_i
                dweights = (dweights - (dweights * routing.weights).sum(-1, keepdims=True)) \
                    / picked.sum(-1, keepdims=True)
            dprobs = np.zeros_like(routing.probs)
            np.put_along_axis(dprobs, routing.choices, dweights, -1)
            # d/dP_i of scale * T * alpha * E * sum_i f_i * mean_t p_ti (f_i counts are not differentiable)
            dprobs += cache.scale * self.aux_alpha * self.experts * routing.fractions[:, None, :]
            dlogits = like(h, F.softmax_backward(dprobs, routing.probs))
            dh += F.linear_backward(dlogits, h, p["router"], g["router"])
        return dy + F.layer_norm_backward(dh, cache.ln_cache, g["ln_gamma"], g["ln_beta"])
