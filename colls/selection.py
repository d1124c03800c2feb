"""Which algorithm runs: `algorithm=`, else COLLS_ALGO (read when the communicator is made), else
what `colls tune` measured fastest for the group's size, else the cheapest by the cost model.

The model's constants (α, β, γ per transport) come from `colls tune`, which measures them on this
machine and saves them to COLLS_TUNE_FILE (default ~/.cache/colls/tune.json); without that file,
defaults measured on a 2-core machine are used. `colls tune` also times every algorithm of each
collective `colls bench` times at sizes from 8 B to 64 MiB on its ranks and saves which was
fastest where (a new rule only where another beats the one in force by 5%; rules per transport,
group size and collective, as Open MPI's tuned decision files): a group of that size follows them. Every
rank must choose the same algorithm, so the choice depends only on arguments that agree across
ranks (collective, group size, bytes) and on the file, which ranks of one machine share.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from algorithms import DEFAULTS, lookup, names
from algorithms.cost import Machine, predict

from . import config
from .plugins import load_environment

# Measured on the reference 2-core machine by `colls tune`; a tune file replaces them.
DEFAULT_MACHINES = {
    "local": Machine(alpha=8e-6, beta=1 / 8e9, gamma=1 / 11e9),
    "shm": Machine(alpha=5.5e-6, beta=1 / 8.5e9, gamma=1 / 11e9),
    "mpi": Machine(alpha=3.1e-6, beta=1 / 9.4e9, gamma=1 / 11e9),
}


def tune_file() -> Path:
    """Where `colls tune` saves what it measured (COLLS_TUNE_FILE)."""
    return Path(config.get("COLLS_TUNE_FILE"))


def read_tune_file() -> dict:
    """The tune file's table by transport name (empty if there is none or it does not parse)."""
    try:
        table = json.loads(tune_file().read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def load_machine(transport: str) -> Machine:
    """The cost constants for `transport`: tuned if a tune file has them, else the defaults."""
    try:
        entry = read_tune_file()[transport]
        return Machine(float(entry["alpha"]), float(entry["beta"]), float(entry["gamma"]))
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_MACHINES.get(transport, DEFAULT_MACHINES["shm"])


def _write_tune_file(table: dict) -> Path:
    path = tune_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(table, indent=2) + "\n")
    os.replace(partial, path)   # whole or not at all: ranks making communicators read it
    return path


def save_machine(transport: str, machine: Machine) -> Path:
    """Record tuned constants for `transport`, keeping the other transports' entries."""
    return save_tuned(transport, machine)


# A rule: (smallest bytes it applies from, algorithm), sorted by bytes; the last one whose bytes
# are at most the call's decides.
Rules = list[tuple[int, str]]


def save_rules(transport: str, size: int, collective: str, rules: Rules) -> Path:
    """Record which algorithm `colls tune` measured fastest for `collective` on `size` ranks over
    `transport`, by size, keeping everything else in the file."""
    return save_tuned(transport, None, size, {collective: rules})


def save_tuned(transport: str, machine: Machine | None, size: int = 0,
               rules: dict[str, Rules] | None = None) -> Path:
    """Record what `colls tune` measured for `transport` (constants, and rules for `size` ranks by
    collective) in one write, keeping everything else in the file."""
    table = read_tune_file()
    entry = table.get(transport) if isinstance(table.get(transport), dict) else {}
    if machine is not None:
        entry.update({"alpha": machine.alpha, "beta": machine.beta, "gamma": machine.gamma})
    if rules:
        found = entry.setdefault("rules", {}).setdefault(str(size), {})
        for collective, measured in rules.items():
            found[collective] = [[n, name] for n, name in measured]
    table[transport] = entry
    return _write_tune_file(table)


def load_rules(transport: str, size: int) -> dict[str, Rules]:
    """The measured rules for `size` ranks over `transport`, by collective (empty if none)."""
    try:
        found = read_tune_file()[transport]["rules"][str(size)]
        return {collective: sorted((int(n), str(name)) for n, name in rules)
                for collective, rules in found.items() if rules}
    except (KeyError, TypeError, ValueError):
        return {}


def ruled(rules: Rules, nbytes: int) -> str:
    """The algorithm `rules` give for a call of `nbytes` (the first rule's below every rule)."""
    chosen = rules[0][1]
    for start, name in rules:
        if nbytes < start:
            break
        chosen = name
    return chosen


def pins() -> dict[str, str]:
    """The algorithms COLLS_ALGO forces, by collective ("all_reduce:ring;broadcast:binomial")."""
    table = {}
    for item in config.get("COLLS_ALGO").split(";"):
        key, _, value = item.partition(":")
        if key.strip() and value.strip():
            table.setdefault(key.strip(), value.strip())
    return table



@dataclass(frozen=True)
class Explanation:
    """What `algorithm=None` would run for one call, and every candidate's predicted time."""

    collective: str
    nbytes: int
    size: int
    transport: str
    chosen: str
    reason: str
    predicted: dict[str, float]

    def __str__(self) -> str:
        lines = [f"{self.collective} of {self.nbytes} B on {self.size} ranks over {self.transport}: "
                 f"{self.chosen} ({self.reason})"]
        for name, seconds in sorted(self.predicted.items(), key=lambda item: item[1]):
            mark = "*" if name == self.chosen else " "
            cost = f"{seconds * 1e6:12.1f} us" if seconds != float("inf") else "    (no model)"
            lines.append(f" {mark} {name:<20} {cost}")
        return "\n".join(lines)


# Run hierarchically whenever a communicator's ranks span hosts (and some host holds several).
HIERARCHICAL = ("all_reduce", "broadcast", "all_to_all")


class Selector:
    """Chooses algorithms for one communicator (its transport, size, and whether it spans hosts)."""

    def __init__(self, transport: str, size: int, spans_hosts: bool = False) -> None:
        self.transport = transport
        self.size = size
        self.spans_hosts = spans_hosts
        self.machine = load_machine(transport)
        self.rules = load_rules(transport, size)   # what `colls tune` measured fastest, by size
        self.pinned = pins()   # COLLS_ALGO as it was when the communicator was made (as NCCL's env)
        load_environment()     # and COLLS_PLUGINS' schedules, which `algorithm=` may then name
        self._choices: dict[tuple, str] = {}   # (collective, bytes, commutative) -> name

    def explain(self, collective: str, nbytes: int, candidates: list[str] | None = None) -> Explanation:
        """The choice for `nbytes` with the reasoning; `candidates` limits the choice."""
        pool = names(collective) if candidates is None else candidates
        predicted = {name: predict(collective, name, self.size, nbytes, self.machine) for name in pool}
        pinned = self.pinned.get(collective)
        if pinned is not None:
            return Explanation(collective, nbytes, self.size, self.transport, pinned, "COLLS_ALGO", predicted)
        if self.spans_hosts and collective in HIERARCHICAL and "hierarchical" in pool:
            return Explanation(collective, nbytes, self.size, self.transport, "hierarchical",
                               "ranks span hosts", predicted)
        fallback = DEFAULTS[collective] if DEFAULTS[collective] in pool else pool[0]
        if collective == "all_to_all_v":
            # per-rank sizes differ in all_to_all_v, so a size-based choice could differ between ranks
            return Explanation(collective, nbytes, self.size, self.transport, fallback, "default", predicted)
        rules = self.rules.get(collective)
        if rules is not None and ruled(rules, nbytes) in pool:
            return Explanation(collective, nbytes, self.size, self.transport, ruled(rules, nbytes),
                               "measured fastest by colls tune", predicted)
        modelled = {name: t for name, t in predicted.items() if t != float("inf")}
        if not modelled:
            return Explanation(collective, nbytes, self.size, self.transport, fallback, "default", predicted)
        # among equal predictions (every algorithm costs nothing on a group of one) the default,
        # which does least there, then by name so that every rank picks the same
        best = min(modelled, key=lambda name: (modelled[name], name != fallback, name))
        return Explanation(collective, nbytes, self.size, self.transport, best, "cost model", predicted)

    def choose(self, collective: str, nbytes: int, commutative: bool = True) -> str:
        """The algorithm to run when none was asked for (memoised: this is on every call's path)."""
        key = (collective, nbytes, commutative)
        name = self._choices.get(key)
        if name is None:
            if len(self._choices) > 4096:
                self._choices.clear()
            name = self._choices[key] = self._choose(collective, nbytes, commutative)
        return name

    def _choose(self, collective: str, nbytes: int, commutative: bool) -> str:
        pool = [name for name in names(collective)
                if commutative or not lookup(collective, name).commutative_only]
        return self.explain(collective, nbytes, pool).chosen


def explain(collective: str, nbytes: int, comm) -> Explanation:
    """Which algorithm `comm` would run for a `collective` of `nbytes`, and the predicted times."""
    return Selector(comm.transport.name, comm.size, comm.layout.spans_hosts).explain(collective, nbytes)
