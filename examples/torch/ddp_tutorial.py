"""DistributedDataParallel on the CPU, laid out as PyTorch's "Getting Started with DDP" tutorial
lays out its `demo_basic` (a ToyModel, `setup`/`cleanup`, `mp.spawn`), with seeded data and a few
steps so that two runs can be compared loss by loss.

The only change a Gloo program needs is the backend's name (and `import colls.torch`):

    python examples/torch/ddp_tutorial.py --backend colls     # 2 processes over colls' shared memory
    python examples/torch/ddp_tutorial.py --backend gloo      # the same over Gloo: the same losses
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

import colls.torch  # noqa: F401 - registers the "colls" backend


def setup(rank, world_size, backend):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "12355")
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size, backend, steps):
    setup(rank, world_size, backend)
    torch.manual_seed(0)   # the same initial model everywhere (DDP broadcasts rank 0's anyway)
    model = ToyModel()
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)

    generator = torch.Generator().manual_seed(rank)   # each rank its own slice of the data
    for step in range(steps):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, generator=generator))
        labels = torch.randn(20, 5, generator=generator)
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item():.17g}", flush=True)
    cleanup()


def run_demo(demo_fn, world_size, backend, steps):
    mp.spawn(demo_fn, args=(world_size, backend, steps), nprocs=world_size, join=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="colls", help="colls or gloo")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    run_demo(demo_basic, args.world_size, args.backend, args.steps)
