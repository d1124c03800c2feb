"""What colls is measured against, on the same ranks and the same buffers: MPI's own collectives
through mpi4py's buffer methods, and torch.distributed over Gloo when torch is importable.

Each implementation turns a `Case` into a `Prepared` call: the function timed, an optional untimed
step run before each call (Gloo's collectives work in place, so its output is refilled from the
input first), and the buffer holding this rank's result for the check.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from .cases import Case
from .spec import ROOT

GLOO_TIMEOUT_S = 600


@dataclass
class Prepared:
    """One implementation's call on one case."""

    call: Callable[[], object]
    result: np.ndarray | None
    before: Callable[[], object] | None = None


class MpiNative:
    """MPI's native collectives (MPICH's or Open MPI's own algorithm choice) on a duplicate of the world."""

    name = "mpi"
    label = "MPI"

    def __init__(self, world) -> None:
        from mpi4py import MPI

        self.comm = world.Dup()
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
                    "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}

    def unsupported(self, case: Case) -> str | None:
        """Why MPI cannot run this case, or None."""
        if case.collective in ("all_reduce", "reduce", "reduce_scatter") and case.op not in self.ops:
            return f"MPI has no {case.op} operator"
        return None

    def prepare(self, case: Case) -> Prepared:
        """The mpi4py call for `case` (buffer methods, MPI's datatype taken from the numpy dtype)."""
        comm, x, out = self.comm, case.x, case.out
        op = self.ops.get(case.op)
        root = case.rank == ROOT
        kind = case.collective
        if kind == "all_reduce":
            return Prepared(lambda: comm.Allreduce(x, out, op), out)
        if kind == "broadcast":
            buf = x if root else out   # MPI broadcasts in place: the root's input, the others' output
            return Prepared(lambda: comm.Bcast(buf, root=ROOT), buf)
        if kind == "reduce":
            target = out if root else None
            return Prepared(lambda: comm.Reduce(x, target, op, root=ROOT), out if root else None)
        if kind == "all_gather":
            return Prepared(lambda: comm.Allgather(x, out), out)
        if kind == "reduce_scatter":
            return Prepared(lambda: comm.Reduce_scatter_block(x, out, op), out)
        if kind == "all_to_all":
            return Prepared(lambda: comm.Alltoall(x, out), out)
        raise ValueError(f"no MPI baseline for {kind}")

    def close(self) -> None:
        """Free the duplicate communicator."""
        self.comm.Free()


def free_port() -> int:
    """A TCP port on the loopback interface that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Gloo:
    """torch.distributed with the Gloo backend, over a TCP store on 127.0.0.1."""

    name = "gloo"
    label = "Gloo"

    def __init__(self, world) -> None:
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        torch.set_num_threads(1)   # ranks share the cores; Gloo's own threads do the work
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # stay on the loopback interface
        port = world.bcast(free_port() if world.Get_rank() == 0 else None, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world.Get_rank(),
                                world_size=world.Get_size(), timeout=timedelta(seconds=GLOO_TIMEOUT_S))
        R = dist.ReduceOp
        self.ops = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX,
                    "band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}   # Gloo has no AVG

    @staticmethod
    def why_not() -> str | None:
        """None if torch.distributed with Gloo can be imported here, else why not."""
        try:
            import torch.distributed as dist
        except ImportError:
            return "torch is not installed (pip install 'colls[bench]')"
        if not dist.is_available() or not dist.is_gloo_available():
            return "this torch build has no Gloo backend"
        return None

    def unsupported(self, case: Case) -> str | None:
        """Why Gloo cannot run this case, or None."""
        if case.collective in ("all_reduce", "reduce", "reduce_scatter") and case.op not in self.ops:
            return f"Gloo has no {case.op} operator"
        return None

    def prepare(self, case: Case) -> Prepared:
        """The torch.distributed call for `case`, on tensors that share the numpy buffers."""
        dist = self.dist
        x, out = case.x, case.out
        tx, tout = self.torch.from_numpy(x), self.torch.from_numpy(out)
        op = self.ops.get(case.op)
        root = case.rank == ROOT
        kind = case.collective

        def refill() -> None:
            np.copyto(out, x)   # the in-place collectives start from the input every time

        if kind == "all_reduce":
            return Prepared(lambda: dist.all_reduce(tout, op=op), out, refill)
        if kind == "broadcast":
            tensor = tx if root else tout
            return Prepared(lambda: dist.broadcast(tensor, src=ROOT), x if root else out)
        if kind == "reduce":
            return Prepared(lambda: dist.reduce(tout, dst=ROOT, op=op), out if root else None, refill)
        if kind == "all_gather":   # torch 2.13 renamed all_gather_into_tensor; older ones lack the new name
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return Prepared(lambda: gather(tout, tx), out)
        if kind == "reduce_scatter":
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return Prepared(lambda: scatter(tout, tx, op=op), out)
        if kind == "all_to_all":
            return Prepared(lambda: dist.all_to_all_single(tout, tx), out)
        raise ValueError(f"no Gloo baseline for {kind}")

    def close(self) -> None:
        """Leave the process group."""
        self.dist.destroy_process_group()
