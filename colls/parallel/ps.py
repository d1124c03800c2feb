"""`ps`: data parallel with a parameter server (Li et al. 2014, "Scaling Distributed Machine
Learning with the Parameter Server"), as the seed article describes it.

Every worker holds the whole model and computes gradients on its slice of the batch; it pushes them
to the server (rank 0, which also works on a slice): a direct reduce, (n-1)·Ψ values into the
server. The server alone keeps the optimizer state, updates, and sends the new parameters back to
every worker (a direct broadcast, (n-1)·Ψ out of it), so all replicas stay identical. Simple; the
server's link carries everything, which is the bottleneck the ring removes.
"""

from __future__ import annotations

from .common import RunResult, Setup, StepTimer, local_batch
from .placement import to_host
from .serial import Replica

SERVER_RANK = 0


def train_ps(comm, setup: Setup) -> RunResult:
    """Train with gradients pushed to and parameters pulled from a server rank."""
    model = setup.build()
    server = comm.rank == SERVER_RANK
    replica = Replica(setup, model, owns_optimizer=server)
    records = []
    for step in range(setup.steps):
        timer = StepTimer(comm)
        tokens, targets, scale = local_batch(setup, step, comm.rank, comm.size)
        loss = replica.accumulate(tokens, targets, scale)
        # push: the server receives every worker's gradients and sums them in rank order
        comm.reduce(replica.grads, root=SERVER_RANK, algorithm="direct",
                    out=replica.grads if server else None)
        if server:
            replica.step()
        else:
            replica.grads[...] = 0
        # pull: the server sends the updated parameters to every worker
        comm.broadcast(replica.params, root=SERVER_RANK, out=replica.params, algorithm="direct")
        records.append(timer.finish(step, loss))
    return RunResult("ps", comm.rank, comm.size, model.layout.parameters, records, replica.state_bytes(),
                     0, to_host(model.layout.pack(replica.params)).astype("float64"))
