"""`colls.init()`: find this process's peers from the launcher's or mpiexec's environment."""

from __future__ import annotations

import atexit
import os
import sys
import threading

from transports.errors import CollsError, InvalidArgument

from . import config
from .communicator import Communicator
from .describe import seconds

TRANSPORTS = ("local", "shm", "mpi", "cuda_ipc")
_MPI_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
_world: Communicator | None = None
_init_lock = threading.Lock()


def under_mpiexec() -> bool:
    """Whether mpiexec (MPICH's Hydra, Open MPI, MVAPICH) started this process."""
    return any(name in os.environ for name in _MPI_RANK_VARIABLES)


def init(transport: str | None = None, timeout: float | None = None) -> Communicator:
    """The world communicator: from `colls run`/`colls.spawn`, from mpiexec, or a group of one.

    The transport is `transport`, else COLLS_TRANSPORT, else `shm` under `colls run` and `mpi` under
    mpiexec. Ranks are grouped by host (COLLS_HOST, else the host name). Calling it again returns
    the same communicator.
    """
    global _world
    if timeout is not None and seconds(timeout) is None:
        raise InvalidArgument(f"colls.init: timeout must be a finite number of seconds > 0, "
                              f"got {timeout!r}")
    kind = (transport or "").lower() or config.get("COLLS_TRANSPORT")
    if kind is not None and kind not in TRANSPORTS:
        raise InvalidArgument(f"transport={kind!r}: choose one of {TRANSPORTS}")
    with _init_lock:   # two threads calling it at once get the one world
        if _world is not None and not _world.closed:
            if transport is not None and transport.lower() != _world.transport.name:
                raise InvalidArgument(f"colls.init(transport={transport!r}): this process already has a "
                                      f"world communicator over {_world.transport.name}")
            return _world
        if config.is_set("COLLS_RANK") and not under_mpiexec():
            _world = _from_launcher(kind or "shm", config.get("COLLS_RANK"), config.get("COLLS_WORLD_SIZE"),
                                    timeout)
        elif under_mpiexec():
            _world = _from_mpiexec(kind or "mpi", timeout)
        else:
            _world = _singleton(kind or "local", timeout)
        if _world.size > 1:
            _world.discover_hosts()   # ranks spread over hosts run all_reduce & co. hierarchically
            _abort_on_uncaught(_world)
        atexit.register(_world.close)
        return _world


def _abort_on_uncaught(world: Communicator) -> None:
    """An exception that ends this process outside a collective aborts the world first, so that the
    peers raise CommunicatorAborted naming this rank at once, not at their deadline: under mpiexec
    this process would otherwise wait in MPI_Finalize for them while they wait for it. As a call
    that fails (`Communicator._broken`), not for an error of colls' own, which the peers see for
    themselves (a lost peer: each survivor raises PeerLost naming it, not an abort by another)."""
    previous = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if world is _world and not world.closed and not issubclass(kind, CollsError):
            first = f"{kind.__name__}: {value}".splitlines()[0][:200]
            try:
                world.transport.abort(f"rank {world.rank} ended with an uncaught {first}")
            except Exception:   # noqa: BLE001 - the error being reported matters more
                pass
        previous(kind, value, traceback)

    sys.excepthook = hook


def _process_transport(kind: str):
    """A maker of the transport between processes of one machine: shm, or cuda_ipc (GPU buffers)."""
    if kind == "cuda_ipc":
        from transports.cuda_ipc import CudaIpcTransport as kind_class
    else:
        from transports.shm import ShmTransport as kind_class
    options = config.transport_options(kind)
    return lambda rank, size, exchange: kind_class(rank, size, exchange, **options)


def _from_launcher(kind: str, rank: int, size: int, timeout: float | None) -> Communicator:
    if kind in ("shm", "cuda_ipc"):
        from transports.bootstrap import FileBootstrap

        # the rendezvous waits as long as `timeout=` says, else 60 s (peers that never come are an
        # error soon, not after the five minutes a call may wait)
        rendezvous = FileBootstrap(str(config.get("COLLS_RENDEZVOUS")), rank, size,
                                   timeout=60.0 if timeout is None else timeout)
        return Communicator(_process_transport(kind)(rank, size, rendezvous.all_gather), timeout)
    if kind == "mpi":
        raise InvalidArgument("the mpi transport needs MPI's launcher: mpiexec -n N python script.py")
    raise InvalidArgument("the local transport runs ranks as threads of one process: use "
                          "colls.spawn(fn, nprocs, transport='local')")


def _from_mpiexec(kind: str, timeout: float | None) -> Communicator:
    from transports.mpi import MpiTransport, import_mpi, unlink_mpich_init_segments

    MPI = import_mpi()
    if kind == "mpi":
        return Communicator(MpiTransport(), timeout)
    if kind in ("shm", "cuda_ipc"):
        world = MPI.COMM_WORLD   # only to swap segment names and IPC handles: MPI's allgather
        comm = Communicator(_process_transport(kind)(world.Get_rank(), world.Get_size(), world.allgather),
                            timeout)
        unlink_mpich_init_segments()   # every rank is past MPI_Init (its allgathers): as the mpi transport
        return comm
    raise InvalidArgument("the local transport runs ranks as threads of one process; under mpiexec "
                          "use COLLS_TRANSPORT=mpi, shm or cuda_ipc")


def _singleton(kind: str, timeout: float | None) -> Communicator:
    """A group of one, for a plain `python script.py`."""
    if kind == "mpi":
        from transports.mpi import MpiTransport

        return Communicator(MpiTransport(), timeout)
    if kind in ("shm", "cuda_ipc"):
        return Communicator(_process_transport(kind)(0, 1, lambda data: [data]), timeout)
    from transports.local import LocalWorld

    return Communicator(LocalWorld(1).transport(0), timeout)
