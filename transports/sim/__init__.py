"""The `sim` transport: the registered algorithms, unchanged, on a simulated cluster with virtual clocks.

Every rank runs the real algorithm code in its own thread, but only one thread runs at a time: a
discrete-event scheduler keyed on virtual time resumes a rank when what it waits for has completed,
and the rank runs until its next wait that cannot be satisfied yet (then it hands the baton straight
to the next runnable rank, so each resumption costs one thread switch).

Buffers may be *symbolic* (`symbolic(count, dtype)`): stride-0 views of one element, so a 1 GiB
buffer costs no memory; slicing, `np.empty_like` and `np.copyto` on them cost nothing real, and a
ufunc on them (an `Op` reducing) only charges γ per byte to the running rank's clock. Real (small)
buffers are delivered and reduced for real, so data-dependent control flow (a count exchanged first)
still works.

The cost model, stated (Thakur, Rabenseifner & Gropp 2005's α-β-γ, plus links):
- A rank sends from one *port* per route class ("intra" inside a node, "net" through its NIC), one
  message at a time in posting order (the single-port model): the port is busy α, then the bytes
  flow through every link of the route.
- Links are shared: each link splits its capacity equally among the flows crossing it, and a flow
  moves at the smallest share along its route (a local fair share, exact when flows meet at one
  bottleneck; it does not hand a flow's unused share to others as max-min fairness would).
- A receive completes when its data has arrived and it was posted; a receive-reduce γ·bytes later.
- Charges of γ (reductions in algorithm code) and of copies advance the running rank's own clock.

The package: `symbolic` (buffers without data), `network` (links, routes, time sharing), `ranks`
(per-rank state, fibers, cores), `world` (`SimWorld`, the scheduler), `transport` (`SimTransport`),
`symmetry` (symmetric ranks simulated once).
"""

from .network import IdealNetwork, Link, Route, TimeSharing
from .symbolic import SymbolicArray, is_symbolic, root_of, symbolic
from .symmetry import NotSymmetric, Symmetry
from .transport import REAL_COPY_BYTES, SimTransport
from .world import SimulationFailed, SimWorld

__all__ = [
    "REAL_COPY_BYTES",
    "IdealNetwork",
    "Link",
    "NotSymmetric",
    "Route",
    "SimTransport",
    "SimWorld",
    "SimulationFailed",
    "SymbolicArray",
    "Symmetry",
    "TimeSharing",
    "is_symbolic",
    "root_of",
    "symbolic",
]
