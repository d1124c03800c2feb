"""A small GPT-style model whose parameters live in one flat buffer, with a hand-written backward.

    embedding -> [attention block, MLP block] x blocks -> head (LN, projection) -> cross-entropy
    (with `experts` > 0 each MLP block is an MoE block whose load-balancing term joins the loss)

Every layer owns one contiguous *segment* of the flat buffer and each tensor is a view into it,
so a collective moves a layer, a bucket or the whole model without a copy (DDP's flat buckets and
FSDP's flat parameters, Li et al. 2020; Zhao et al. 2023). With `align = n` each segment is padded
to a multiple of n elements, so ZeRO (Rajbhandari et al. 2020) can cut every layer in n equal
shards; the padding holds zeros, gets zero gradient and never changes. The gradient buffer has the
same layout. Layers run one at a time, forward in order and backward in reverse, and the model
asks a `ParamSource` for each layer's weights just before it runs it: that is where ZeRO-3 gathers
a layer and where DDP launches a bucket's all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import functional as F
from .layers import MLP, Attention, Embedding, Head, MoE
from .placement import array_module, to_device


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the model; `blocks` counts attention+MLP pairs."""

    vocab: int = 17
    d_model: int = 16
    heads: int = 2
    blocks: int = 2
    seq_len: int = 8
    mlp_ratio: int = 4
    # mixture of experts (issue 7, strategy ep): experts > 0 turns every MLP into an MoE block
    experts: int = 0
    top_k: int = 1                  # experts per token (1 or 2)
    capacity_factor: float = 1.0    # C: expert capacity ceil(C * T / E) * k tokens
    aux_alpha: float = 0.01         # weight of the load-balancing loss alpha * E * sum f_i P_i
    router: str = "learned"         # "learned", or "uniform" (every expert equally likely)

    def layers(self) -> list:
        """The layers in forward order."""
        stack: list = [Embedding(self.vocab, self.d_model, self.seq_len)]
        for b in range(self.blocks):
            stack.append(Attention(self.d_model, self.heads, name=f"attention{b}"))
            if self.experts:
                stack.append(MoE(self.d_model, self.mlp_ratio * self.d_model, self.experts, self.top_k,
                                 self.capacity_factor, self.aux_alpha, self.router, name=f"moe{b}"))
            else:
                stack.append(MLP(self.d_model, self.mlp_ratio * self.d_model, name=f"mlp{b}"))
        stack.append(Head(self.d_model, self.vocab))
        return stack


@dataclass(frozen=True)
class Segment:
    """Where one layer's tensors sit: `start`..`start + padded` of the flat buffer."""

    start: int
    size: int       # elements in use
    padded: int     # size rounded up to a multiple of `align`
    tensors: tuple[tuple[str, int, tuple[int, ...]], ...]   # name, offset within the segment, shape


class Layout:
    """Offsets of every layer's segment and tensor in a flat buffer (segments padded to `align`)."""

    def __init__(self, layers: list, align: int = 1) -> None:
        self.align = align
        segments, start = [], 0
        for layer in layers:
            tensors, offset = [], 0
            for name, shape, _ in layer.specs:
                tensors.append((name, offset, shape))
                offset += int(np.prod(shape))
            padded = -(-offset // align) * align
            segments.append(Segment(start, offset, padded, tuple(tensors)))
            start += padded
        self.segments: list[Segment] = segments
        self.total = start                                    # elements, padding included
        self.parameters = sum(s.size for s in segments)       # Psi: parameters without padding

    def views(self, buffer: np.ndarray, index: int, local: bool = False) -> dict[str, np.ndarray]:
        """Views of layer `index`'s tensors in `buffer` (the flat buffer, or with `local` a buffer
        holding only that layer's segment)."""
        segment = self.segments[index]
        base = 0 if local else segment.start
        return {name: buffer[base + offset: base + offset + int(np.prod(shape))].reshape(shape)
                for name, offset, shape in segment.tensors}

    def segment(self, buffer: np.ndarray, index: int) -> np.ndarray:
        """Layer `index`'s whole (padded) segment of the flat `buffer`."""
        s = self.segments[index]
        return buffer[s.start: s.start + s.padded]

    def pack(self, buffer: np.ndarray) -> np.ndarray:
        """The parameters without padding, in layer order (to compare layouts of different `align`)."""
        return np.concatenate([buffer[s.start: s.start + s.size] for s in self.segments])


ParamSource = Callable[[int], dict[str, np.ndarray]]   # layer index -> that layer's parameter views
GradSink = Callable[[int], dict[str, np.ndarray]]      # layer index -> views to accumulate into
LayerHook = Callable[[int], None]


class Model:
    """The layers, their layout and forward/backward over flat buffers; compute in `dtype`.
    `layers` replaces `config.layers()` (expert parallelism passes its own MoE blocks)."""

    def __init__(self, config: ModelConfig, dtype=np.float64, align: int = 1,
                 layers: list | None = None, device: str = "cpu") -> None:
        self.config = config
        self.device = device   # "cpu": numpy buffers; "cuda": cupy buffers on the current GPU
        self.xp = array_module(device)
        self.dtype = np.dtype(dtype)
        self.layers = config.layers() if layers is None else layers
        self.layout = Layout(self.layers, align)

    def init_params(self, seed: int, dtype=None) -> np.ndarray:
        """A fresh flat parameter buffer: weights N(0, 1/fan_in), LN gains 1, biases 0, padding 0.
        Drawn tensor by tensor in float64 from `seed`, so every layout gets the same numbers."""
        rng = np.random.default_rng(seed)
        flat = np.zeros(self.layout.total, dtype or self.dtype)
        for index, layer in enumerate(self.layers):
            views = self.layout.views(flat, index)
            for name, shape, init in layer.specs:
                if init == "normal":
                    views[name][...] = rng.standard_normal(shape) / np.sqrt(shape[0])
                elif init == "experts":   # stacked experts (E, fan_in, fan_out)
                    views[name][...] = rng.standard_normal(shape) / np.sqrt(shape[1])
                elif init == "ones":
                    views[name][...] = 1.0
        return to_device(flat, self.device)   # drawn on the host: every device gets the same numbers

    def zeros(self, dtype=None) -> np.ndarray:
        """A zero flat buffer of this layout (gradients)."""
        return self.xp.zeros(self.layout.total, dtype or self.dtype)

    def flat_source(self, flat: np.ndarray) -> ParamSource:
        """Read every layer's parameters from the flat buffer `flat`."""
        return lambda index: self.layout.views(flat, index)

    def _compute(self, views: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The views in the compute dtype (a copy only for a low-precision working copy)."""
        return {k: v.astype(self.dtype, copy=False) for k, v in views.items()}

    def forward(self, params: ParamSource, tokens: np.ndarray, targets: np.ndarray, scale: float,
                release: LayerHook | None = None):
        """(loss, caches): loss = scale * summed cross-entropy (+ the MoE blocks' load-balancing
        terms); `release(i)` after layer i ran."""
        caches = []
        x = tokens
        extra = []
        for index, layer in enumerate(self.layers):
            if getattr(layer, "adds_loss", False):   # an MoE block: its own term of the loss
                x, cache = layer.forward(self._compute(params(index)), x, scale)
                extra.append(cache.loss)
            else:
                x, cache = layer.forward(self._compute(params(index)), x)
            caches.append(cache)
            if release is not None:
                release(index)
        loss, dlogits = F.cross_entropy(x, targets, scale)
        caches.append(dlogits)
        return (loss + sum(extra) if extra else loss), caches

    def backward(self, params: ParamSource, grads: GradSink, caches: list,
                 done: LayerHook | None = None) -> None:
        """Accumulate gradients layer by layer in reverse; `done(i)` once layer i's are complete."""
        dy = caches[-1]
        for index in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[index]
            sink = grads(index)
            if all(g.dtype == self.dtype for g in sink.values()):
                dy = layer.backward(self._compute(params(index)), sink, caches[index], dy)
            else:   # low-precision gradient buffer: compute in full precision, then add in
                full = {k: np.zeros_like(g, dtype=self.dtype) for k, g in sink.items()}
                dy = layer.backward(self._compute(params(index)), full, caches[index], dy)
                for k, g in sink.items():
                    g += full[k]
            caches[index] = None   # activations are freed as soon as their layer is done
            if done is not None:
                done(index)

    def loss_and_grad(self, flat: np.ndarray, tokens: np.ndarray, targets: np.ndarray,
                      scale: float | None = None) -> tuple[float, np.ndarray]:
        """Loss and a fresh gradient buffer for one batch (mean over its tokens by default)."""
        scale = 1.0 / targets.size if scale is None else scale
        grad = self.zeros(flat.dtype)
        loss, caches = self.forward(self.flat_source(flat), tokens, targets, scale)
        self.backward(self.flat_source(flat), self.flat_source(grad), caches)
        return loss, grad
