"""Mismatched collective calls caught without COLLS_DEBUG, at no extra message.

Every message of a call travels on a tag that carries the call's number and a fingerprint of what
was called (`transports.base.fingerprint`): a rank that finds a message of its call from a rank
that called something else raises `CollectiveMismatch` naming both calls and aborts the group, so
every other rank has an error within seconds (`CommunicatorAborted`, in the call or the next one).
On local (threads), shm (processes) and mpi (mpiexec), three ranks, rank 1 the odd one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import colls
from transports.base import (
    COLLECTIVE_TAG_BASE,
    DTYPES,
    FP_BITS,
    FP_MASK,
    describe_fingerprint,
    fingerprint,
    mismatched,
)

MPIEXEC = Path(sys.executable).parent / "mpiexec"
KINDS = ("dtype", "count", "op", "root", "collective")
# what the CollectiveMismatch message must say of the two calls
NAMED = {"dtype": ("all_reduce(int64, SUM)", "all_reduce(float64, SUM)"),
         "count": ("all_reduce(float64, SUM)", "with another count or root"),
         "op": ("all_reduce(float64, MAX)", "all_reduce(float64, SUM)"),
         "root": ("broadcast(float64)", "with another count or root"),
         "collective": ("broadcast(float64)", "all_reduce(float64, SUM)")}


def mismatched_calls(world) -> list[dict]:
    """Each kind of mismatch on a fresh sub-communicator of `world` (a mismatch aborts its group):
    rank 1 calls something other than the rest, then every rank a barrier (where a rank whose own
    call completed learns of it). What each raised, and how long after the call began."""
    results = []
    for kind in KINDS:
        comm = world.split(0)
        odd = comm.rank == 1
        x = np.ones(8)   # float64
        start = time.monotonic()
        error = None
        try:
            if kind == "dtype":   # of equal item size: no size differs anywhere
                comm.all_reduce(x.astype(np.int64) if odd else x)
            elif kind == "count":
                comm.all_reduce(np.ones(9) if odd else x)
            elif kind == "op":
                comm.all_reduce(x, op=colls.MAX if odd else colls.SUM)
            elif kind == "root":   # rank 1 waits for rank 2, which thinks itself a leaf of root 0
                comm.broadcast(x, root=2 if odd else 0)
            else:   # the same bytes, another collective
                comm.broadcast(x) if odd else comm.all_reduce(x)
            comm.barrier()
        except colls.CollsError as caught:
            error = caught
        results.append({"kind": kind, "seconds": time.monotonic() - start,
                        "error": None if error is None else type(error).__name__, "message": str(error)})
        comm.close()
        world.barrier()   # the world is untouched: the next case starts together
    return results


def check(per_rank: list[list[dict]]) -> None:
    for i, kind in enumerate(KINDS):
        rows = [results[i] for results in per_rank]
        for rank, row in enumerate(rows):
            assert row["kind"] == kind
            assert row["error"] in ("CollectiveMismatch", "CommunicatorAborted"), (kind, rank, row)
            assert row["seconds"] < 5, (kind, rank, row)
        found = [row["message"] for row in rows if row["error"] == "CollectiveMismatch"]
        assert found, f"{kind}: no rank raised CollectiveMismatch: {rows}"
        for message in found:
            assert "rank 1" in message and all(part in message for part in NAMED[kind]), (kind, message)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_mismatches_raise_without_debug(transport, monkeypatch):
    monkeypatch.delenv("COLLS_DEBUG", raising=False)
    monkeypatch.setenv("COLLS_TIMEOUT", "20")   # a missed mismatch fails the 5 s bound, not the run
    check(colls.spawn(mismatched_calls, 3, transport=transport, timeout=20))


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_mismatches_raise_without_debug_under_mpiexec():
    if not MPIEXEC.exists():
        pytest.skip("mpiexec is not installed (pip install 'colls[mpi]')")
    env = dict(os.environ, COLLS_TRANSPORT="mpi", COLLS_TIMEOUT="20")
    env.pop("COLLS_DEBUG", None)
    done = subprocess.run([str(MPIEXEC), "-n", "3", sys.executable, __file__], env=env,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-2000:]
    per_rank = dict(json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines()
                    if line.startswith("RESULT "))
    assert sorted(per_rank) == [0, 1, 2], done.stdout[-2000:]
    check([per_rank[rank] for rank in range(3)])


def test_fingerprints_tell_calls_apart():
    """Equal-size dtypes, ops, collectives and any two roots below 32 have fingerprints of their
    own, within FP_BITS; a message of the next call is no mismatch, nor one of the same call."""
    fp = fingerprint
    f8, i8 = np.dtype(np.float64), np.dtype(np.int64)
    assert fp("all_reduce", f8, 8, None, "SUM") != fp("all_reduce", i8, 8, None, "SUM")
    assert fp("all_reduce", f8, 8, None, "SUM") != fp("all_reduce", f8, 8, None, "MAX")
    assert fp("all_reduce", f8, 8, None, None) != fp("all_gather", f8, 8, None, None)
    assert len({fp("broadcast", f8, 8, root, None) for root in range(32)}) == 32
    assert len({fp("all_reduce", np.dtype(name), 8, None, "SUM") for name in DTYPES[1:]}) == len(DTYPES) - 1
    assert fp("exscan", f8, 8, None, "SUM") == 0   # not one colls describes: a custom channel()'s
    everything = [fp("reduce", np.dtype(name), count, root, op) for name in DTYPES[1:]
                  for count in (1, 1000, 10**9) for root in (0, 5) for op in ("SUM", "AVG", "mine")]
    assert all(0 < code <= FP_MASK for code in everything)
    assert describe_fingerprint(fp("reduce", i8, 3, 1, "mine")) == "reduce(int64, a user Op)"
    call = COLLECTIVE_TAG_BASE + (7 << FP_BITS)
    mine, theirs = call + fp("all_reduce", f8, 8, None, "SUM"), call + fp("all_reduce", i8, 8, None, "SUM")
    assert mismatched(mine, theirs) and not mismatched(mine, mine)
    assert not mismatched(mine, theirs + (1 << FP_BITS))   # a rank a call ahead


if __name__ == "__main__":   # a rank of the mpiexec test
    world = colls.init()
    os.write(1, f"RESULT {json.dumps([world.rank, mismatched_calls(world)])}\n".encode())
    world.close()
