"""How a torch process group's ranks find each other over colls.

Under `torchrun` (or any `init_method`), torch hands the backend its store: the ranks of each group
swap their shared-memory segment names through it (`StoreExchange`), as `colls.init()` swaps them
through files. Under `colls run` or `mpiexec`, where nobody set torch's variables,
`prepare_environment` (run by `import colls.torch`) sets them as torchrun would: RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and the port of a store that rank 0 serves.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch.distributed as dist

from colls import config
from colls.bootstrap import _process_transport, under_mpiexec
from colls.communicator import Communicator
from transports.base import Transport
from transports.errors import CollectiveTimeout, InvalidArgument

PORT_FILE = "torch-store-port"   # in the launcher's rendezvous directory: rank 0's store's port
PORT_WAIT_S = 60.0               # how long the other ranks wait for it (as colls' own rendezvous)
_store_server: dist.TCPStore | None = None   # rank 0's store, alive as long as the process


class StoreExchange:
    """All-gather of small bytes through torch's store: every rank sets its key, reads all keys."""

    def __init__(self, store: dist.Store, rank: int, size: int) -> None:
        self.store = store
        self.rank = rank
        self.size = size
        self.round = 0

    def __call__(self, data: bytes) -> list[bytes]:
        """Every rank's `data`, in rank order (a store `get` waits for a key up to the store's timeout)."""
        round_ = self.round
        self.round += 1
        self.store.set(f"colls/{round_}/{self.rank}", data)
        return [bytes(self.store.get(f"colls/{round_}/{peer}")) for peer in range(self.size)]


def transport_for(store: dist.Store, rank: int, size: int, global_ranks: list[int]) -> Transport:
    """The transport of one group: shm (default) set up through `store`; mpi (under mpiexec) over
    an MPI communicator of the group's ranks; local for a group of one.

    Args:
        store: the group's store (torch prefixes it with the group's name).
        rank, size: this process's rank in the group and the group's size.
        global_ranks: the group's ranks in the world ([] for the world itself).

    Returns:
        A colls transport for the group.

    Raises:
        InvalidArgument: COLLS_TRANSPORT names a transport a torch group cannot use here.
    """
    kind = config.get("COLLS_TRANSPORT") or "shm"
    if kind == "shm":
        return _process_transport(kind)(rank, size, StoreExchange(store, rank, size))
    if kind == "mpi":
        from transports.mpi import MpiTransport, import_mpi

        world = import_mpi().COMM_WORLD
        members = global_ranks or list(range(size))
        if not global_ranks and world.Get_size() != size:
            raise InvalidArgument(f"rank {rank}: COLLS_TRANSPORT=mpi: torch's world has {size} ranks, "
                                  f"MPI's {world.Get_size()}: start the job with mpiexec -n {size}")
        # MPI_Comm_create_group is collective over the group's members only, as torch calls us
        comm = world.Create_group(world.Get_group().Incl(members), tag=abs(hash(tuple(members))) % 32768)
        transport = MpiTransport(comm)
        comm.Free()
        return transport
    if kind == "local" and size == 1:
        from transports.local import LocalWorld

        return LocalWorld(1).transport(0)
    raise InvalidArgument(f"rank {rank}: COLLS_TRANSPORT={kind!r}: a torch process group runs over shm "
                          f"or mpi (local ranks are threads of one process; cuda_ipc moves cupy arrays)")


def communicator(store: dist.Store, rank: int, size: int, timeout: timedelta, name: str,
                 global_ranks: list[int]) -> Communicator:
    """The colls communicator of one torch group (see `transport_for`): its calls wait at most
    COLLS_TIMEOUT where that is set, else torch's `timeout` (init_process_group's, 30 min by default)."""
    transport = transport_for(store, rank, size, global_ranks)
    seconds = config.get("COLLS_TIMEOUT") if config.is_set("COLLS_TIMEOUT") else timeout.total_seconds()
    comm = Communicator(transport, seconds, f"torch:{name}")
    if transport.name == "mpi" and size > 1:
        comm.discover_hosts()   # ranks on several hosts: hierarchical collectives, as colls.init()
    return comm


def prepare_environment() -> None:
    """Under `colls run` or `mpiexec`, with no MASTER_ADDR set, set torch's env:// variables as
    torchrun does, so that `dist.init_process_group("colls")` needs no arguments.

    Rank 0 serves a TCPStore on a free port of 127.0.0.1 and says which (a file in the launcher's
    rendezvous directory; MPI's broadcast under mpiexec); every rank then uses it as torchrun's
    agent store (TORCHELASTIC_USE_AGENT_STORE). Under `colls run` the ranks wait for rank 0 here,
    at most PORT_WAIT_S seconds.

    Raises:
        CollectiveTimeout: rank 0 did not publish its store's port in time.
    """
    global _store_server
    if "MASTER_ADDR" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
        return   # torchrun or the user set them
    mpi = under_mpiexec()
    if mpi:
        from transports.mpi import import_mpi

        world = import_mpi().COMM_WORLD
        rank, size = world.Get_rank(), world.Get_size()
    elif config.is_set("COLLS_RANK"):
        rank, size = config.get("COLLS_RANK"), config.get("COLLS_WORLD_SIZE")
    else:
        return   # a plain `python script.py`: torch's own rules
    port = None
    if rank == 0:
        _store_server = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
        port = _store_server.port
    if mpi:
        port = world.bcast(port, root=0)
    else:
        port = _shared_port(rank, port)
    local_rank = config.get("COLLS_LOCAL_RANK") if config.is_set("COLLS_LOCAL_RANK") else rank
    for name, value in (("RANK", rank), ("WORLD_SIZE", size), ("LOCAL_RANK", local_rank),
                        ("LOCAL_WORLD_SIZE", size), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port),
                        ("TORCHELASTIC_USE_AGENT_STORE", "True")):
        os.environ.setdefault(name, str(value))


def _shared_port(rank: int, port: int | None) -> int:
    """Rank 0 writes its store's port into the rendezvous directory; the others read it."""
    path = os.path.join(str(config.get("COLLS_RENDEZVOUS")), PORT_FILE)
    if port is not None:
        with open(path + ".tmp", "w") as handle:
            handle.write(str(port))
        os.rename(path + ".tmp", path)
        return port
    deadline = time.monotonic() + PORT_WAIT_S
    while True:
        try:
            with open(path) as handle:
                return int(handle.read())
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise CollectiveTimeout(f"colls.torch: rank {rank} waited {PORT_WAIT_S:.0f} s for rank 0 "
                                        f"to import colls.torch and serve torch's store", (0,)) from None
            time.sleep(0.01)
