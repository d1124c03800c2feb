"""colls as a torch.distributed backend: `import colls.torch` registers "colls" for CPU tensors.

    import colls.torch
    import torch.distributed as dist
    dist.init_process_group("colls")      # under torchrun, `colls run` or mpiexec

`dist.new_group(ranks, backend="colls")` makes sub-groups; DistributedDataParallel, FSDP2 and
every `torch.distributed` collective then run over colls (shm by default; COLLS_TRANSPORT=mpi
under mpiexec). See docs/torch.md.

Importing it also sets torch's own THP_MEM_ALLOC_ENABLE=1 unless it is set already: torch then
asks for transparent huge pages for CPU tensors of 2 MiB and more, as numpy does for its arrays of
4 MiB and more (the kernel backs the 2 MiB-aligned stretches inside each tensor: torch aligns them
to 4 KiB only). A rank reading a peer's tensor (cross-memory attach) pins 512 times fewer pages,
which makes all_reduce from 16 MiB 1.5-1.8x faster (bench/RESULTS.md). torch reads the variable
once, at its first such allocation: import colls.torch before building the model.
"""

from __future__ import annotations

import os
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


os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, create_process_group, extended_api=True, devices=["cpu"])
prepare_environment()

__all__ = ["BACKEND", "ProcessGroupColls", "create_process_group"]
