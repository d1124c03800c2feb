"""`mpi4py.util` of the colls facade: `pkl5` (`from mpi4py.util import pkl5` under `install()`)."""
