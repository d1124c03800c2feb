"""The `MPI` namespace of the colls mpi4py facade: `from colls.compat import MPI`.

Mirrors the part of `mpi4py.MPI` that buffer-based scripts use: COMM_WORLD/COMM_SELF, the
uppercase collectives and point-to-point calls, requests, predefined datatypes and reduction
operations, and the environment queries. What colls cannot do (derived datatypes, inter-communicators,
one-sided windows, MPI I/O, the pickle-based lowercase methods, wildcard receives) raises
`NotImplementedError` naming the feature.
"""

from __future__ import annotations

import socket
import time

from . import datatypes as _datatypes
from . import dlpack as _dlpack
from . import namespace as _namespace
from .attributes import (
    APPNUM,
    ERRHANDLER_NULL,
    ERRORS_ABORT,
    ERRORS_ARE_FATAL,
    ERRORS_RETURN,
    IO,
    KEYVAL_INVALID,
    LASTUSEDCODE,
    TAG_UB,
    UNIVERSE_SIZE,
    WTIME_IS_GLOBAL,
    Errhandler,
)
from .buffers import BOTTOM, IN_PLACE
from .comm import (
    COMM_NULL,
    COMM_SELF,
    COMM_TYPE_HW_GUIDED,
    COMM_TYPE_HW_UNGUIDED,
    COMM_TYPE_RESOURCE_GUIDED,
    COMM_TYPE_SHARED,
    COMM_WORLD,
    CONGRUENT,
    IDENT,
    SIMILAR,
    UNEQUAL,
    Comm,
    Intracomm,
)
from .comm import MPIException as Exception  # noqa: A004 - mpi4py's name
from .comm import lifecycle as _lifecycle
from .datatypes import UNDEFINED, Datatype
from .errors import ERROR_CLASSES as _ERROR_CLASSES
from .errors import Get_error_class, Get_error_string
from .group import GROUP_EMPTY, GROUP_NULL, Group
from .info import INFO_ENV, INFO_NULL, Info
from .intercomm import Intercomm
from .memory import Alloc_mem, Free_mem, buffer, memory
from .objects import ERR_ROOT, Pickle, _comm_lock_table, pickle
from .ops import (
    BAND,
    BOR,
    BXOR,
    LAND,
    LOR,
    LXOR,
    MAX,
    MAXLOC,
    MIN,
    MINLOC,
    NO_OP,
    OP_NULL,
    PROD,
    REPLACE,
    SUM,
    Op,
)
from .p2p import BSEND_OVERHEAD, MESSAGE_NO_PROC, MESSAGE_NULL, Attach_buffer, Detach_buffer, Message
from .request import (
    ANY_SOURCE,
    ANY_TAG,
    PROC_NULL,
    REQUEST_NULL,
    SUCCESS,
    Grequest,
    Prequest,
    Request,
    Status,
)
from .topocomm import Cartcomm, Distgraphcomm, Graphcomm, Topocomm
from .topology import CART, DIST_GRAPH, GRAPH, UNWEIGHTED, WEIGHTS_EMPTY
from .topology import compute_dims as Compute_dims

globals().update(_datatypes.PREDEFINED)   # MPI.INT, MPI.DOUBLE, MPI.C_BOOL, MPI.DOUBLE_INT, ...
globals().update(_datatypes.CONSTANTS)   # MPI.COMBINER_*, MPI.ORDER_C, MPI.DISTRIBUTE_*, MPI.TYPECLASS_*
INT_INT = _datatypes.PREDEFINED["TWOINT"]
TypeDict = dict(_datatypes.TYPE_DICT)

VERSION, SUBVERSION = 4, 1
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
ROOT = -3
MAX_PROCESSOR_NAME = 256
MAX_LIBRARY_VERSION_STRING = 8192
globals().update({name: code for name, (code, _) in _ERROR_CLASSES.items()})   # MPI.ERR_TRUNCATE, ...


def Init() -> None:
    """Initialize MPI: needed only under `mpi4py.rc.initialize = False` (the world is set up when
    COMM_WORLD is first used).

    Raises:
        Exception: MPI is already initialized (as MPI_Init called twice).
    """
    if _lifecycle.ready():
        raise Exception("MPI.Init: MPI is already initialized (mpi4py initializes it on import unless "
                        "mpi4py.rc.initialize is False)")
    _lifecycle.initialized = True


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    """Init; returns the thread level provided: THREAD_MULTIPLE."""
    Init()
    return THREAD_MULTIPLE


def Finalize() -> None:
    """Mark the library finalized (colls closes its world at exit)."""
    _lifecycle.finalized = True


def Is_initialized() -> bool:
    """Whether MPI is initialized (at import, unless `mpi4py.rc.initialize` is False)."""
    return _lifecycle.ready()


def Is_finalized() -> bool:
    """Whether Finalize was called."""
    return _lifecycle.finalized


def Query_thread() -> int:
    """THREAD_MULTIPLE: several threads may call at once (different communicators, or distinct tags)."""
    return THREAD_MULTIPLE


def Is_thread_main() -> bool:
    """Whether this is the main thread."""
    import threading

    return threading.current_thread() is threading.main_thread()


def Get_version() -> tuple[int, int]:
    """The MPI standard version whose interface the facade follows: (4, 1), as MPICH reports."""
    return (VERSION, SUBVERSION)


def get_vendor() -> tuple[str, tuple[int, int, int]]:
    """("colls", colls' version): this is colls' mpi4py facade, not an MPI library."""
    import colls

    return ("colls", tuple(int(part) for part in colls.__version__.split(".")[:3]))  # type: ignore[return-value]


def Get_library_version() -> str:
    """A line naming the facade and the transport of the world communicator."""
    import colls

    return f"colls {colls.__version__} (mpi4py-compatible facade over colls' transports and algorithms)"


def Get_processor_name() -> str:
    """This machine's host name."""
    return socket.gethostname()


def Wtime() -> float:
    """Seconds on a monotonic high-resolution clock."""
    return time.perf_counter()


def Wtick() -> float:
    """Resolution of Wtime in seconds."""
    return time.get_clock_info("perf_counter").resolution


def Get_address(location: object) -> int:
    """The address of a buffer's first byte, for displacements from MPI.BOTTOM."""
    return _dlpack.address_of(location)


def Aint_add(base: int, disp: int) -> int:
    """base + disp (addresses are plain integers)."""
    return int(base) + int(disp)


def Aint_diff(addr1: int, addr2: int) -> int:
    """addr1 - addr2."""
    return int(addr1) - int(addr2)


def _refuse(cls, *args: object, **kwargs: object) -> None:
    raise NotImplementedError(f"{cls.feature} is not supported by the colls mpi4py facade")


_Unsupported = _namespace.Unsupported   # a class whose objects cannot be made: says which feature



class Win(_Unsupported, feature="one-sided communication (MPI.Win)"):
    """Not supported: one-sided communication."""

    Create = Allocate = Allocate_shared = Create_dynamic = classmethod(_refuse)


class File(_Unsupported, feature="MPI I/O (MPI.File)"):
    """Not supported: MPI I/O."""

    Open = Delete = classmethod(_refuse)


WIN_NULL = FILE_NULL = None

__all__ = [
    "ANY_SOURCE", "ANY_TAG", "BAND", "BOR", "BOTTOM", "BXOR", "COMM_NULL", "COMM_SELF", "COMM_WORLD",
    "CONGRUENT", "Comm", "Datatype", "Exception", "IDENT", "IN_PLACE", "Intracomm", "LAND", "LOR", "LXOR",
    "MAX", "MAXLOC", "MIN", "MINLOC", "NO_OP", "OP_NULL", "Op", "PROC_NULL", "PROD", "REPLACE",
    "REQUEST_NULL", "Request", "SIMILAR", "SUCCESS", "SUM", "Status", "UNDEFINED", "UNEQUAL",
    *_datatypes.PREDEFINED,
    "BSEND_OVERHEAD", "ERR_ROOT", "MESSAGE_NO_PROC", "MESSAGE_NULL", "Attach_buffer", "Detach_buffer",
    "Grequest", "Message", "Pickle", "Prequest", "_comm_lock_table", "pickle",
]
__all__ += [
    "APPNUM", "CART", "COMM_TYPE_HW_GUIDED", "COMM_TYPE_HW_UNGUIDED", "COMM_TYPE_RESOURCE_GUIDED",
    "COMM_TYPE_SHARED", "Cartcomm", "Compute_dims", "DIST_GRAPH", "Distgraphcomm", "ERRHANDLER_NULL",
    "Graphcomm",
    "ERRORS_ABORT", "ERRORS_ARE_FATAL", "ERRORS_RETURN", "Errhandler", "GRAPH", "GROUP_EMPTY", "GROUP_NULL",
    "Group", "INFO_ENV", "INFO_NULL", "IO", "Info", "Intercomm", "KEYVAL_INVALID", "LASTUSEDCODE", "TAG_UB",
    "Topocomm", "UNIVERSE_SIZE", "UNWEIGHTED", "WEIGHTS_EMPTY", "WTIME_IS_GLOBAL", "Alloc_mem", "Free_mem",
    "buffer", "memory", "Get_error_class", "Get_error_string",
]
__all__ += _namespace.complete(globals())   # every other name of mpi4py.MPI: a constant, or a refusal
