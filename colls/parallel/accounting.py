"""Communication-volume and memory formulas the training loops print beside their measurements.

Memory of the model states per data-parallel rank, from ZeRO (Rajbhandari et al. 2020, section 5,
Figure 1): with Ψ parameters, P and G bytes per parameter and gradient, K bytes of optimizer state
per parameter (mixed-precision Adam: fp32 master + two fp32 moments, K = 12) and Nd ranks,

    baseline (P + G + K)Ψ    stage 1 (P + G)Ψ + KΨ/Nd    stage 2 PΨ + (G + K)Ψ/Nd    stage 3 (P + G + K)Ψ/Nd

and Ψ = 7.5e9, Nd = 64 gives 120, 31.4, 16.6 and 1.9 GB. Communication per rank and step: a ring
all-reduce sends 2(n-1)/n of the buffer (Patarasuk & Yuan 2009), ZeRO 1/2 the same (a
reduce-scatter and an all-gather of (n-1)/n each), ZeRO 3 1.5x (the all-gather twice), and a
parameter server takes (n-1) whole buffers in and sends (n-1) out (Li et al. 2014).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GB = 1e9


@dataclass(frozen=True)
class Bytes:
    """Bytes per parameter of this run: parameters (P), gradients (G), optimizer state (K)."""

    params: int
    grads: int
    optimizer: int

    @classmethod
    def mixed_adam(cls) -> Bytes:
        """The ZeRO paper's case: fp16 parameters and gradients, K = 12 (fp32 master, m, v)."""
        return cls(2, 2, 12)

    @classmethod
    def of_setup(cls, setup) -> Bytes:
        """The byte sizes a `Setup` runs with (K counts master weights when mixed)."""
        state = setup.state_dtype.itemsize
        moments = 2 if setup.optimizer == "adam" else 1
        master = 4 if setup.mixed else 0
        return cls(setup.working_dtype.itemsize, setup.working_dtype.itemsize, moments * state + master)


def zero_memory(psi: float, nd: int, sizes: Bytes | None = None) -> dict[str, dict[str, float]]:
    """Bytes of parameters, gradients and optimizer state per rank, for baseline DP and stages 1-3."""
    sizes = sizes or Bytes.mixed_adam()
    p, g, k = sizes.params * psi, sizes.grads * psi, sizes.optimizer * psi
    return {
        "baseline": {"params": p, "grads": g, "optimizer": k},
        "zero1": {"params": p, "grads": g, "optimizer": k / nd},
        "zero2": {"params": p, "grads": g / nd, "optimizer": k / nd},
        "zero3": {"params": p / nd, "grads": g / nd, "optimizer": k / nd},
    }


def zero_memory_totals_gb(psi: float = 7.5e9, nd: int = 64,
                          sizes: Bytes | None = None) -> dict[str, float]:
    """Total GB per rank per stage; the defaults are the paper's example (120 / 31.4 / 16.6 / 1.9)."""
    return {stage: sum(parts.values()) / GB for stage, parts in zero_memory(psi, nd, sizes).items()}


def state_formula(strategy: str, psi: float, n: int, sizes: Bytes, rank: int = 0) -> dict[str, float]:
    """The bytes `strategy` should hold on `rank` between steps (a PS worker keeps no optimizer)."""
    table = zero_memory(psi, n, sizes)
    if strategy in table:
        return table[strategy]
    parts = dict(table["baseline"])
    if strategy == "ps" and rank != 0:
        parts["optimizer"] = 0.0
    return parts


def ring_all_reduce_bytes(psi: float, n: int, bytes_per_value: int) -> float:
    """Bytes one rank sends in a ring all-reduce of Ψ values: 2(n-1)/n · Ψ · bytes."""
    return 2 * (n - 1) / n * psi * bytes_per_value


def volume_formula(strategy: str, psi: float, n: int, bytes_per_value: int) -> dict[str, float]:
    """Bytes per step: `sent` by a rank (for ps: by a worker), and `server_received`/`server_sent`."""
    if strategy in ("ddp", "zero1", "zero2"):
        return {"sent": ring_all_reduce_bytes(psi, n, bytes_per_value)}
    if strategy == "zero3":
        return {"sent": 1.5 * ring_all_reduce_bytes(psi, n, bytes_per_value)}
    if strategy == "ps":
        whole = psi * bytes_per_value
        return {"sent": whole if n > 1 else 0.0, "server_received": (n - 1) * whole,
                "server_sent": (n - 1) * whole}
    return {"sent": 0.0}


def volume_slack(strategy: str, n: int, calls: int, layers: int, bytes_per_value: int) -> float:
    """How far a measurement may sit from `volume_formula` because counts don't divide by n.

    A ring moves blocks of floor or ceil(count/n) elements: at most one element off in each of its
    2(n-1) steps, per call (DDP's buckets). ZeRO pads every layer to a multiple of n: at most n-1
    extra elements per layer, moved 2 (stages 1-2) or 3 (stage 3) times."""
    if strategy == "ddp":
        return calls * 2 * (n - 1) * bytes_per_value
    if strategy.startswith("zero"):
        return 3 * layers * (n - 1) * bytes_per_value
    return 0.0


def gradient_sync_example(psi: float = 100e9, bytes_per_value: int = 2, n: int = 1024) -> dict[str, float]:
    """The seed article's '100B fp16 model' sync: gradient size and bytes each rank sends (GB)."""
    return {"gradient_gb": psi * bytes_per_value / GB,
            "ring_sent_per_rank_gb": ring_all_reduce_bytes(psi, n, bytes_per_value) / GB,
            "ring_factor": float(np.float64(2 * (n - 1) / n))}
