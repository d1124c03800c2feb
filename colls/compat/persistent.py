"""Persistent collectives (MPI 4): `Allreduce_init`, `Bcast_init`, ..., `Neighbor_alltoall_init`.

Each returns a `Prequest` whose `Start` makes the nonblocking collective (`Iallreduce`, ...) with
the arguments given at init, so the buffers are read when the request starts, as MPI says; `Wait`
completes it, and it can be started again. (The `I...` forms the facade runs as schedules complete
before they return, so their `Start` does too.) `info` is accepted and not read.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .request import Prequest

COLLECTIVES = ("Allgather", "Allgatherv", "Allreduce", "Alltoall", "Alltoallv", "Alltoallw", "Barrier",
               "Bcast", "Exscan", "Gather", "Gatherv", "Reduce", "Reduce_scatter", "Reduce_scatter_block",
               "Scan", "Scatter", "Scatterv")
NEIGHBOURHOOD = ("Neighbor_allgather", "Neighbor_allgatherv", "Neighbor_alltoall", "Neighbor_alltoallv",
                 "Neighbor_alltoallw")


def _persistent(name: str, nonblocking: Callable[..., Any]) -> Callable[..., Prequest]:
    """`name`_init over the nonblocking method `nonblocking` (an extra positional argument is `info`)."""
    count = len(inspect.signature(nonblocking).parameters) - 1   # its arguments, self aside
    method_name = nonblocking.__name__

    def init(self, *args: Any, info: Any = None, **kwargs: Any) -> Prequest:
        arguments = args[:count]   # (args[count], if given, is info)
        return Prequest(lambda: getattr(self, method_name)(*arguments, **kwargs))

    init.__name__ = f"{name}_init"
    init.__doc__ = f"A persistent {name}: a Prequest whose Start makes {method_name} with these arguments."
    return init


def install(cls: type, names: tuple[str, ...]) -> list[str]:
    """Give `cls` the `_init` form of each collective in `names` it lacks; returns those added."""
    added = []
    for name in names:
        nonblocking = getattr(cls, f"I{name[0].lower()}{name[1:]}", None)
        if nonblocking is not None and not hasattr(cls, f"{name}_init"):
            setattr(cls, f"{name}_init", _persistent(name, nonblocking))
            added.append(f"{name}_init")
    return added
