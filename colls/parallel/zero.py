"""`zero1`, `zero2`, `zero3`: ZeRO-DP (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models"), stages P_os, P_os+g and P_os+g+p.

Every layer's segment of the flat buffer is padded to a multiple of n and cut in n equal chunks;
rank r owns chunk r of every layer (as FSDP cuts each unit's flat parameter, Zhao et al. 2023), and
its *shard* is those chunks back to back. The optimizer update is elementwise, so each rank updates
its shard exactly as serial training updates those elements.

- stage 1 (optimizer state): full parameters and gradients on every rank; after backward each
  layer's gradient is reduce-scattered (the owner gets the sum of its chunk), the owner updates its
  chunk, and each layer's parameters are all-gathered: Ψ(n-1)/n + Ψ(n-1)/n, the 2Ψ of plain DP.
- stage 2 (+ gradients): as stage 1, but each layer's gradient is reduce-scattered *during*
  backward, as soon as that layer is done, into a persistent gradient shard; the layer's full
  gradient is a temporary freed at once.
- stage 3 (+ parameters): only the shard persists; each layer is all-gathered just before its
  forward, freed after, gathered again for its backward, its gradient reduce-scattered and both
  freed: 3Ψ(n-1)/n, 1.5x DP.
"""

from __future__ import annotations

import numpy as np

from .common import RunResult, Setup, StepTimer, local_batch, nbytes
from .model import Model
from .placement import to_host

COLLECTIVE_ALGORITHM = "ring"   # reduce-scatter and all-gather: (n-1)/n of the buffer per rank


class Shards:
    """Where rank `rank`'s chunk of every layer sits, in the flat buffer and in its shard."""

    def __init__(self, model: Model, rank: int, size: int) -> None:
        self.layout = model.layout
        self.rank, self.size = rank, size
        self.chunks = [s.padded // size for s in self.layout.segments]
        self.offsets = np.concatenate([[0], np.cumsum(self.chunks)]).astype(int).tolist()
        self.total = self.offsets[-1]

    def of_shard(self, shard: np.ndarray, index: int) -> np.ndarray:
        """Layer `index`'s chunk inside a shard buffer."""
        return shard[self.offsets[index]: self.offsets[index + 1]]

    def of_flat(self, flat: np.ndarray, index: int) -> np.ndarray:
        """This rank's chunk of layer `index` inside a full flat buffer."""
        start = self.layout.segments[index].start + self.rank * self.chunks[index]
        return flat[start: start + self.chunks[index]]

    def gather_from_flat(self, flat: np.ndarray) -> np.ndarray:
        """This rank's chunks of a full flat buffer, as one shard (a copy)."""
        return np.concatenate([self.of_flat(flat, i) for i in range(len(self.chunks))])


class Transient:
    """Counts the bytes of temporaries alive inside a step (gathered layers, layer gradients)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def take(self, array: np.ndarray) -> np.ndarray:
        self.live += array.nbytes
        self.peak = max(self.peak, self.live)
        return array

    def drop(self, array: np.ndarray) -> None:
        self.live -= array.nbytes


def train_zero(comm, setup: Setup, stage: int) -> RunResult:
    """Train with ZeRO stage 1, 2 or 3 over `comm`."""
    if stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage {stage}: choose 1, 2 or 3")
    n = comm.size
    model = setup.build(align=n)
    layout, shards = model.layout, Shards(model, comm.rank, n)
    working = setup.working_dtype
    full_params = setup.initial_params(model)
    # persistent state: what each stage keeps between steps
    params = full_params if stage < 3 else shards.gather_from_flat(full_params)
    grads = model.zeros(working) if stage == 1 else model.xp.zeros(shards.total, working)
    master = shards.gather_from_flat(full_params).astype(np.float32) if setup.mixed else None
    optimizer = setup.optimizer_for(shards.total)
    del full_params
    transient = Transient()
    gathered: dict[int, np.ndarray] = {}
    layer_grads: dict[int, np.ndarray] = {}

    def gather_layer(index: int) -> dict[str, np.ndarray]:
        """ZeRO-3: all-gather layer `index` from every rank's chunk, just before it is used."""
        buffer = transient.take(comm.all_gather(shards.of_shard(params, index),
                                                algorithm=COLLECTIVE_ALGORITHM))
        gathered[index] = buffer
        return layout.views(buffer, index, local=True)

    def release_layer(index: int) -> None:
        transient.drop(gathered.pop(index))

    def layer_grad_buffer(index: int) -> dict[str, np.ndarray]:
        """ZeRO-2/3: a zeroed full-size gradient for layer `index`, alive only during its backward."""
        buffer = transient.take(model.xp.zeros(layout.segments[index].padded, working))
        layer_grads[index] = buffer
        return layout.views(buffer, index, local=True)

    def scatter_layer_grad(index: int) -> None:
        """ZeRO-2/3: layer `index` is done: its summed chunk goes to its owner, the rest is freed."""
        buffer = layer_grads.pop(index)
        comm.reduce_scatter(buffer, out=shards.of_shard(grads, index), algorithm=COLLECTIVE_ALGORITHM)
        transient.drop(buffer)
        if stage == 3:
            release_layer(index)

    if stage < 3:
        source, release = model.flat_source(params), None
    else:
        source, release = gather_layer, release_layer
    sink = model.flat_source(grads) if stage == 1 else layer_grad_buffer
    done = None if stage == 1 else scatter_layer_grad

    records = []
    for step in range(setup.steps):
        timer = StepTimer(comm)
        tokens, targets, scale = local_batch(setup, step, comm.rank, n)
        loss = 0.0
        if len(tokens):
            loss, caches = model.forward(source, tokens, targets, scale, release)
            model.backward(source, sink, caches, done)
        else:   # no rows this step: still take part in every layer's collectives, in order
            layers = range(len(layout.segments))
            for index in layers if stage == 3 else ():
                source(index)
                release_layer(index)
            for index in reversed(layers) if stage > 1 else ():
                if stage == 3:
                    source(index)
                layer_grad_buffer(index)
                scatter_layer_grad(index)
        if stage == 1:   # the full gradient exists: reduce-scatter it layer by layer into a shard
            grad_shard = transient.take(model.xp.empty(shards.total, working))
            for index in range(len(layout.segments)):
                comm.reduce_scatter(layout.segment(grads, index), out=shards.of_shard(grad_shard, index),
                                    algorithm=COLLECTIVE_ALGORITHM)
            grads[...] = 0
        else:
            grad_shard = grads
        # the owner's update of its shard (fp32 master weights in mixed precision)
        if master is not None:
            optimizer.step(master, grad_shard.astype(np.float32))
            updated = master
        elif stage == 3:
            optimizer.step(params, grad_shard)
            updated = params
        else:
            updated = transient.take(shards.gather_from_flat(params))
            optimizer.step(updated, grad_shard)
        if stage == 3:
            if master is not None:
                params[...] = master
        else:   # every rank gets every owner's updated chunk of every layer
            for index in range(len(layout.segments)):
                chunk = shards.of_shard(updated, index).astype(working)
                comm.all_gather(chunk, out=layout.segment(params, index), algorithm=COLLECTIVE_ALGORITHM)
            if master is None:
                transient.drop(updated)
        if stage == 1:
            transient.drop(grad_shard)
        else:
            grads[...] = 0
        records.append(timer.finish(step, loss))

    if stage == 3:   # for the report only: assemble the whole model (not counted as training traffic)
        full = np.concatenate([comm.all_gather(shards.of_shard(params, i))
                               for i in range(len(shards.chunks))])
    else:
        full = params
    state = {"params": nbytes(params), "grads": nbytes(grads),
             "optimizer": nbytes(*([] if master is None else [master]), *optimizer.state_arrays)}
    return RunResult(f"zero{stage}", comm.rank, n, layout.parameters, records, state, transient.peak,
                     to_host(layout.pack(full)).astype(np.float64), replicated=stage < 3,
                     extra={"padded_parameters": layout.total, "shard_elements": shards.total})


def train_zero1(comm, setup: Setup) -> RunResult:
    """ZeRO stage 1: optimizer state sharded."""
    return train_zero(comm, setup, 1)


def train_zero2(comm, setup: Setup) -> RunResult:
    """ZeRO stage 2: optimizer state and gradients sharded."""
    return train_zero(comm, setup, 2)


def train_zero3(comm, setup: Setup) -> RunResult:
    """ZeRO stage 3: optimizer state, gradients and parameters sharded."""
    return train_zero(comm, setup, 3)
