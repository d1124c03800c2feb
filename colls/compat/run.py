"""`python -m colls.compat.run script.py args…` (or `-m module args…`): run an unmodified mpi4py script
on colls, with `from mpi4py import MPI` giving the facade. `colls run --as-mpi4py -n 4 script.py`
starts every rank through this module; under `mpiexec` it works the same way.
"""

from __future__ import annotations

import sys

from colls.linebuffered import run_program


def _keep_real_mpi4py_for_colls() -> None:
    """Under mpiexec, colls' bootstrap (and its mpi transport) need the real mpi4py: set it up first.

    The world is created before the facade takes the name `mpi4py`, and the mpi transport keeps
    getting the real module when it makes sub-communicators (Dup, Split).
    """
    from colls.bootstrap import init, under_mpiexec

    if not under_mpiexec():
        return
    init()
    try:
        from mpi4py import MPI as real_mpi
    except ImportError:
        return
    import transports.mpi

    transports.mpi.import_mpi = lambda: real_mpi


def main(argv: list[str] | None = None) -> None:
    """Install the facade as `mpi4py`, then run the script or module as `__main__`."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments or arguments[:1] == ["-m"] and len(arguments) < 2:
        sys.exit("usage: python -m colls.compat.run (script.py | -m module) [args ...]")
    _keep_real_mpi4py_for_colls()
    from colls.compat import install

    install()
    run_program(arguments)


if __name__ == "__main__":
    main()
