"""`MPI.Intercomm`: inter-communicators are not supported; only the null one exists.

`Comm.Get_parent()` returns it (colls spawns no processes). Its methods raise MPI.ERR_COMM, as
MPI does for a null communicator; `Create_from_groups` refuses, naming the feature.
"""

from __future__ import annotations

from .comm import Comm, Intracomm, _Handle
from .group import Group


class Intercomm(Comm):
    """Inter-communicators are not supported: only the null one exists (`Comm.Get_parent()`)."""

    @classmethod
    def _check_kind(cls, handle: _Handle | None) -> None:
        if handle is not None:
            raise TypeError("Intercomm: the communicator is an intra-communicator")

    def _refuse(self, what: str) -> None:
        self._handle()   # MPI.COMM_NULL: an invalid communicator, as in MPI
        raise NotImplementedError(f"inter-communicators (Intercomm.{what}) are not supported by the colls "
                                  f"mpi4py facade")

    def Get_remote_group(self) -> Group:
        """Not supported: inter-communicators (the null one raises MPI.ERR_COMM)."""
        self._refuse("Get_remote_group")

    def Get_remote_size(self) -> int:
        """Not supported: inter-communicators (the null one raises MPI.ERR_COMM)."""
        self._refuse("Get_remote_size")

    def Merge(self, high: bool = False) -> Intracomm:
        """Not supported: inter-communicators (the null one raises MPI.ERR_COMM)."""
        self._refuse("Merge")

    remote_group = property(Get_remote_group, doc="Not supported: inter-communicators.")
    remote_size = property(Get_remote_size, doc="Not supported: inter-communicators.")

    @classmethod
    def Create_from_groups(cls, *args: object, **kwargs: object) -> Intercomm:
        """Not supported: inter-communicators."""
        raise NotImplementedError("inter-communicators (Intercomm.Create_from_groups) are not supported by "
                                  "the colls mpi4py facade")
