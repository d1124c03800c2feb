"""Rendezvous before any transport exists: an all-gather of small bytes through files.

`colls run` and `colls.spawn` make a private directory (mode 0700) and pass it as COLLS_RENDEZVOUS;
each rank writes its entry for a round atomically (write, then rename) and waits, with a deadline,
for everyone's. Used once per job to exchange segment names and pids; sub-groups are then set up
over the communicator itself, and under `mpiexec` MPI does this job instead.
"""

from __future__ import annotations

import os
import stat
import time

from .errors import CollectiveTimeout, TransportError


class FileBootstrap:
    """All-gather of small bytes through a private directory shared by the ranks of one job."""

    def __init__(self, directory: str, rank: int, size: int, timeout: float = 60.0) -> None:
        info = os.stat(directory)
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise TransportError(f"rendezvous directory {directory} must be owned by you with mode 700 "
                                 f"(it is owner {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})")
        self.directory = directory
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.round = 0

    def all_gather(self, data: bytes) -> list[bytes]:
        """Every rank's `data`, in rank order."""
        round_ = self.round
        self.round += 1
        path = os.path.join(self.directory, f"{round_}.{self.rank}")
        with open(path + ".tmp", "wb") as handle:
            handle.write(data)
        os.rename(path + ".tmp", path)
        deadline = time.monotonic() + self.timeout
        entries: list[bytes | None] = [None] * self.size
        pause = 1e-4
        while True:
            for peer in range(self.size):
                if entries[peer] is None:
                    try:
                        with open(os.path.join(self.directory, f"{round_}.{peer}"), "rb") as handle:
                            entries[peer] = handle.read()
                    except FileNotFoundError:
                        pass
            missing = [peer for peer, entry in enumerate(entries) if entry is None]
            if not missing:
                return entries  # type: ignore[return-value]
            if time.monotonic() > deadline:
                raise CollectiveTimeout(f"bootstrap: rank {self.rank} waited {self.timeout:.0f} s for "
                                        f"ranks {missing} to start (round {round_})", tuple(missing))
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
