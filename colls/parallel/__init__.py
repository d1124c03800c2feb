"""Training reference loops: the same small model trained serially and by every parallel strategy.

    from colls.parallel import Setup, run
    results = run("zero2", Setup(steps=4), nprocs=4, transport="shm")   # one RunResult per rank
"""

from .common import RunResult, Setup
from .model import Model, ModelConfig
from .train import run

__all__ = ["Model", "ModelConfig", "RunResult", "Setup", "run"]
