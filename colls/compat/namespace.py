"""The rest of mpi4py's `MPI` namespace: constants, and refusals for what the facade leaves out.

`complete(globals())`, run last by `MPI.py`, adds every name of mpi4py 4.1's `MPI` module that the
facade's modules do not define: MPICH's values for the constants (one-sided, I/O, Fortran status
fields, ...), the persistent collectives (persistent.py), and for the features out of scope
(one-sided windows, MPI I/O, dynamic processes and ports, sessions, fault tolerance, generalized
requests, user-defined error classes, the MPI ABI) a class or function that raises
NotImplementedError naming the feature, never AttributeError. Names another module defines are left
as they are. `tests/test_compat_names.py` checks the list against the real mpi4py.
"""

from __future__ import annotations

from typing import Any

from . import persistent
from .buffers import _Constant
from .request import Request

CONSTANTS = {
    "BSEND_OVERHEAD": 96, "COMBINER_CONTIGUOUS": 3, "COMBINER_DARRAY": 14, "COMBINER_DUP": 2,
    "COMBINER_F90_COMPLEX": 16, "COMBINER_F90_INTEGER": 17, "COMBINER_F90_REAL": 15, "COMBINER_HINDEXED": 9,
    "COMBINER_HINDEXED_BLOCK": 19, "COMBINER_HVECTOR": 6, "COMBINER_INDEXED": 7,
    "COMBINER_INDEXED_BLOCK": 10, "COMBINER_NAMED": 1, "COMBINER_RESIZED": 18, "COMBINER_STRUCT": 12,
    "COMBINER_SUBARRAY": 13, "COMBINER_VALUE_INDEX": 20, "COMBINER_VECTOR": 4,
    "DISPLACEMENT_CURRENT": -54278278, "DISP_CUR": -54278278, "DISTRIBUTE_BLOCK": 121,
    "DISTRIBUTE_CYCLIC": 122, "DISTRIBUTE_DFLT_DARG": -49767, "DISTRIBUTE_NONE": 123, "F_ERROR": 4,
    "F_SOURCE": 2, "F_STATUS_SIZE": 5, "F_TAG": 3, "LOCK_EXCLUSIVE": 234, "LOCK_SHARED": 235,
    "MAX_DATAREP_STRING": 128, "MAX_ERROR_STRING": 512, "MAX_INFO_KEY": 255, "MAX_INFO_VAL": 1024,
    "MAX_OBJECT_NAME": 128, "MAX_PORT_NAME": 1024, "MAX_PSET_NAME_LEN": 256, "MAX_STRINGTAG_LEN": 256,
    "MODE_APPEND": 128, "MODE_CREATE": 1, "MODE_DELETE_ON_CLOSE": 16, "MODE_EXCL": 64, "MODE_NOCHECK": 1024,
    "MODE_NOPRECEDE": 8192, "MODE_NOPUT": 4096, "MODE_NOSTORE": 2048, "MODE_NOSUCCEED": 16384,
    "MODE_RDONLY": 2, "MODE_RDWR": 8, "MODE_SEQUENTIAL": 256, "MODE_UNIQUE_OPEN": 32, "MODE_WRONLY": 4,
    "ORDER_C": 56, "ORDER_F": 57, "ORDER_FORTRAN": 57, "SEEK_CUR": 602, "SEEK_END": 604, "SEEK_SET": 600,
    "TYPECLASS_COMPLEX": 3, "TYPECLASS_INTEGER": 2, "TYPECLASS_LOGICAL": 4, "TYPECLASS_REAL": 1,
    "WIN_BASE": 1711276033, "WIN_CREATE_FLAVOR": 1711276039, "WIN_DISP_UNIT": 1711276037,
    "WIN_FLAVOR": 1711276039, "WIN_FLAVOR_ALLOCATE": 2, "WIN_FLAVOR_CREATE": 1, "WIN_FLAVOR_DYNAMIC": 3,
    "WIN_FLAVOR_SHARED": 4, "WIN_MODEL": 1711276041, "WIN_SEPARATE": 1, "WIN_SIZE": 1711276035,
    "WIN_UNIFIED": 2,
}

# feature -> the module-level functions of mpi4py that belong to it
FUNCTIONS = {
    "dynamic processes (MPI.Open_port, Close_port, Publish_name, Lookup_name, Unpublish_name)":
        "Open_port Close_port Publish_name Lookup_name Unpublish_name",
    "user-defined error classes and codes (MPI.Add_error_class, Add_error_code, Remove_error_class)":
        "Add_error_class Add_error_code Add_error_string Remove_error_class Remove_error_code "
        "Remove_error_string",
    "the MPI ABI queries (MPI.Get_abi_version, Get_abi_info, Get_abi_fortran_info)":
        "Get_abi_version Get_abi_info Get_abi_fortran_info",
    "hardware resource information (MPI.Get_hw_resource_info)": "Get_hw_resource_info",
    "MPI I/O data representations (MPI.Register_datarep)": "Register_datarep",
}

# feature -> methods of the communicator classes that belong to it
COMM_METHODS = {
    "fault tolerance (ULFM: Comm.Revoke, Shrink, Agree, Ack_failed, Get_failed)":
        "Ack_failed Agree Iagree Get_failed Is_revoked Revoke Shrink Ishrink",
    "dynamic processes (Comm.Spawn, Accept, Connect, Join, Disconnect)":
        "Accept Connect Disconnect Join Spawn Spawn_multiple",
}
INTERCOMM_METHODS = "Create_from_groups Get_remote_group Get_remote_size Merge remote_group remote_size"

# out-of-scope classes: every public name of mpi4py's class
CLASSES = {
    "Win": ("one-sided communication (MPI.Win)",
            "Accumulate Allocate Allocate_shared Attach Call_errhandler Compare_and_swap Complete Create "
            "Create_dynamic Create_errhandler Create_keyval Delete_attr Detach Fence Fetch_and_op Flush "
            "Flush_all Flush_local Flush_local_all Free Free_keyval Get Get_accumulate Get_attr "
            "Get_errhandler Get_group Get_info Get_name Lock Lock_all Post Put Raccumulate Rget "
            "Rget_accumulate Rput Set_attr Set_errhandler Set_info Set_name Shared_query Start Sync Test "
            "Unlock Unlock_all Wait attrs f2py flavor free fromhandle fromint group group_rank group_size "
            "handle info model name py2f toint tomemory"),
    "File": ("MPI I/O (MPI.File)",
             "Call_errhandler Close Create_errhandler Delete Get_amode Get_atomicity Get_byte_offset "
             "Get_errhandler Get_group Get_info Get_position Get_position_shared Get_size Get_type_extent "
             "Get_view Iread Iread_all Iread_at Iread_at_all Iread_shared Iwrite Iwrite_all Iwrite_at "
             "Iwrite_at_all Iwrite_shared Open Preallocate Read Read_all Read_all_begin Read_all_end Read_at "
             "Read_at_all Read_at_all_begin Read_at_all_end Read_ordered Read_ordered_begin Read_ordered_end "
             "Read_shared Seek Seek_shared Set_atomicity Set_errhandler Set_info Set_size Set_view Sync "
             "Write "
             "Write_all Write_all_begin Write_all_end Write_at Write_at_all Write_at_all_begin "
             "Write_at_all_end Write_ordered Write_ordered_begin Write_ordered_end Write_shared amode "
             "atomicity f2py free fromhandle fromint group group_rank group_size handle info py2f size "
             "toint"),
    "Grequest": ("generalized requests (MPI.Grequest)",
                 "Cancel Complete Free Get_status Get_status_all Get_status_any Get_status_some Start Test "
                 "Testall Testany Testsome Wait Waitall Waitany Waitsome cancel complete f2py free "
                 "fromhandle "
                 "fromint get_status get_status_all get_status_any get_status_some handle py2f test testall "
                 "testany testsome toint wait waitall waitany waitsome"),
    "Session": ("MPI sessions (MPI.Session)",
                "Attach_buffer Call_errhandler Create_errhandler Create_group Detach_buffer Finalize "
                "Flush_buffer Get_errhandler Get_info Get_nth_pset Get_num_psets Get_pset_info Iflush_buffer "
                "Init Set_errhandler f2py free fromhandle fromint handle py2f toint"),
}
NULLS = {"WIN_NULL": "Win", "FILE_NULL": "File", "SESSION_NULL": "Session"}


def _refusal(feature: str, name: str) -> Any:
    def refuse(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"{feature} is not supported by the colls mpi4py facade")
    refuse.__name__ = name
    refuse.__doc__ = f"Not supported: {feature}."
    return refuse


class Unsupported:
    """A class of mpi4py for a feature the facade leaves out: only its null handle exists (`Win()`,
    MPI.WIN_NULL); its constructors and methods raise NotImplementedError naming the feature."""

    feature = ""

    def __new__(cls, handle: object = None) -> Unsupported:
        if handle is not None and not (isinstance(handle, Unsupported) and _root(type(handle)) is _root(cls)):
            raise TypeError(f"{cls.__name__}: expecting an MPI.{_root(cls).__name__}, got "
                            f"{type(handle).__name__}")
        return object.__new__(cls)   # the null handle, the only one there is

    def Get_name(self) -> str:
        """The null handle's name (MPI_WIN_NULL, ...)."""
        return f"MPI_{_root(type(self)).__name__.upper()}_NULL"

    def __init_subclass__(cls, feature: str = "", **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.feature = feature or cls.feature

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:   # every object is the null handle of its class
        return isinstance(other, Unsupported) and _root(type(self)) is _root(type(other))

    __hash__ = None   # type: ignore[assignment] - handles are unhashable in mpi4py

    def __reduce__(self) -> object:
        return (null_of, (type(self),))

    def free(self) -> None:
        """Nothing to free: the null handle."""


def _root(cls: type) -> type:
    """The facade's class under user subclasses (Win for a subclass of MPI.Win)."""
    return next(c for c in reversed(cls.__mro__) if issubclass(c, Unsupported) and c is not Unsupported)


def null_of(cls: type) -> Unsupported:
    """The null handle of an out-of-scope class."""
    return object.__new__(cls)


def _refusing_class(name: str, feature: str, members: str, module: str) -> type:
    namespace: dict[str, Any] = {"__doc__": f"Not supported: {feature}.", "__module__": module}
    for member in members.split():
        if not hasattr(Unsupported, member):   # (free: the null handle's, a no-op)
            namespace[member] = staticmethod(_refusal(feature, f"{name}.{member}"))
    return type(name, (Unsupported,), namespace, feature=feature)


def flush_buffer() -> None:
    """Nothing to flush: buffered sends are sends (the attached buffer stays unused)."""


def iflush_buffer() -> Request:
    """Nothing to flush: a request that is already complete."""
    return Request()


def pcontrol(level: int) -> None:
    """Profiling control: no profiler listens, so nothing to do (as MPI allows)."""


def complete(namespace: dict[str, Any]) -> list[str]:
    """Add the names above that `namespace` (the MPI module's) lacks; returns the names added."""
    added = []

    def add(name: str, value: Any) -> None:
        if name not in namespace:
            namespace[name] = value
            added.append(name)

    for name, value in CONSTANTS.items():
        add(name, value)
    for feature, names in FUNCTIONS.items():
        for name in names.split():
            add(name, _refusal(feature, f"MPI.{name}"))
    add("Flush_buffer", flush_buffer)
    add("Iflush_buffer", iflush_buffer)
    add("Pcontrol", pcontrol)
    add("BUFFER_AUTOMATIC", _Constant("BUFFER_AUTOMATIC"))
    add("BufferAutomaticType", type(namespace["BUFFER_AUTOMATIC"]))
    add("BottomType", type(namespace["BOTTOM"]))
    add("InPlaceType", type(namespace["IN_PLACE"]))
    for name, (feature, members) in CLASSES.items():
        cls = namespace.get(name)
        if cls is None:
            add(name, _refusing_class(name, feature, members, namespace["__name__"]))
        else:
            for member in members.split():
                if not hasattr(cls, member):
                    setattr(cls, member, staticmethod(_refusal(feature, f"{name}.{member}")))
    for name, cls_name in NULLS.items():
        if namespace.get(name) is None:
            namespace.pop(name, None)
            add(name, null_of(namespace[cls_name]))
    comm = namespace["Comm"]
    persistent.install(comm, persistent.COLLECTIVES)
    persistent.install(namespace["Topocomm"], persistent.NEIGHBOURHOOD)
    for feature, names in COMM_METHODS.items():
        for name in names.split():
            if not hasattr(comm, name):
                setattr(comm, name, _refusal(feature, f"Comm.{name}"))
    for name, method in (("Flush_buffer", flush_buffer), ("Iflush_buffer", iflush_buffer)):
        if not hasattr(comm, name):
            setattr(comm, name, lambda self, _method=method: _method())
    for name in INTERCOMM_METHODS.split():
        if not hasattr(namespace["Intercomm"], name):
            setattr(namespace["Intercomm"], name, _refusal("inter-communicators (MPI.Intercomm)",
                                                           f"Intercomm.{name}"))
    return added
