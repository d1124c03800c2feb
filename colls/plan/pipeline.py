"""The 1F1B pipeline schedule (PipeDream-Flush; Narayanan et al. 2021), simulated on the cluster.

Every stage runs the real schedule: `p - s - 1` warm-up forwards, then one forward and one backward
in turn, then the remaining backwards; a forward waits for the previous stage's activations, a
backward for the next stage's gradient, and compute is virtual time on the rank's clock. The bubble
then comes out of the simulation; (p-1)/(m+p-1) is what it should be with free sends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from algorithms.channel import Channel
from transports.base import COLLECTIVE_TAG_BASE, Traffic
from transports.sim import IdealNetwork, SimTransport, SimWorld, symbolic

from .. import config
from .topology import Cluster


@dataclass(frozen=True)
class PipelineResult:
    """A simulated step: with the cluster's links, with free links, and the bytes a rank sent."""

    seconds: float
    seconds_free_links: float
    bytes_sent: int

    @property
    def send_seconds(self) -> float:
        """What the stage-to-stage sends add to the step."""
        return self.seconds - self.seconds_free_links


def one_f_one_b(transport: SimTransport, micro_batches: int, forward: float, backward: float,
                nbytes: int) -> int:
    """One stage's 1F1B schedule over its pipeline group `transport`; returns the bytes it sent."""
    stage, stages = transport.rank, transport.size
    traffic = Traffic(stages)
    activations = Channel(transport, COLLECTIVE_TAG_BASE, math.inf, "pp forward", traffic)
    gradients = Channel(transport, COLLECTIVE_TAG_BASE + 1, math.inf, "pp backward", traffic)
    sends = []

    def run_forward() -> None:
        if stage > 0:   # the previous stage's output is my input
            activations.wait(activations.recv(symbolic(nbytes, np.uint8), stage - 1))
        transport.elapse(forward)
        if stage < stages - 1:
            sends.append(activations.send(symbolic(nbytes, np.uint8), stage + 1))

    def run_backward() -> None:
        if stage < stages - 1:   # the gradient of my output comes back from the next stage
            gradients.wait(gradients.recv(symbolic(nbytes, np.uint8), stage + 1))
        transport.elapse(backward)
        if stage > 0:
            sends.append(gradients.send(symbolic(nbytes, np.uint8), stage - 1))

    warmup = min(stages - stage - 1, micro_batches)
    for _ in range(warmup):
        run_forward()
    for _ in range(micro_batches - warmup):
        run_forward()
        run_backward()
    for _ in range(warmup):
        run_backward()
    activations.wait(*sends)
    return sum(traffic.bytes_sent)


def simulate_pipeline(training, cluster: Cluster, forward: float, backward: float) -> PipelineResult:
    """Every pipeline of `training` running one 1F1B step at once on `cluster`."""
    groups = training.groups("pp")
    nbytes = training.activation_bytes // training.tp

    def run(network) -> tuple[float, int]:
        world = SimWorld(training.world, network, cluster.gamma, threads=config.get("COLLS_SIM_THREADS"))
        sent = world.run(lambda t: one_f_one_b(t.subgroup(groups[t.rank], None), training.micro_batches,
                                               forward, backward, nbytes))
        return max(world.finish_times), max(sent)

    seconds, sent = run(cluster.network())
    free, _ = run(IdealNetwork(training.world, 0.0, 0.0))
    return PipelineResult(seconds, free, sent)
