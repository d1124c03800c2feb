"""An mpi4py-compatible facade over colls: `from colls.compat import MPI`.

Scripts written against mpi4py's buffer API (`comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)`) run on
colls' transports and algorithms by changing that one import, or unchanged under
`colls run --as-mpi4py -n 4 script.py` (see `colls.compat.run`). `spawn` runs a function that uses
`MPI.COMM_WORLD` on ranks that are threads (`local`) or processes (`shm`).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

from . import MPI
from .comm import bind
from .rc import Rc, configure

__all__ = ["MPI", "bind", "install", "spawn"]


def install() -> types.ModuleType:
    """Make `import mpi4py` and `from mpi4py import MPI` give the facade in this process."""
    package = types.ModuleType("mpi4py", "colls' mpi4py-compatible facade (colls.compat)")
    package.__version__ = "4.1.2"   # type: ignore[attr-defined] - the mpi4py API the facade follows
    package.__path__ = []   # type: ignore[attr-defined] - a package, so `import mpi4py.MPI` works
    package.rc = Rc()   # type: ignore[attr-defined]
    package.get_include = package.get_config = _no_build_support   # type: ignore[attr-defined]

    def first_import(name: str) -> types.ModuleType:
        """`from mpi4py import MPI`, `mpi4py.MPI`: as mpi4py's import of MPI, read `rc` first."""
        if name != "MPI":
            raise AttributeError(f"module 'mpi4py' has no attribute {name!r}")
        configure(getattr(package, "rc", None), MPI.pickle)
        package.MPI = MPI   # type: ignore[attr-defined]
        sys.modules["mpi4py.MPI"] = MPI
        sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _MPIFinder)]
        return MPI

    package.__getattr__ = first_import   # type: ignore[attr-defined]
    sys.modules.pop("mpi4py.MPI", None)
    sys.meta_path[:] = [_MPIFinder(first_import),
                        *(finder for finder in sys.meta_path if not isinstance(finder, _MPIFinder))]
    sys.modules["mpi4py"] = package
    sys.modules["mpi4py.rc"] = package.rc   # type: ignore[assignment] - `import mpi4py.rc` works
    from . import util
    from .util import pkl5

    package.util = util   # type: ignore[attr-defined]
    sys.modules["mpi4py.util"] = util
    sys.modules["mpi4py.util.pkl5"] = pkl5
    return package


class _MPIFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `mpi4py.MPI` for `import mpi4py.MPI` (and importlib) until it is first imported."""

    def __init__(self, first_import: Callable[[str], types.ModuleType]) -> None:
        self.first_import = first_import

    def find_spec(self, fullname: str, path: object, target: object = None):
        if fullname != "mpi4py.MPI":
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> types.ModuleType:
        return self.first_import("MPI")

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _no_build_support(*args: object) -> None:
    raise NotImplementedError("the colls mpi4py facade has no C headers or build configuration")


def spawn(fn: Callable[..., Any], nprocs: int, transport: str = "local", args: tuple = (),
          timeout: float | None = None) -> list[Any]:
    """`colls.spawn`, with `MPI.COMM_WORLD` bound to each rank's communicator while `fn(*args)` runs."""
    import colls

    def rank_main(comm, *rank_args):
        with bind(comm):
            return fn(*rank_args)

    return colls.spawn(rank_main, nprocs, transport=transport, args=args, timeout=timeout)
