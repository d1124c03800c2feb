"""Collectives of picklable Python objects, named as torch.distributed names them.

Objects travel as pickles over the communicator's buffer collectives: sizes first, then bytes.
`broadcast_object` uses pickle protocol 5 with out-of-band buffers, so a numpy array inside the
object is broadcast from its own memory and received into memory the unpickled array then uses:
it is never copied into or out of a pickle. The others move one in-band pickle per object.

Unpickling runs code named by the sender: use these only among ranks you trust (as with
torch.distributed's object collectives and mpi4py's lowercase methods).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

HEADER_SLOTS = 8               # broadcast_object's first message: part count and up to 7 part sizes
OUT_OF_BAND_FROM_BYTES = 1 << 16   # smaller buffers stay inside the pickle (a message each costs more)


class Pickler(Protocol):
    """How objects become bytes: `dumps`/`loads` (one stream), `dumps_oob`/`loads_oob` (a stream and
    out-of-band buffers)."""

    def dumps(self, obj: Any) -> bytes: ...
    def loads(self, data: Any) -> Any: ...
    def dumps_oob(self, obj: Any) -> tuple[bytes, list[Any]]: ...
    def loads_oob(self, data: Any, buffers: Sequence[Any]) -> Any: ...


class DefaultPickler:
    """The standard library's pickle, highest protocol; buffers of `OUT_OF_BAND_FROM_BYTES` or more
    out of band."""

    def dumps(self, obj: Any) -> bytes:
        """One pickle stream."""
        return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)

    def loads(self, data: Any) -> Any:
        """The object of one pickle stream."""
        return pickle.loads(data)

    def dumps_oob(self, obj: Any) -> tuple[bytes, list[Any]]:
        """(the pickle stream, the large buffers it refers to, in order)."""
        buffers: list[Any] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            if buffer.raw().nbytes < OUT_OF_BAND_FROM_BYTES:
                return True   # in band
            buffers.append(buffer)
            return False
        return pickle.dumps(obj, 5, buffer_callback=out_of_band), buffers

    def loads_oob(self, data: Any, buffers: Sequence[Any]) -> Any:
        """The object of a stream and its buffers."""
        return pickle.loads(data, buffers=buffers)


DEFAULT_PICKLER = DefaultPickler()


def as_bytes(buffer: Any) -> np.ndarray:
    """A flat uint8 view of a buffer (a pickle, a PickleBuffer), without copying."""
    raw = buffer.raw() if isinstance(buffer, pickle.PickleBuffer) else memoryview(buffer).cast("B")
    return np.frombuffer(raw, np.uint8) if raw.nbytes else np.empty(0, np.uint8)


def _table(rows: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """Split received bytes into one array per sender."""
    starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
    return [rows[starts[i]:starts[i + 1]] for i in range(len(counts))]


class ObjectCollectives:
    """Mixin of `Communicator`: broadcast, gather, all-gather, scatter and all-to-all of objects.

    Every rank of the group calls each (a collective). `pickler` (default: the standard library's
    pickle) is how objects become bytes; the mpi4py facade passes `MPI.pickle`.
    """

    def broadcast_object(self, obj: Any, root: int = 0, pickler: Pickler | None = None) -> Any:
        """The root's `obj` on every rank (torch.distributed's broadcast_object_list, one object).

        Args:
            obj: the object on the root; ignored elsewhere.
            root: the rank whose object is sent.
            pickler: how objects become bytes (default: pickle, large buffers out of band).

        Returns:
            The root's object (the root gets `obj` itself back).

        Raises:
            InvalidArgument: a bad root.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
            Whatever pickling raises, on the root, after the others were told (they raise too).
        """
        pickler = DEFAULT_PICKLER if pickler is None else pickler
        root = self._check.root("broadcast_object", root)
        header = np.zeros(HEADER_SLOTS, np.int64)
        parts: list[np.ndarray] = []
        failure: BaseException | None = None
        if self.rank == root:
            try:
                data, buffers = pickler.dumps_oob(obj)
                parts = [as_bytes(data)] + [as_bytes(buffer) for buffer in buffers]
            except Exception as error:   # noqa: BLE001 - re-raised below, once the others know
                failure, header[0] = error, -1
            sizes = [part.size for part in parts]
            header[0] = header[0] or len(parts)
            header[1:1 + min(len(sizes), HEADER_SLOTS - 1)] = sizes[:HEADER_SLOTS - 1]
        self.broadcast(header, root, out=header)
        if header[0] < 0:
            if failure is not None:
                raise failure
            raise ValueError(f"rank {self.rank}: broadcast_object: the root (rank {root}) could not "
                             "pickle its object")
        count = int(header[0])
        if count < HEADER_SLOTS:
            sizes = header[1:1 + count]
        else:   # more parts than the header holds: their sizes go next
            sizes = np.array([part.size for part in parts] if self.rank == root else [0] * count, np.int64)
            self.broadcast(sizes, root, out=sizes)
        if self.rank != root:
            parts = [np.empty(int(size), np.uint8) for size in sizes]
        for part in parts:
            if part.size:
                if part.flags.writeable:
                    self.broadcast(part, root, out=part)
                else:   # the root's read-only pickle: sent from a view (out= needs a writable array)
                    self.broadcast(part, root)
        if self.rank == root:
            return obj
        return pickler.loads_oob(parts[0], parts[1:]) if count > 1 else pickler.loads(parts[0])

    def all_gather_object(self, obj: Any, pickler: Pickler | None = None) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank (torch.distributed's all_gather_object).

        Args:
            obj: this rank's object.
            pickler: how objects become bytes (default: pickle).

        Returns:
            A list of `size` objects.

        Raises:
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        pickler = DEFAULT_PICKLER if pickler is None else pickler
        data = as_bytes(pickler.dumps(obj))
        sizes = self.all_gather(np.array([data.size], np.int64))
        longest = int(sizes.max())
        padded = np.zeros((1, longest), np.uint8)
        padded[0, :data.size] = data
        table = self.all_gather(padded)
        return [pickler.loads(table[r, :sizes[r]]) for r in range(self.size)]

    def gather_object(self, obj: Any, root: int = 0, pickler: Pickler | None = None) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on the root (torch.distributed's gather_object).

        Args:
            obj: this rank's object.
            root: the rank that gets the list.
            pickler: how objects become bytes (default: pickle).

        Returns:
            A list of `size` objects on the root, None elsewhere.

        Raises:
            InvalidArgument: a bad root.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        pickler = DEFAULT_PICKLER if pickler is None else pickler
        root = self._check.root("gather_object", root)
        data = as_bytes(pickler.dumps(obj))
        counts = [0] * self.size
        counts[root] = data.size
        rows, received = self.all_to_all_v(data, counts)
        if self.rank != root:
            return None
        return [pickler.loads(part) for part in _table(rows, received)]

    def scatter_object(self, objs: Sequence[Any] | None, root: int = 0,
                       pickler: Pickler | None = None) -> Any:
        """Object i of the root's `objs` on rank i (torch.distributed's scatter_object_list, one each).

        Args:
            objs: `size` objects on the root; ignored elsewhere.
            root: the rank whose objects are sent.
            pickler: how objects become bytes (default: pickle).

        Returns:
            This rank's object.

        Raises:
            InvalidArgument: a bad root, or the root's `objs` does not hold `size` objects (raised on
                the root; the other ranks then time out, as for a missing call).
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        pickler = DEFAULT_PICKLER if pickler is None else pickler
        root = self._check.root("scatter_object", root)
        counts = [0] * self.size
        data = np.empty(0, np.uint8)
        if self.rank == root:
            items = list(objs) if objs is not None else [None] * self.size
            if len(items) != self.size:
                raise self._check.fail("scatter_object", f"objs holds {len(items)} objects; the group "
                                                         f"has {self.size} ranks")
            pickles = [as_bytes(pickler.dumps(item)) for item in items]
            counts = [part.size for part in pickles]
            data = np.concatenate(pickles)
        rows, received = self.all_to_all_v(data, counts)
        return pickler.loads(_table(rows, received)[root])

    def all_to_all_object(self, objs: Sequence[Any], pickler: Pickler | None = None) -> list[Any]:
        """Object i of every rank's `objs` to rank i; rank j gets one object from each rank, in order.

        Args:
            objs: `size` objects, one per destination rank.
            pickler: how objects become bytes (default: pickle).

        Returns:
            A list of `size` objects (the one rank i sent to this rank at index i).

        Raises:
            InvalidArgument: `objs` does not hold `size` objects.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        pickler = DEFAULT_PICKLER if pickler is None else pickler
        items = list(objs) if objs is not None else [None] * self.size
        if len(items) != self.size:
            raise self._check.fail("all_to_all_object", f"objs holds {len(items)} objects; the group "
                                                        f"has {self.size} ranks")
        pickles = [as_bytes(pickler.dumps(item)) for item in items]
        rows, received = self.all_to_all_v(np.concatenate(pickles), [part.size for part in pickles])
        return [pickler.loads(part) for part in _table(rows, received)]
