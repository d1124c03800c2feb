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
from .buffers import BOTTOM, IN_PLACE
from .comm import (
    COMM_NULL,
    COMM_SELF,
    COMM_WORLD,
    CONGRUENT,
    IDENT,
    SIMILAR,
    UNEQUAL,
    Comm,
    Intracomm,
)
from .comm import MPIException as Exception  # noqa: A004 - mpi4py's name
from .datatypes import UNDEFINED, Datatype
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
from .request import ANY_SOURCE, ANY_TAG, PROC_NULL, REQUEST_NULL, SUCCESS, Prequest, Request, Status

globals().update(_datatypes.PREDEFINED)   # MPI.INT, MPI.DOUBLE, MPI.C_BOOL, MPI.DOUBLE_INT, ...
globals().update(_datatypes.CONSTANTS)   # MPI.COMBINER_*, MPI.ORDER_C, MPI.DISTRIBUTE_*, MPI.TYPECLASS_*
INT_INT = _datatypes.PREDEFINED["TWOINT"]
TypeDict = dict(_datatypes.TYPE_DICT)

VERSION, SUBVERSION = 3, 1
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
ROOT = -3
KEYVAL_INVALID = -1
APPNUM = KEYVAL_INVALID
TAG_UB = (1 << 31) - 1
MAX_PROCESSOR_NAME = 256
MAX_LIBRARY_VERSION_STRING = 8192
ERR_OTHER, ERR_ARG, ERR_COMM, ERR_TYPE = 15, 12, 5, 3
_initialized = True
_finalized = False


def Init() -> None:
    """Nothing to do: the world is set up when COMM_WORLD is first used."""


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    """Returns the level provided: THREAD_SERIALIZED (one thread at a time per communicator)."""
    return THREAD_SERIALIZED


def Finalize() -> None:
    """Mark the library finalized (colls closes its world at exit)."""
    global _finalized
    _finalized = True


def Is_initialized() -> bool:
    """Always true: the facade needs no explicit Init."""
    return _initialized


def Is_finalized() -> bool:
    """Whether Finalize was called."""
    return _finalized


def Query_thread() -> int:
    """THREAD_SERIALIZED: calls on one communicator must not overlap from several threads."""
    return THREAD_SERIALIZED


def Is_thread_main() -> bool:
    """Whether this is the main thread."""
    import threading

    return threading.current_thread() is threading.main_thread()


def Get_version() -> tuple[int, int]:
    """The MPI standard version whose collectives the facade implements: (3, 1)."""
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


class _Unsupported:
    """A class of mpi4py that the facade does not offer; using it says which feature is missing."""

    feature = ""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"{self.feature} is not supported by the colls mpi4py facade")

    def __init_subclass__(cls, feature: str = "", **kwargs: object) -> None:
        cls.feature = feature



class Win(_Unsupported, feature="one-sided communication (MPI.Win)"):
    """Not supported: one-sided communication."""

    Create = Allocate = Allocate_shared = Create_dynamic = classmethod(_refuse)


class File(_Unsupported, feature="MPI I/O (MPI.File)"):
    """Not supported: MPI I/O."""

    Open = Delete = classmethod(_refuse)


class Intercomm(_Unsupported, feature="inter-communicators (MPI.Intercomm)"):
    """Not supported: inter-communicators."""


class Cartcomm(_Unsupported, feature="Cartesian topologies (MPI.Cartcomm)"):
    """Not supported: process topologies."""


class Graphcomm(_Unsupported, feature="graph topologies (MPI.Graphcomm)"):
    """Not supported: process topologies."""


class Group(_Unsupported, feature="MPI groups (MPI.Group)"):
    """Not supported: groups."""


class Info(_Unsupported, feature="MPI.Info objects"):
    """Not supported: info objects."""


class Grequest(_Unsupported, feature="generalized requests (MPI.Grequest)"):
    """Not supported: generalized requests."""


INFO_NULL = None
WIN_NULL = FILE_NULL = GROUP_NULL = None

__all__ = [
    "ANY_SOURCE", "ANY_TAG", "BAND", "BOR", "BOTTOM", "BXOR", "COMM_NULL", "COMM_SELF", "COMM_WORLD",
    "CONGRUENT", "Comm", "Datatype", "Exception", "IDENT", "IN_PLACE", "Intracomm", "LAND", "LOR", "LXOR",
    "MAX", "MAXLOC", "MIN", "MINLOC", "NO_OP", "OP_NULL", "Op", "PROC_NULL", "PROD", "REPLACE",
    "REQUEST_NULL", "Request", "SIMILAR", "SUCCESS", "SUM", "Status", "UNDEFINED", "UNEQUAL",
    *_datatypes.PREDEFINED,
    "BSEND_OVERHEAD", "ERR_ROOT", "MESSAGE_NO_PROC", "MESSAGE_NULL", "Attach_buffer", "Detach_buffer",
    "Message", "Pickle", "Prequest", "_comm_lock_table", "pickle",
]
