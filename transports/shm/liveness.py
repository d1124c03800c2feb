"""Aborts and dead peers in a shm group, through each segment's header page.

Word 0 of every rank's header page holds 1 + the rank that aborted the group (its reason in the
aborter's own page), word 1 holds 1 + a rank known to have died: the first rank to see a death
writes it into every peer's page, so ranks waiting on that first rank (which has then left) still
name the rank that really died. Waits look at both words every `LIVENESS_PERIOD_S`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..base import Request, process_alive
from ..errors import CommunicatorAborted, PeerLost

HEADER_PAGE = 4096           # the segment's first page
ABORT_REASON_OFFSET = 64     # where in my header page my abort() writes its reason (UTF-8)
LIVENESS_PERIOD_S = 0.2


class GroupLiveness:
    """`ShmTransport`'s aborts and liveness checks (a mixin: it needs `abort_words`, `peers`,
    `segment` and `pids`)."""


    def abort(self, reason: str) -> None:
        self.aborted = reason
        # the reason goes into my own header page first, then the word into every peer's (x86 keeps
        # the order of stores, so a peer that sees the word reads the whole reason)
        text = reason.encode()[:HEADER_PAGE - ABORT_REASON_OFFSET - 1]
        page = self.segment.array
        page[ABORT_REASON_OFFSET:ABORT_REASON_OFFSET + len(text)] = np.frombuffer(text, np.uint8)
        page[ABORT_REASON_OFFSET + len(text):HEADER_PAGE] = 0
        for word in self.abort_words:
            word[0] = self.rank + 1          # every peer sees it at its next liveness check

    def check_aborted(self) -> None:
        word = self.abort_words[self.rank]   # peers write into my segment's word
        if word[0]:
            aborter = int(word[0]) - 1
            page = self.peers[aborter].array[ABORT_REASON_OFFSET:HEADER_PAGE]
            reason = page.tobytes().split(b"\0", 1)[0].decode(errors="replace")
            raise CommunicatorAborted(f"rank {self.rank}: {reason or f'aborted by rank {aborter}'}")
        if self.watched is not None:
            self.watched.check_aborted()

    def _check_alive(self, requests: Sequence[Request]) -> None:
        """PeerLost if a rank I wait for has died, or if a peer already found one dead.

        The first rank to see a death writes it into every peer's header page (word 1), so ranks
        waiting on that first rank (which has then left) still name the rank that really died.
        """
        known = int(self.abort_words[self.rank][1])
        if known:
            dead = known - 1
            raise PeerLost(f"rank {dead} (pid {self.pids[dead]}) has died; rank {self.rank} learned it "
                           f"from a peer while waiting", dead)
        for request in requests:
            if request.done:
                continue
            if request.peer >= 0:
                if not process_alive(self.pids[request.peer]):
                    raise self._lost(request.peer, f"rank {request.peer} (pid {self.pids[request.peer]}) has "
                                                   f"died; rank {self.rank} was waiting for its {request!r}")
                continue
            others = [peer for peer in range(len(self.pids)) if peer != self.rank]   # ANY_SOURCE
            if others and not any(process_alive(self.pids[peer]) for peer in others):
                raise self._lost(others[0], f"every peer of rank {self.rank} has died; it was waiting "
                                            f"for its {request!r}")

    def _lost(self, peer: int, message: str) -> PeerLost:
        """Record `peer`'s death in every peer's header page (if nobody has yet) and make the error;
        a group already aborted raises that instead (a peer that aborted and left is not the cause)."""
        self.check_aborted()
        for word in self.abort_words:
            if not word[1]:
                word[1] = peer + 1
        return PeerLost(message, peer)
