"""POSIX shared-memory segments: created once, owner-only, under unguessable names, unlinked early.

Segments live in /dev/shm (Linux's tmpfs behind shm_open). Each is created with O_EXCL and mode
0600 under `colls-<job>-<random>`, so no other user can open it and no name can be guessed or raced.
Its owner unlinks it as soon as every peer has mapped it: from then on a crash cannot leak it, since
the kernel frees the memory when the last mapping goes.
"""

from __future__ import annotations

import mmap
import os
import secrets
import stat
import time
from pathlib import Path

import numpy as np

from .errors import TransportError

SHM_DIR = "/dev/shm"
PREFIX = "colls-"


def job_id() -> str:
    """A fresh random job id, for segments whose creator was given none."""
    return secrets.token_hex(6)


def free_bytes(directory: str = SHM_DIR) -> int:
    """Bytes free in the shared-memory filesystem."""
    info = os.statvfs(directory)
    return info.f_bavail * info.f_frsize


class Segment:
    """One mapped shared-memory segment, viewed as a numpy uint8 array."""

    def __init__(self, name: str, size: int, mapping: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.size = size
        self.owner = owner
        self._mmap = mapping
        self.array = np.frombuffer(mapping, dtype=np.uint8, count=size)
        self._unlinked = not owner

    @classmethod
    def create(cls, size: int, job: str | None = None) -> Segment:
        """Create a new segment of `size` bytes, checking first that /dev/shm has room."""
        available = free_bytes()
        if size > available:
            raise TransportError(
                f"shared memory: need {size} B in {SHM_DIR} but only {available} B are free; "
                f"give the container more (docker run --shm-size=1g), free space in {SHM_DIR}, or set "
                f"COLLS_SHM_CHUNK_BYTES smaller")
        name = f"{PREFIX}{job or job_id()}-{secrets.token_hex(8)}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
        except OSError as error:
            os.unlink(path)
            raise TransportError(f"shared memory: could not create {size} B segment: {error}") from error
        finally:
            os.close(fd)
        return cls(name, size, mapping, owner=True)

    @classmethod
    def attach(cls, name: str, size: int) -> Segment:
        """Map a peer's segment, refusing one of another owner, another mode or the wrong size."""
        if not name.startswith(PREFIX) or "/" in name:
            raise TransportError(f"shared memory: refusing segment name {name!r}")
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as error:
            raise TransportError(f"shared memory: cannot open peer segment {name}: {error}") from error
        try:
            info = os.fstat(fd)
            if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) != 0o600:
                raise TransportError(
                    f"shared memory: segment {name} has owner {info.st_uid} and mode "
                    f"{stat.S_IMODE(info.st_mode):o}; expected owner {os.getuid()} and mode 600")
            if info.st_size != size:
                raise TransportError(f"shared memory: segment {name} is {info.st_size} B, expected {size}")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, size, mapping, owner=False)

    def unlink(self) -> None:
        """Remove the name (the memory stays until the last mapping closes); idempotent."""
        if not self._unlinked:
            self._unlinked = True
            try:
                os.unlink(os.path.join(SHM_DIR, self.name))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Unlink if still named, then drop the mapping when no numpy view still uses it."""
        self.unlink()
        self.array = None  # type: ignore[assignment]
        try:
            self._mmap.close()
        except BufferError:
            pass  # a view still exists; the mapping goes with it


def remove_job_segments(job: str) -> int:
    """Remove every segment of job `job` still named in /dev/shm (after a crash); returns how many."""
    removed = 0
    prefix = f"{PREFIX}{job}-"
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return 0
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def mpich_segments() -> set[str]:
    """Names of MPICH's own shared-memory segments in /dev/shm."""
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith("mpich_shm_")}
    except OSError:
        return set()


def _unmapped(names: set[str]) -> set[str]:
    """Those of `names` that no process on this machine has mapped."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue   # a process that ended meanwhile, or one we may not read
        mapped.update(name for name in names if name in text)
    return names - mapped


def remove_orphaned_mpich_segments(before: set[str], wait_s: float = 3.0) -> None:
    """After a job, an aborted one above all: MPICH unlinks its segment only in MPI_Finalize, so an
    MPI_Abort or a killed rank (or one killed in MPI_Init) leaves it in /dev/shm. Remove those that
    appeared during our run once no live process maps them on two looks 0.2 s apart (so that another
    job's segment caught between its creation and its mapping is left alone), looking for up to
    `wait_s`: mpiexec may return while its aborted ranks still hold theirs (one look at once and
    one 0.2 s later were seen to leave every such segment behind)."""
    left = mpich_segments() - before
    deadline = time.monotonic() + wait_s
    unmapped_before: set[str] = set()
    while left:
        unmapped = _unmapped(left)
        for name in unmapped & unmapped_before:
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass
            left.discard(name)
        unmapped_before = unmapped
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
