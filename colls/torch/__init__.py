"""colls as a torch.distributed backend: `import colls.torch` registers "colls" for CPU tensors.

    import colls.torch
    import torch.distributed as dist
    dist.init_process_group("colls")      # under torchrun, `colls run` or mpiexec

`dist.new_group(ranks, backend="colls")` makes sub-groups; DistributedDataParallel, FSDP2 and
every `torch.distributed` collective then run over colls (shm by default; COLLS_TRANSPORT=mpi
under mpiexec). See docs/torch.md.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from .process_group import ProcessGroupColls
from .rendezvous import communicator, prepare_environment

BACKEND = "colls"


def create_process_group(options: dist.distributed_c10d._DistributedBackendOptions,
                         backend_options: object = None) -> ProcessGroupColls:
    """torch's constructor hook for the backend (`Backend.register_backend(..., extended_api=True)`).

    Args:
        options: the group's store (prefixed with its name), rank, size, timeout, name and world ranks.
        backend_options: `pg_options` of `init_process_group`/`new_group` (none are taken).

    Returns:
        The group's `ProcessGroupColls`.

    Raises:
        InvalidArgument: a transport the group cannot use (see `rendezvous.transport_for`).
    """
    comm = communicator(options.store, options.group_rank, options.group_size, options.timeout,
                        str(options.group_id), list(options.global_ranks_in_group))
    return ProcessGroupColls(comm, timedelta(seconds=comm.timeout))


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, create_process_group, extended_api=True, devices=["cpu"])
prepare_environment()

__all__ = ["BACKEND", "ProcessGroupColls", "create_process_group"]
