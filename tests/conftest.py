"""Shared fixtures: no shared-memory segment made during the session may outlive it."""

from __future__ import annotations

import os
import time

import pytest

SHM_DIR = "/dev/shm"
PREFIX = "colls-"
GRACE_S = 3.0   # a segment exists by name only until every peer has mapped it


def colls_segments() -> set[str]:
    """Names in /dev/shm that colls created (`colls-<job>-<random>`)."""
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(PREFIX)}
    except FileNotFoundError:
        return set()


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments():
    """Fail the session if a `colls-*` segment that was not there at the start is still there at the end."""
    before = colls_segments()
    yield
    deadline = time.monotonic() + GRACE_S
    leaked = colls_segments() - before
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked &= colls_segments()   # only names that stay count: another job's setup is transient
    assert not leaked, f"shared-memory segments left in {SHM_DIR}: {sorted(leaked)}"


@pytest.fixture(scope="session", autouse=True)
def no_tune_file_of_the_machine(tmp_path_factory):
    """The tests select algorithms by the defaults, not by a tune file a developer's `colls tune`
    left in ~/.cache (tests that want one set COLLS_TUNE_FILE themselves)."""
    previous = os.environ.get("COLLS_TUNE_FILE")
    os.environ["COLLS_TUNE_FILE"] = str(tmp_path_factory.mktemp("tune") / "tune.json")
    yield
    if previous is None:
        os.environ.pop("COLLS_TUNE_FILE", None)
    else:
        os.environ["COLLS_TUNE_FILE"] = previous
