"""Symmetric ranks simulated once: a `SimWorld` that runs one rank per orbit of a relabelling group.

Where every rank's program and the network look the same up to a relabelling of the ranks, the
whole simulation does too: rank g(r) does at time t what rank r does, over the links g maps r's
links to. Then it is enough to simulate one representative per orbit, ranks 0 .. period-1, and to
send what a representative sends to another orbit's rank b = g(r) to r itself, as coming from
g⁻¹(sender): the same event sequence, with `order` times fewer ranks and messages.

Two groups, both of order size / period, whose orbits are {r, r + period, r + 2·period, ...}:
- "shift": r -> r + k·period (mod size): rings, where rank r talks to r ± 1;
- "xor": r -> r xor k·period (period and size powers of two): recursive halving and doubling,
  where rank r talks to r xor 2^i.

The network's side is checked, not assumed: for each route a representative takes, the routes
of all its images must have the same α and properties, and their links must form orbits of
distinct links of one capacity on which the group acts consistently (`NotSymmetric` otherwise).
Each orbit becomes one link of the quotient, whose flows are exactly the flows the full world
puts on any one link of the orbit. The programs' side is the caller's to know (`colls.plan.
simulate` names the algorithms that are symmetric); a program that is not deadlocks or mismatches
a message's size there, and the caller then simulates every rank.
"""

from __future__ import annotations

from dataclasses import replace

from .network import Link, Route


class NotSymmetric(RuntimeError):
    """The network (or the ranks' groups) are not the same up to the symmetry's relabelling."""


class Symmetry:
    """A group of relabellings of `size` ranks: `kind` "shift" or "xor" by multiples of `period`.

    Args:
        size: ranks in the world.
        period: ranks simulated (representatives 0 .. period-1); divides `size`.
        kind: "shift" (r -> r + k·period mod size) or "xor" (r -> r xor k·period).

    Raises:
        ValueError: a period that does not divide size, an unknown kind, or "xor" on sizes that
            are not powers of two.
    """

    def __init__(self, size: int, period: int, kind: str) -> None:
        if period < 1 or size % period:
            raise ValueError(f"symmetry: period {period} does not divide {size} ranks")
        if kind not in ("shift", "xor"):
            raise ValueError(f"symmetry: kind {kind!r} is not 'shift' or 'xor'")
        if kind == "xor" and (size & (size - 1) or period & (period - 1)):
            raise ValueError(f"symmetry: xor needs powers of two, not {size} ranks by {period}")
        self.size, self.period, self.kind = size, period, kind
        self.order = size // period
        self._coords: dict[Link, tuple[Link, int]] = {}   # link -> (its orbit's link, k: g_k(base))

    def __repr__(self) -> str:
        return f"Symmetry({self.size}, {self.period}, {self.kind!r})"

    def apply(self, k: int, rank: int) -> int:
        """The image of world `rank` under the group's element k."""
        if self.kind == "shift":
            return (rank + k * self.period) % self.size
        return rank ^ (k * self.period)

    def inverse(self, k: int) -> int:
        """The element undoing element k."""
        return (self.order - k) % self.order if self.kind == "shift" else k

    def compose(self, j: int, k: int) -> int:
        """The element doing k, then j (the groups are abelian)."""
        return (j + k) % self.order if self.kind == "shift" else j ^ k

    def locate(self, rank: int) -> tuple[int, int]:
        """(representative r, element k) with apply(k, r) == `rank`."""
        rep = rank % self.period
        return rep, (rank - rep) // self.period   # both groups: r + k·period, since r < period

    def route(self, network, src: int, dst: int) -> Route:
        """The quotient's route from representative `src` to world rank `dst`: the network's, its
        links replaced by their orbits' links, once every image of it is checked the same."""
        routes = [network.route(self.apply(k, src), self.apply(k, dst)) for k in range(self.order)]
        base = routes[0]
        if base.then is not None:
            raise NotSymmetric(f"route {src}->{dst} has a second stage")
        for k, other in enumerate(routes):
            if len(other.links) != len(base.links) or replace(other, links=base.links) != base:
                raise NotSymmetric(f"route {src}->{dst} differs from its image "
                                   f"{self.apply(k, src)}->{self.apply(k, dst)}")
        links = tuple(self._orbit([other.links[i] for other in routes]) for i in range(len(base.links)))
        if len(set(links)) != len(links):
            raise NotSymmetric(f"route {src}->{dst} crosses one orbit of links twice")
        return replace(base, links=links)

    def _orbit(self, images: list[Link]) -> Link:
        """The orbit's link of images[k] = g_k(images[0]), checking the action on links stays one
        (free, of one capacity, consistent with what earlier routes said)."""
        first = images[0]
        if len(set(images)) != len(images) or any(link.capacity != first.capacity for link in images):
            raise NotSymmetric(f"link {first.name}: its images are not distinct links of one capacity")
        coords = self._coords
        known = next(((j, coords[link]) for j, link in enumerate(images) if link in coords), None)
        if known is None:
            orbit, k0 = Link(f"{first.name}~{self.order}", first.capacity), 0
        else:   # images[j] = g_j(images[0]) = g_kj(base): images[0] = g_(kj - j)(base)
            j, (orbit, kj) = known
            k0 = self.compose(kj, self.inverse(j))
        for j, link in enumerate(images):
            want = (orbit, self.compose(j, k0))
            if coords.setdefault(link, want) != want:
                raise NotSymmetric(f"link {link.name}: the relabelling does not act on it consistently")
        return orbit

    def image_label(self, label: tuple, k: int) -> tuple:
        """A group label (`SimWorld.group`'s: parent's label, calls, members) relabelled by k."""
        if not label:
            return label
        parent, calls, members = label
        return (self.image_label(parent, k), calls, frozenset(self.apply(k, rank) for rank in members))
