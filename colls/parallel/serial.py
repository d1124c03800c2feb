"""The serial reference: one process trains the model on each whole global batch.

Every parallel loop must reproduce this run (float64: relative difference <= 1e-10). `Replica` is
the full model state one data-parallel worker holds (parameters, gradients, optimizer state, and in
mixed precision fp32 master weights as in Micikevicius et al. 2018), shared by the serial, `ps` and
`ddp` loops.
"""

from __future__ import annotations

import numpy as np

from .common import RunResult, Setup, StepRecord, local_batch, nbytes
from .model import Model
from .placement import to_host


class Replica:
    """A whole copy of the model's training state."""

    def __init__(self, setup: Setup, model: Model, owns_optimizer: bool = True) -> None:
        self.model = model
        self.params = setup.initial_params(model)
        self.grads = model.zeros(setup.working_dtype)
        # a parameter-server worker keeps no optimizer (nor master weights): the server updates
        self.master = self.params.astype(np.float32) if setup.mixed and owns_optimizer else None
        self.optimizer = setup.optimizer_for(model.layout.total if owns_optimizer else 0)

    def step(self) -> None:
        """Apply the optimizer to the (already summed) gradients, then zero them."""
        if self.master is not None:
            self.optimizer.step(self.master, self.grads.astype(np.float32))
            self.params[...] = self.master
        else:
            self.optimizer.step(self.params, self.grads)
        self.grads[...] = 0

    def accumulate(self, tokens: np.ndarray, targets: np.ndarray, scale: float, done=None) -> float:
        """Forward and backward of one (micro-)batch, gradients added into `grads`."""
        if len(tokens) == 0:
            return 0.0
        source = self.model.flat_source(self.params)
        loss, caches = self.model.forward(source, tokens, targets, scale)
        self.model.backward(source, self.model.flat_source(self.grads), caches, done)
        return loss

    def state_bytes(self) -> dict[str, int]:
        """Bytes held between steps (the ZeRO paper's model states)."""
        master = [] if self.master is None else [self.master]
        return {"params": nbytes(self.params), "grads": nbytes(self.grads),
                "optimizer": nbytes(*master, *self.optimizer.state_arrays)}


def train_serial(setup: Setup) -> RunResult:
    """Train on whole global batches in one process; the reference for every other strategy."""
    import time

    model = setup.build()
    replica = Replica(setup, model)
    records = []
    for step in range(setup.steps):
        start = time.perf_counter()
        tokens, targets, scale = local_batch(setup, step, 0, 1)
        loss = replica.accumulate(tokens, targets, scale)
        replica.step()
        records.append(StepRecord(step, loss, time.perf_counter() - start, 0, 0))
    return RunResult("serial", 0, 1, model.layout.parameters, records, replica.state_bytes(), 0,
                     to_host(model.layout.pack(replica.params)).astype(np.float64))
