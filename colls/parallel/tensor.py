"""`tp` and `dp_tp`: Megatron-LM tensor parallelism (Shoeybi et al. 2019), alone and inside data parallel.

The split (section 3 of the paper): in the MLP, W1 (and b1) is cut by columns (column parallel) and W2
by rows (row parallel), so GeLU runs on local hidden units with no communication; in attention, Wq,
Wk, Wv are cut by columns *by heads* and Wo by rows, so every rank runs whole heads. Two operators
bracket each parallel region:

    f (copy_to_tensor_parallel):     identity forward, all-reduce of the gradient backward
    g (reduce_from_tensor_parallel): all-reduce of the partial outputs forward, identity backward

so each transformer layer (attention + MLP block) makes 2 all-reduces forward and 2 backward, each of
B·T·d activations. Replicated on every TP rank (computed redundantly, never communicated within TP):
the embedding, every LayerNorm, the row-parallel output biases bo and b2 (added after g, as Megatron
does) and the head. Their gradients come from identical inputs, so they stay bitwise identical.

Uneven sizes: rank r of t takes heads (and MLP hidden units) `shard_rows(count, t, r)` - the first
count % t ranks one more. A d_ff or a head count that t does not divide is fine (tp = 3 with d_ff = 64
gives 22/21/21 hidden units); every rank needs at least one head and one hidden unit (ValueError).
The activations all-reduced are B·T·d whatever the split, so the communication does not change.

API for other strategies (a pipeline stage, `3d`):

    stage = TensorParallelStage(config, tp_comm, start, stop)   # layers config.layers()[start:stop]
    stage.layers        TP layers with layers.py's interface: specs (local shapes), forward(p, x) ->
                        (y, cache), backward(p, g, cache, dy) -> dx (accumulates into g)
    stage.layout        a model.Layout of the local layers (views(flat, i), total)
    stage.shard(full)   the whole model's flat parameters (serial layout, align 1) -> this rank's local flat
    stage.gather(local) -> the range's parameters in the serial layout (all-reduce over tp_comm: call on
                        every TP rank; not training traffic)
    stage.forward(local_params, x) -> (y, caches); stage.backward(local_params, local_grads, caches, dy) -> dx
    stage.replicated_index / stage.sharded_index   positions of the local flat: all-reduce each part's
                        gradient over the DP group separately (see sync_gradients)
    TensorParallelAttention(layer, tp_comm), TensorParallelMLP(layer, tp_comm);
    tensor_parallel(layer, tp_comm)
                        picks the wrapper (embedding and head: the layer itself, replicated)
    tensor_parallel_groups(comm, dp, tp) -> (tp_comm, dp_comm): rank = dp_index * tp + tp_index
    sync_gradients(stage, grads, dp_comm)   the DP all-reduces of one step
    ring_sent_bytes(count, n, rank, itemsize)   bytes a rank sends in one ring all-reduce (exact)
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from algorithms.blocks import bounds

from . import functional as F
from .common import RunResult, Setup, StepRecord, local_batch, nbytes, traffic
from .data import shard_rows
from .layers import MLP, Attention, Embedding, Head
from .model import Layout, ModelConfig
from .placement import contiguous, to_device, to_host

ALGORITHM = "ring"   # every TP and DP all-reduce: the byte formula below is the ring's


def all_reduce(comm, x: np.ndarray) -> np.ndarray:
    """Sum `x` over `comm` in place (ring: each element reduced once, so identical on every rank)."""
    return comm.all_reduce(x, out=x, algorithm=ALGORITHM)


def copy_to_tensor_parallel(x: np.ndarray) -> np.ndarray:
    """Megatron's f, forward: the identity (the input enters the parallel region on every rank)."""
    return x


def copy_to_tensor_parallel_backward(comm, dx: np.ndarray) -> np.ndarray:
    """Megatron's f, backward: all-reduce the partial input gradients of the ranks' shards."""
    return all_reduce(comm, contiguous(dx))


def reduce_from_tensor_parallel(comm, partial: np.ndarray) -> np.ndarray:
    """Megatron's g, forward: all-reduce the row-parallel layer's partial outputs."""
    return all_reduce(comm, contiguous(partial))


def reduce_from_tensor_parallel_backward(dy: np.ndarray) -> np.ndarray:
    """Megatron's g, backward: the identity (every rank already holds the whole output gradient)."""
    return dy


def ring_sent_bytes(count: int, n: int, rank: int, itemsize: int) -> int:
    """Bytes rank `rank` sends in a ring all-reduce of `count` values: every block but its own in the
    reduce-scatter, every block but its right neighbour's in the all-gather; 2(n-1)/n·count if n | count."""
    if n == 1:
        return 0
    starts = bounds(count, n)
    block = [starts[i + 1] - starts[i] for i in range(n)]
    return (2 * count - block[rank] - block[(rank + 1) % n]) * itemsize


def _part(count: int, tp_comm, what: str) -> slice:
    """This rank's slice of `count` units (heads or hidden units), the first count % t ranks one more."""
    if count < tp_comm.size:
        raise ValueError(f"tensor parallel: {count} {what} cannot be split over tp = {tp_comm.size} ranks; "
                         f"every rank needs at least one (use --tp <= {count})")
    return shard_rows(count, tp_comm.size, tp_comm.rank)


class TensorParallelAttention:
    """This rank's heads of an `Attention` block: Wq/Wk/Wv column parallel, Wo row parallel (f ... g)."""

    def __init__(self, layer: Attention, tp_comm) -> None:
        self.layer, self.comm, self.name = layer, tp_comm, layer.name
        self.heads = _part(layer.heads, tp_comm, "heads")
        hd = layer.head_dim
        columns = slice(self.heads.start * hd, self.heads.stop * hd)
        # name -> (axis, slice of the full tensor) for the sharded tensors; the rest are replicated
        self.sharded = {"wq": (1, columns), "wk": (1, columns), "wv": (1, columns), "wo": (0, columns)}

    @property
    def specs(self):
        return _local_specs(self)

    def forward(self, p, x):
        hd = self.layer.head_dim
        h, ln_cache = F.layer_norm_forward(x, p["ln_gamma"], p["ln_beta"])
        h = copy_to_tensor_parallel(h)
        q = F.split_heads(h @ p["wq"], hd)
        k = F.split_heads(h @ p["wk"], hd)
        v = F.split_heads(h @ p["wv"], hd)
        heads_out, attention_cache = F.causal_attention_forward(q, k, v)
        merged = F.merge_heads(heads_out)
        out = reduce_from_tensor_parallel(self.comm, merged @ p["wo"]) + p["bo"]
        return x + out, (h, ln_cache, attention_cache, merged)

    def backward(self, p, g, cache, dy):
        h, ln_cache, attention_cache, merged = cache
        hd = self.layer.head_dim
        dout = reduce_from_tensor_parallel_backward(dy)
        dmerged = F.linear_backward(dout, merged, p["wo"], g["wo"], g["bo"])
        dq, dk, dv = F.causal_attention_backward(F.split_heads(dmerged, hd), attention_cache)
        dh = F.linear_backward(F.merge_heads(dq), h, p["wq"], g["wq"])
        dh += F.linear_backward(F.merge_heads(dk), h, p["wk"], g["wk"])
        dh += F.linear_backward(F.merge_heads(dv), h, p["wv"], g["wv"])
        dh = copy_to_tensor_parallel_backward(self.comm, dh)
        return dy + F.layer_norm_backward(dh, ln_cache, g["ln_gamma"], g["ln_beta"])


class TensorParallelMLP:
    """This rank's hidden units of an `MLP` block: W1, b1 column parallel, W2 row parallel (f ... g)."""

    def __init__(self, layer: MLP, tp_comm) -> None:
        self.layer, self.comm, self.name = layer, tp_comm, layer.name
        self.hidden = _part(layer.hidden, tp_comm, "hidden units")
        self.sharded = {"w1": (1, self.hidden), "b1": (0, self.hidden), "w2": (0, self.hidden)}

    @property
    def specs(self):
        return _local_specs(self)

    def forward(self, p, x):
        h, ln_cache = F.layer_norm_forward(x, p["ln_gamma"], p["ln_beta"])
        h = copy_to_tensor_parallel(h)
        a, gelu_cache = F.gelu_forward(F.linear_forward(h, p["w1"], p["b1"]))
        out = reduce_from_tensor_parallel(self.comm, a @ p["w2"]) + p["b2"]
        return x + out, (h, ln_cache, a, gelu_cache)

    def backward(self, p, g, cache, dy):
        h, ln_cache, a, gelu_cache = cache
        dout = reduce_from_tensor_parallel_backward(dy)
        da = F.linear_backward(dout, a, p["w2"], g["w2"], g["b2"])
        dh = F.linear_backward(F.gelu_backward(da, gelu_cache), h, p["w1"], g["w1"], g["b1"])
        dh = copy_to_tensor_parallel_backward(self.comm, dh)
        return dy + F.layer_norm_backward(dh, ln_cache, g["ln_gamma"], g["ln_beta"])


def _local_specs(tp_layer) -> list:
    """The full layer's specs with each sharded tensor's cut axis shrunk to this rank's slice."""
    specs = []
    for name, shape, init in tp_layer.layer.specs:
        if name in tp_layer.sharded:
            axis, part = tp_layer.sharded[name]
            shape = tuple(part.stop - part.start if a == axis else s for a, s in enumerate(shape))
        specs.append((name, shape, init))
    return specs


def tensor_parallel(layer, tp_comm):
    """The TP version of a model layer; the embedding and head stay whole (replicated)."""
    if isinstance(layer, Attention):
        return TensorParallelAttention(layer, tp_comm)
    if isinstance(layer, MLP):
        return TensorParallelMLP(layer, tp_comm)
    if isinstance(layer, (Embedding, Head)):
        return layer
    raise ValueError(f"tensor parallel: no split for layer {getattr(layer, 'name', layer)!r} "
                     f"({type(layer).__name__}); tp splits attention and dense MLP blocks")


class TensorParallelStage:
    """Layers `start`..`stop` of the model, as this TP rank holds them (the whole model by default)."""

    def __init__(self, config: ModelConfig, tp_comm, start: int = 0, stop: int | None = None,
                 dtype=np.float64) -> None:
        full_layers = config.layers()
        self.start, self.stop = start, len(full_layers) if stop is None else stop
        self.comm, self.dtype = tp_comm, np.dtype(dtype)
        self.full_layers = full_layers[self.start:self.stop]
        self.layers = [tensor_parallel(layer, tp_comm) for layer in self.full_layers]
        self.layout = Layout(self.layers)
        self.full_layout = Layout(self.full_layers)
        whole = Layout(full_layers)
        self.full_offset = whole.segments[self.start].start   # where the range starts in the model's flat
        replicated, sharded = [], []
        for index, layer in enumerate(self.layers):
            segment = self.layout.segments[index]
            for name, offset, shape in segment.tensors:
                target = sharded if name in getattr(layer, "sharded", {}) else replicated
                target.append(np.arange(segment.start + offset, segment.start + offset + int(np.prod(shape))))
        self.replicated_index = np.concatenate(replicated or [np.zeros(0, int)])
        self.sharded_index = np.concatenate(sharded or [np.zeros(0, int)])

    def _pairs(self, full: np.ndarray, local: np.ndarray):
        """(full view, local view, cut) of every tensor: cut = (axis, slice) or None if replicated."""
        for index, layer in enumerate(self.layers):
            full_views = self.full_layout.views(full, index)
            for name, view in self.layout.views(local, index).items():
                yield full_views[name], view, getattr(layer, "sharded", {}).get(name)

    def shard(self, model_flat: np.ndarray) -> np.ndarray:
        """This rank's local flat buffer from the whole model's flat parameters (serial layout)."""
        full = model_flat[self.full_offset: self.full_offset + self.full_layout.total]
        local = np.zeros_like(model_flat, shape=self.layout.total)   # on the model's device
        for full_view, local_view, cut in self._pairs(full, local):
            local_view[...] = full_view if cut is None else full_view[(slice(None),) * cut[0] + (cut[1],)]
        return local

    def gather(self, local: np.ndarray) -> np.ndarray:
        """The range's full parameters (serial layout) from every TP rank's local buffer. Each rank
        places its shard in zeros (the replicated tensors only TP rank 0) and a sum adds them: exact."""
        full = np.zeros_like(local, shape=self.full_layout.total, dtype=np.float64)
        for full_view, local_view, cut in self._pairs(full, local):
            if cut is None:
                if self.comm.rank == 0:
                    full_view[...] = local_view
            else:
                index = [slice(None)] * full_view.ndim
                index[cut[0]] = cut[1]
                full_view[tuple(index)] = local_view
        return self.comm.all_reduce(full, out=full)

    def forward(self, params: np.ndarray, x: np.ndarray):
        """(output, caches) of the range's layers on `x` (tokens for the first layer)."""
        caches = []
        for index, layer in enumerate(self.layers):
            x, cache = layer.forward(self._compute(self.layout.views(params, index)), x)
            caches.append(cache)
        return x, caches

    def backward(self, params: np.ndarray, grads: np.ndarray, caches: list, dy: np.ndarray):
        """Accumulate the range's gradients into `grads` (the local layout), in reverse; return dx."""
        for index in range(len(self.layers) - 1, -1, -1):
            sink = self.layout.views(grads, index)
            p = self._compute(self.layout.views(params, index))
            if grads.dtype == self.dtype:
                dy = self.layers[index].backward(p, sink, caches[index], dy)
            else:   # low-precision gradient buffer: compute in full precision, then add in
                full = {k: np.zeros_like(g, dtype=self.dtype) for k, g in sink.items()}
                dy = self.layers[index].backward(p, full, caches[index], dy)
                for k, g in sink.items():
                    g += full[k]
            caches[index] = None
        return dy

    def _compute(self, views):
        return {k: v.astype(self.dtype, copy=False) for k, v in views.items()}


# -- the training loop ------------------------------------------------------------------------------

def tensor_parallel_groups(comm, dp: int, tp: int):
    """(tp_comm, dp_comm) of a dp × tp grid, TP innermost on consecutive ranks (Megatron's order):
    rank = dp_index * tp + tp_index; a TP group is one dp_index, a DP group one tp_index."""
    if comm.size != dp * tp:
        raise ValueError(f"tensor parallel: dp {dp} × tp {tp} = {dp * tp} ranks, but the communicator "
                         f"has {comm.size}; run with -n {dp * tp}")
    dp_index, tp_index = divmod(comm.rank, tp)
    tp_comm = comm.split(dp_index, key=tp_index)
    dp_comm = comm.split(tp_index, key=dp_index)
    return tp_comm, dp_comm


def sync_gradients(stage: TensorParallelStage, grads: np.ndarray, dp_comm) -> None:
    """Sum each TP shard's gradient over its DP group: the replicated part and the sharded part in two
    all-reduces, so the replicated part is cut in the same ring blocks on every TP rank (and so stays
    bitwise identical) even when uneven shards give the TP ranks local buffers of different sizes."""
    for index in (stage.replicated_index, stage.sharded_index):
        part = grads[index]
        grads[index] = all_reduce(dp_comm, part)


def _phase(comm) -> dict[str, int]:
    """This rank's all-reduce calls and bytes on `comm` since its counters were reset."""
    entry = comm.stats().get("all_reduce", {})
    return {"calls": int(entry.get("calls", 0)), "bytes_sent": int(np.sum(entry.get("bytes_sent", 0))),
            "bytes_received": int(np.sum(entry.get("bytes_received", 0)))}


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(to_host(array)).tobytes()).hexdigest()


def world_size(strategy: str, setup: Setup) -> int:
    """Ranks the grid needs: tp for `tp`, dp × tp for `dp_tp`."""
    if setup.pp != 1 or setup.ep != 1:
        raise ValueError(f"--strategy {strategy} takes --dp/--tp only (got --pp {setup.pp} --ep {setup.ep})")
    if strategy == "tp" and setup.dp != 1:
        raise ValueError(f"--strategy tp with --dp {setup.dp}: use --strategy dp_tp for a DP × TP grid")
    check_split(setup)
    return setup.dp * setup.tp


def check_split(setup: Setup) -> None:
    """ValueError before anything starts where a layer has fewer heads or hidden units than tp
    ranks (`_part` would raise on every rank once the ranks run)."""
    for layer in setup.model.layers():
        for what, name in (("heads", "heads"), ("hidden", "hidden units")):
            count = getattr(layer, what, None)
            if count is not None and count < setup.tp:
                raise ValueError(f"tensor parallel: {count} {name} cannot be split over tp = {setup.tp} "
                                 f"ranks; every rank needs at least one (use --tp <= {count})")


def train(comm, setup: Setup) -> RunResult:
    """One rank of `tp` / `dp_tp`: forward and backward with TP all-reduces, DP gradient sync, update."""
    if setup.model.experts:
        raise ValueError("tensor parallel: MoE MLPs are not split; use --experts 0")
    tp_comm, dp_comm = tensor_parallel_groups(comm, setup.dp, setup.tp)
    dp_index = dp_comm.rank
    stage = TensorParallelStage(setup.model, tp_comm, dtype=setup.compute_dtype)
    full_model = setup.build()
    params = stage.shard(setup.initial_params(full_model))
    grads = np.zeros_like(params)
    master = params.astype(np.float32) if setup.mixed else None
    optimizer = setup.optimizer_for(params.size)
    records, phases = [], []
    for step in range(setup.steps):
        tp_comm.reset_stats()
        dp_comm.reset_stats()
        start = time.perf_counter()
        tokens, targets, scale = local_batch(setup, step, dp_index, setup.dp)
        loss, forward = 0.0, _phase(tp_comm)
        if len(tokens):   # all TP ranks of a DP group share its rows, so they skip together
            logits, caches = stage.forward(params, tokens)
            loss, dlogits = F.cross_entropy(logits, targets, scale)
            forward = _phase(tp_comm)
            stage.backward(params, grads, caches, dlogits)
        backward = {k: v - forward[k] for k, v in _phase(tp_comm).items()}
        if setup.dp > 1:
            sync_gradients(stage, grads, dp_comm)
        if master is not None:
            optimizer.step(master, grads.astype(np.float32))
            params[...] = master
        else:
            optimizer.step(params, grads)
        grads[...] = 0
        seconds = time.perf_counter() - start
        dp_phase = _phase(dp_comm)
        per: dict[str, dict[str, int]] = {}
        sent = received = 0
        for label, group in (("tp", tp_comm), ("dp", dp_comm)):
            s, r, by = traffic(group)
            sent, received = sent + s, received + r
            per.update({f"{label}.{name}": entry for name, entry in by.items()})
        # every TP rank has the same loss: the global loss sums over the DP group only
        total = float(dp_comm.all_reduce(np.array([loss]))[0]) if setup.dp > 1 else loss
        records.append(StepRecord(step, total, seconds, sent, received, per))
        phases.append({"rows": len(tokens), "forward": forward, "backward": backward, "dp": dp_phase})
    full = stage.gather(params)
    state = {"params": nbytes(params), "grads": nbytes(grads),
             "optimizer": nbytes(*([] if master is None else [master]), *optimizer.state_arrays)}
    extra = {"dp_index": dp_index, "tp_index": tp_comm.rank, "phases": phases,
             "local_parameters": int(params.size), "replicated_parameters": int(stage.replicated_index.size),
             "replicated_digest": _digest(params[to_device(stage.replicated_index, setup.device)]),
             "heads": [[layer.heads.start, layer.heads.stop] for layer in stage.layers
                       if isinstance(layer, TensorParallelAttention)][:1],
             "hidden": [[layer.hidden.start, layer.hidden.stop] for layer in stage.layers
                        if isinstance(layer, TensorParallelMLP)][:1]}
    tp_comm.close()
    dp_comm.close()
    return RunResult(setup_strategy(setup), comm.rank, comm.size, full_model.layout.parameters, records,
                     state, 0, to_host(full), replicated=False, extra=extra)


def setup_strategy(setup: Setup) -> str:
    return "tp" if setup.dp == 1 else "dp_tp"
