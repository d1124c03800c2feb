"""The end of a rendezvous (acks) and help copies: two cores copy one big message.

A rendezvous send waits for its receiver's ack with nothing else to do. So the receiver of a big
plain collective message asks its sender to write the second half of it straight into the
receive buffer (process_vm_writev) while it reads the first half itself, and acks once both
halves are in. Not for a reduction (the sender cannot combine into my buffer), a user's message
(its sender may be off computing, not waiting), a sendrecv's receive (its sender has a receive of
its own to make: helping would put its copy for me before its own read), nor a receive from a
peer I am sending to myself (it is reading mine meanwhile).

Pushes: an exchange's plain message sent from small pages into a receive buffer in huge pages is
written whole by its sender instead (the same request, with no half read by the receiver): a
process_vm_* call pins the other process's pages, 512 times fewer where they are huge. Both ranks
of the exchange wait in it, so each writes the other's message while the other writes its.

The request lives in the FIFO's control block: the receiver writes HELP_ASK (number: the ack
that will complete the message; target address; offset; bytes), the sender writes HELP_DONE
(the number) after its write. A receiver that gives up (a deadline, an abort, a lost peer)
withdraws the request (bytes = HELP_WITHDRAWN), so that a sender that comes to it later writes
nothing. Known gap: with no atomic exchange, a sender that read the request just before may
still write its share into that buffer while the error is being raised.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import cma
from ..base import COLLECTIVE_TAG_BASE, Request
from ..errors import TransportError
from .fifo import ACKS, HELP_ASK, HELP_DONE, TAIL, Fifo, In, Out
from .options import HELP_BYTES, PUSH_FROM_BYTES

HELP_WITHDRAWN = -1          # the bytes word of a request to help that its receiver gave up on


class Handshake:
    """`ShmTransport`'s rendezvous acks and help copies (a mixin over the transport's FIFOs)."""

    def _init_help(self) -> None:
        size = self.size
        self.helping = [0] * size      # per peer: the ack number of a message its sender is helping copy
        self.helped = [0] * size       # per peer: the number of the last request of its I served
        self.help_copies = 0           # the shares I wrote into peers' buffers (a count for tests)

    def _collect_acks(self, peer: int) -> bool:
        """Complete the rendezvous sends to `peer` that it has finished reading, after writing my
        share of one it asked me to help with."""
        awaiting = self.awaiting[peer]
        if not awaiting:
            return False
        ctl = self.outbound[peer].ctl
        moved = False
        if ctl[HELP_ASK] > self.helped[peer]:
            self._help(peer, ctl)
            moved = True
        acked = ctl[ACKS]
        while awaiting and awaiting[0].ack <= acked:
            awaiting.pop(0).done = True
            moved = True
        return moved

    def _spin_for_ack(self, send: Out) -> None:
        """Poll the ack of my rendezvous `send` alone for up to `spin_polls` polls, then collect it
        (the caller's wait does the rest): its peer is most likely reading it as I read its
        message, and the general wait's passes are slower to notice."""
        ctl, ack = self.outbound[send.peer].ctl, send.ack
        for _ in range(self.spin_polls):
            if ctl[ACKS] >= ack:
                break
        self._collect_acks(send.peer)

    def _consume_rendezvous(self, peer: int, fifo: Fifo, request: In, tail: int) -> int:
        """Free the slot of a rendezvous header at `tail` whose message is in, ack it (the sender's
        buffer is free again) and complete the receive; returns the new tail."""
        tail += 1
        self.read_tail[peer] = tail
        fifo.control[TAIL] = tail
        self.acks_given[peer] += 1
        fifo.control[ACKS] = self.acks_given[peer]
        request.pos = request.size
        request.done = True
        self.current[peer] = None
        if request.stash:
            self._serve_stash(peer)
        return tail

    def _pushes(self, send_buf: np.ndarray, into: np.ndarray, tag: int) -> bool:
        """Whether a plain exchange's send goes by address for its receiver to have me write it all
        (RENDEZVOUS_PUSHABLE): from PUSH_FROM_BYTES, sent from small pages, my own receive `into`
        in huge ones (the peer's is most likely laid out as mine), where cross-memory attach works."""
        return (self.cma and send_buf.nbytes >= PUSH_FROM_BYTES and tag >= COLLECTIVE_TAG_BASE
                and not cma.in_huge_pages(send_buf) and cma.in_huge_pages(into)
                and self._registered(send_buf) is None)

    def _ask_help(self, peer: int, request: In, address: int, pushable: bool = False) -> bool:
        """Read the first half of a rendezvous message at `address` in `peer` and have its sender
        write the rest, or (`pushable` into huge pages) have it write it all; the request is then
        installed as `peer`'s current message, finished by `_finish_helped`. False (nothing done)
        where neither applies (module docstring)."""
        n = request.nbytes
        if request.reducer is not None or request.tag < COLLECTIVE_TAG_BASE:
            return False
        if pushable and cma.in_huge_pages(request.buf):
            half = 0
        elif n < HELP_BYTES or not request.helpable or self.awaiting[peer] or self.sends[peer]:
            return False
        else:
            half = n // 2 // 64 * 64
        number = self.acks_given[peer] + 1   # the ack that will complete this message
        ctl = self.inbound[peer].ctl
        ctl[HELP_ASK + 1] = cma.address_of(request.data[half:])
        ctl[HELP_ASK + 2] = half
        ctl[HELP_ASK + 3] = n - half
        ctl[HELP_ASK] = number               # publish the request last
        self.helping[peer] = number
        self.current[peer] = request
        self.active_in.add(peer)
        try:
            if half:
                self.peer_memory.read(peer, In(peer, request.tag, request.data[:half], None), address)
        except BaseException:
            self._withdraw_help([request])
            raise
        request.pos = half
        return True

    def _help(self, peer: int, ctl: memoryview) -> None:
        """Write the share of a rendezvous send of mine that `peer` asked me for into its buffer;
        nothing where it withdrew the request (that send then never completes).

        Raises:
            TransportError: a request for a message I have not sent.
            PeerLost: `peer` died meanwhile.
        """
        number, address, offset, nbytes = (ctl[HELP_ASK + i] for i in range(4))
        if nbytes == HELP_WITHDRAWN:
            self.helped[peer] = number
            return
        send = next((s for s in self.awaiting[peer] if s.ack == number), None)
        if send is None or offset < 0 or nbytes <= 0 or offset + nbytes > send.nbytes:
            raise TransportError(f"rank {self.rank}: rank {peer} asked for help with rendezvous message "
                                 f"{number} ({offset}+{nbytes} B), which rank {self.rank} has not sent")
        try:
            cma.write(self.pids[peer], address, send.data[offset:offset + nbytes])
        except ProcessLookupError as error:
            raise self._lost(peer, f"rank {peer} (pid {self.pids[peer]}) died while rank {self.rank} was "
                                   f"writing its share of a {send.nbytes} B message to it") from error
        self.helped[peer] = number
        ctl[HELP_DONE] = number          # after the write (a system call): the bytes are there
        self.help_copies += 1
        if nbytes == send.nbytes:   # I wrote it all: my buffer is free now (the ack still comes)
            send.done = True

    def _finish_helped(self, peer: int) -> bool:
        """Complete the helped rendezvous receive from `peer` once the sender's share has landed."""
        fifo = self.inbound[peer]
        if fifo.ctl[HELP_DONE] < self.helping[peer]:
            return False
        self.helping[peer] = 0
        self._consume_rendezvous(peer, fifo, self.current[peer], self.read_tail[peer])
        return True

    def _withdraw_help(self, requests: Sequence[Request]) -> None:
        """After an error in a wait for `requests`: tell the sender of each that I asked to write
        into my buffer not to, if it has not begun. The pair's FIFO stays held by that message."""
        for request in requests:
            peer = request.peer
            if peer >= 0 and self.helping[peer] and self.current[peer] is request:
                self.inbound[peer].ctl[HELP_ASK + 3] = HELP_WITHDRAWN
