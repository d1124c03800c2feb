"""`mpi4py.rc`: the runtime options a script sets before `from mpi4py import MPI`.

The facade reads `initialize` (False: nothing works before `MPI.Init`); the others are kept for the
scripts that set or read them (colls always gives THREAD_MULTIPLE and raises exceptions on error).
"""

from __future__ import annotations


class Rc:
    """mpi4py's runtime configuration options: unknown options are a TypeError, as in mpi4py."""

    initialize = True
    threads = True
    thread_level = "multiple"
    finalize = None
    fast_reduce = True
    recv_mprobe = True
    irecv_bufsz = 32768
    errors = "exception"

    def __init__(self, **kwargs: object) -> None:
        self(**kwargs)

    def __setattr__(self, name: str, value: object) -> None:
        if not hasattr(self, name):
            raise TypeError(f"mpi4py.rc has no option {name!r}")
        super().__setattr__(name, value)

    def __call__(self, **kwargs: object) -> None:
        """Set the options given as keywords."""
        unknown = [key for key in kwargs if not hasattr(self, key)]
        if unknown:
            raise TypeError(f"mpi4py.rc: unexpected option {unknown[0]!r}")
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        return "<mpi4py.rc>"
