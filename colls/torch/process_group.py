"""`ProcessGroupColls`: torch's ProcessGroup interface over a colls `Communicator`.

Every method turns its tensors into numpy views of their storage (`dtypes.as_buffer`), queues one
job on the group's worker (`work.Stream`) and returns its `CollsWork`; the job makes the matching
blocking colls call(s). torch's C++ side (DDP's reducer, `_broadcast_coalesced`, the parameter
check) reaches the methods through torch's Python trampoline; torch's Python collectives call them
by name. Each method is named as torch 2.13 names it, with its older alias beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

from colls.communicator import Communicator
from transports.base import ANY_SOURCE
from transports.errors import CollectiveMismatch, InvalidArgument

from .dtypes import Buffer, as_buffer, colls_op, premul_factor
from .work import CollsWork, Stream

CLOSE_WAIT_S = 10.0   # how long shutdown lets queued calls finish


class ProcessGroupColls(dist.ProcessGroup):
    """A torch process group whose collectives run on colls (CPU tensors).

    Args:
        comm: the group's colls communicator (its rank and size are the group's).
        timeout: the longest one call may wait.
    """

    def __init__(self, comm: Communicator, timeout: timedelta) -> None:
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self.stream = Stream(comm.name, timeout.total_seconds())
        self._group_name = comm.name   # torch sets its own (`_set_group_name`) once the group is made
        self._group_desc = ""

    # torch keeps a group's name on its C++ per-device backends, which a Python group has none of:
    # these overrides (reached through torch's trampoline) keep it here (DeviceMesh and FSDP2 read it)

    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        """The group's name, as torch gave it."""
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        """Keep the name torch gives the group."""
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        """The group's description, as torch gave it."""
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - torch's name
        """Keep the description torch gives the group."""
        self._group_desc = desc

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        """The backend's name, as torch asks for it."""
        return "colls"

    def __repr__(self) -> str:
        return f"<ProcessGroupColls rank {self.comm.rank}/{self.comm.size} over {self.comm.transport.name}>"

    # -- helpers ---------------------------------------------------------------------------------

    def _buffers(self, tensors: list[torch.Tensor], what: str, name: str = "tensor") -> list[Buffer]:
        return [as_buffer(t, self.comm.rank, what, name) for t in tensors]

    def _run(self, what: str, outputs: list[torch.Tensor], job: Callable[[], object],
             opts: object = None) -> CollsWork:
        """Run `job` (blocking colls calls) as the group's next call: queued on the worker, or now
        in this thread when torch says its caller waits at once (`opts.asyncOp` false: a plain
        `dist.all_reduce(t)`) and nothing is queued before it."""
        label = f"colls {self.comm.name} rank {self.comm.rank}: {what}"
        if opts is not None and not opts.asyncOp:
            return self.stream.run_now(label, outputs, job)
        return self.stream.submit(label, outputs, job)

    def _one(self, tensors: list[torch.Tensor], what: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise InvalidArgument(f"rank {self.comm.rank}: {what}: one tensor per call, got {len(tensors)}")
        return tensors[0]

    def _source(self, buffer: Buffer, op: dist.ReduceOp) -> np.ndarray:
        """The array a reduction reads: the tensor's own, or PREMUL_SUM's scaled copy of it (scaled
        by torch, in the tensor's dtype, as NCCL's premultiplied sum)."""
        factor = premul_factor(op)
        if factor is None:
            return buffer.array
        scaled = buffer.contiguous.detach() * factor
        return as_buffer(scaled, self.comm.rank, "PREMUL_SUM").array

    # -- reductions ------------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions | None = None) -> CollsWork:
        """all_reduce each tensor in place (`dist.all_reduce`; DDP's gradient buckets)."""
        op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        buffers = self._buffers(tensors, "all_reduce")
        ops = [colls_op(op, b.tensor.dtype, self.comm.rank, "all_reduce") for b in buffers]

        def job() -> None:
            for buffer, colls_reduce in zip(buffers, ops, strict=True):
                self.comm.all_reduce(self._source(buffer, op), op=colls_reduce, out=buffer.array)
                buffer.write_back()

        return self._run("all_reduce", tensors, job, opts)

    def allreduce_coalesced(self, tensors: list[torch.Tensor],
                            opts: AllreduceCoalescedOptions | None = None) -> CollsWork:
        """all_reduce a list of tensors as one call (each in place)."""
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: ReduceOptions) -> CollsWork:
        """Reduce onto `opts.rootRank` (`dist.reduce`); the other ranks' tensors are left as they were."""
        tensor = self._one(tensors, "reduce")
        buffer = as_buffer(tensor, self.comm.rank, "reduce")
        op, root = opts.reduceOp, opts.rootRank
        colls_reduce = colls_op(op, tensor.dtype, self.comm.rank, "reduce")
        mine = self.comm.rank == root

        def job() -> None:
            self.comm.reduce(self._source(buffer, op), root=root, op=colls_reduce,
                             out=buffer.array if mine else None)
            if mine:
                buffer.write_back()

        return self._run("reduce", tensors, job, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: ReduceScatterOptions | None = None) -> CollsWork:
        """Reduce `input` (size equal blocks) and keep this rank's block in `output`
        (`dist.reduce_scatter_tensor`; FSDP's gradients)."""
        op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        out = as_buffer(output, self.comm.rank, "reduce_scatter_tensor", "output")
        source = as_buffer(input, self.comm.rank, "reduce_scatter_tensor", "input")
        self._sizes("reduce_scatter_tensor", source.array.size, out.array.size * self.comm.size, output,
                    input)
        colls_reduce = colls_op(op, input.dtype, self.comm.rank, "reduce_scatter_tensor")

        def job() -> None:
            self.comm.reduce_scatter(self._source(source, op), op=colls_reduce, out=out.array)
            out.write_back()

        return self._run("reduce_scatter_tensor", [output], job, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: ReduceScatterOptions | None = None) -> CollsWork:
        """Reduce the lists `inputs[0]` (one tensor per rank) and keep this rank's in `outputs[0]`
        (`dist.reduce_scatter`): the list is packed into one buffer (one copy), then reduce_scatter."""
        output = self._one(outputs, "reduce_scatter")
        blocks = self._one(inputs, "reduce_scatter")
        self._count("reduce_scatter", blocks)
        packed = torch.cat([b.reshape(-1) for b in blocks]) if blocks else output.new_empty(0)
        return self.reduce_scatter_single(output, packed, opts)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: ReduceScatterOptions | None = None) -> CollsWork:
        """reduce_scatter_tensor of several pairs, in order, as one call."""
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._last(works, outputs, "reduce_scatter_tensor_coalesced")

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- copies ----------------------------------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions | None = None) -> CollsWork:
        """Copy the root's tensors to every rank, in place (`dist.broadcast`; DDP's initial sync)."""
        root = 0 if opts is None else opts.rootRank
        buffers = self._buffers(tensors, "broadcast")

        def job() -> None:
            for buffer in buffers:
                self.comm.broadcast(buffer.array, root=root, out=buffer.array)
                buffer.write_back()

        return self._run("broadcast", tensors, job, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: AllgatherOptions | None = None) -> CollsWork:
        """Every rank's `input`, in rank order, into `output` (`dist.all_gather_into_tensor`)."""
        out = as_buffer(output, self.comm.rank, "all_gather_into_tensor", "output")
        source = as_buffer(input, self.comm.rank, "all_gather_into_tensor", "input")
        self._sizes("all_gather_into_tensor", out.array.size, source.array.size * self.comm.size, output,
                    input)

        def job() -> None:
            self.comm.all_gather(source.array, out=out.array)
            out.write_back()

        return self._run("all_gather_into_tensor", [output], job, opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: AllgatherOptions | None = None) -> CollsWork:
        """all_gather_into_tensor of several pairs, in order, as one call."""
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._last(works, outputs, "all_gather_into_tensor_coalesced")

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: AllgatherOptions | None = None) -> CollsWork:
        """Every rank's tensor into the list `outputs[0]` (`dist.all_gather`; DDP's parameter check):
        gathered into one buffer, then copied into the list's tensors."""
        targets = self._one(outputs, "all_gather")
        source = as_buffer(self._one(inputs, "all_gather"), self.comm.rank, "all_gather")
        self._count("all_gather", targets)

        def job() -> None:
            gathered = self.comm.all_gather(source.array)
            _unpack(gathered, targets)

        return self._run("all_gather", targets, job, opts)

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: AllgatherOptions | None = None) -> CollsWork:
        """all_gather of several tensors as one call: `outputs[r][i]` gets rank r's `inputs[i]`
        (`dist.all_gather_coalesced`): the inputs packed into one buffer (one copy), gathered, and
        unpacked into the lists."""
        what = "all_gather_coalesced"
        self._count(what, outputs)
        dtypes = {t.dtype for t in inputs} | {t.dtype for row in outputs for t in row}
        if len(dtypes) > 1 or any(len(row) != len(inputs) for row in outputs):
            raise InvalidArgument(f"rank {self.comm.rank}: {what}: every rank's list of outputs needs one "
                                  f"tensor per input ({len(inputs)}), all of one dtype")
        packed = torch.cat([t.reshape(-1) for t in inputs]) if inputs else torch.empty(0)
        source = as_buffer(packed, self.comm.rank, what)
        targets = [t for row in outputs for t in row]   # rank by rank, as the gathered blocks

        def job() -> None:
            _unpack(self.comm.all_gather(source.array), targets)

        return self._run(what, targets, job, opts)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: GatherOptions) -> CollsWork:
        """Every rank's tensor into the root's list `outputs[0]` (`dist.gather`)."""
        root = opts.rootRank
        source = as_buffer(self._one(inputs, "gather"), self.comm.rank, "gather")
        targets = self._one(outputs, "gather") if self.comm.rank == root else []
        if self.comm.rank == root:
            self._count("gather", targets)

        def job() -> None:
            gathered = self.comm.gather(source.array, root=root)
            if gathered is not None:
                _unpack(gathered, targets)

        return self._run("gather", targets, job, opts)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: ScatterOptions) -> CollsWork:
        """The root's list `inputs[0]` (one tensor per rank) to each rank's `outputs[0]` (`dist.scatter`):
        the root packs its list into one buffer (one copy)."""
        root = opts.rootRank
        out = as_buffer(self._one(outputs, "scatter"), self.comm.rank, "scatter", "output")
        packed = None
        if self.comm.rank == root:
            blocks = self._one(inputs, "scatter")
            self._count("scatter", blocks)
            packed = as_buffer(torch.cat([b.reshape(-1) for b in blocks]), self.comm.rank, "scatter").array

        def job() -> None:
            self.comm.scatter(packed, root=root, out=out.array)
            out.write_back()

        return self._run("scatter", outputs, job, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int],
                          opts: AllToAllOptions | None = None) -> CollsWork:
        """Rows of `input` (dim 0) to each rank, by `input_split_sizes` (equal blocks when empty);
        `output` gets each rank's rows in rank order (`dist.all_to_all_single`)."""
        out = as_buffer(output, self.comm.rank, "all_to_all_single", "output")
        source = as_buffer(input, self.comm.rank, "all_to_all_single", "input")
        what, size = "all_to_all_single", self.comm.size
        if not input_split_sizes and not output_split_sizes:
            self._sizes(what, out.array.size, source.array.size, output, input)

            def job() -> None:
                self.comm.all_to_all(source.array, out=out.array)
                out.write_back()

            return self._run(what, [output], job, opts)
        row = input[0].numel() if input.dim() and input.shape[0] else 1
        sends = list(input_split_sizes) or [input.shape[0] // size] * size
        expected = list(output_split_sizes) or [output.shape[0] // size] * size
        if len(sends) != size or len(expected) != size:
            raise InvalidArgument(f"rank {self.comm.rank}: {what}: split sizes need {size} entries, got "
                                  f"input {sends} and output {expected}")

        def job_v() -> None:
            rows, counts = self.comm.all_to_all_v(source.array.reshape(-1, row) if row else source.array,
                                                  sends)
            if counts != expected:
                raise CollectiveMismatch(f"rank {self.comm.rank}: {what}: received rows {counts} from the "
                                         f"ranks, output_split_sizes says {expected}")
            out.array[...] = rows.reshape(-1)
            out.write_back()

        return self._run(what, [output], job_v, opts)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: AllToAllOptions | None = None) -> CollsWork:
        """`inputs[r]` to rank r, `outputs[r]` from rank r (`dist.all_to_all`): packed into one buffer
        (one copy) and sent as an all_to_all_v of elements."""
        self._count("all_to_all", inputs)
        self._count("all_to_all", outputs)
        packed = as_buffer(torch.cat([t.reshape(-1) for t in inputs]), self.comm.rank, "all_to_all").array
        sends = [t.numel() for t in inputs]
        expected = [t.numel() for t in outputs]

        def job() -> None:
            received, counts = self.comm.all_to_all_v(packed, sends)
            if counts != expected:
                raise CollectiveMismatch(f"rank {self.comm.rank}: all_to_all: received {counts} elements "
                                         f"from the ranks, the output tensors hold {expected}")
            _unpack(received, outputs)

        return self._run("all_to_all", outputs, job, opts)

    # -- synchronization and point to point ------------------------------------------------------

    def barrier(self, opts: BarrierOptions | None = None) -> CollsWork:
        """Complete once every rank of the group has called it (`dist.barrier`)."""
        return self._run("barrier", [], self.comm.barrier, opts)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> CollsWork:  # noqa: N803
        """Send the tensor to `dstRank` (`dist.send`/`isend`): posted in issue order, finished by `wait()`."""
        buffer = as_buffer(self._one(tensors, "send"), self.comm.rank, "send")

        def job() -> Callable[[float], None]:
            request = self.comm.send(buffer.array, dstRank, tag=tag, async_op=True)
            return lambda deadline: request.wait()

        return self._run(f"send to rank {dstRank}", tensors, job)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> CollsWork:  # noqa: N803
        """Receive into the tensor from `srcRank` (`dist.recv`/`irecv`): posted in issue order,
        finished (and written back) by `wait()`."""
        return self._recv(tensors, srcRank, tag, f"recv from rank {srcRank}")

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> CollsWork:
        """Receive into the tensor from whichever rank sends first with `tag` (`dist.irecv` and
        `dist.recv` without `src`; the work's `_source_rank()` tells which rank sent, once waited)."""
        return self._recv(tensors, ANY_SOURCE, tag, "recv from any rank")

    def _recv(self, tensors: list[torch.Tensor], source: int, tag: int, what: str) -> CollsWork:
        buffer = as_buffer(self._one(tensors, "recv"), self.comm.rank, "recv")
        work: CollsWork | None = None

        def job() -> Callable[[float], None]:
            request = self.comm.recv(buffer.array, source, tag=tag, async_op=True)

            def finish(deadline: float) -> None:
                request.wait()
                work.source = request.status.source
                buffer.write_back()

            return finish

        work = self._run(what, tensors, job)
        return work

    # -- lifetime --------------------------------------------------------------------------------

    def abort(self) -> None:
        """Release every rank blocked in a call of this group (CommunicatorAborted naming this rank)."""
        self.comm.abort("torch process group aborted")

    def shutdown(self) -> None:
        """Let queued calls finish (at most CLOSE_WAIT_S), then release the communicator."""
        self.stream.close(CLOSE_WAIT_S)
        self.comm.close()

    # -- checks ----------------------------------------------------------------------------------

    def _count(self, what: str, tensors: list[torch.Tensor]) -> None:
        if len(tensors) != self.comm.size:
            raise InvalidArgument(f"rank {self.comm.rank}: {what}: the list needs one tensor per rank "
                                  f"({self.comm.size}), got {len(tensors)}")

    def _sizes(self, what: str, big: int, small_times_size: int, output: torch.Tensor,
               input: torch.Tensor) -> None:
        if big != small_times_size:
            raise InvalidArgument(f"rank {self.comm.rank}: {what}: output has {output.numel()} elements and "
                                  f"input {input.numel()}, which do not fit {self.comm.size} ranks")

    def _last(self, works: list[CollsWork], outputs: list[torch.Tensor], what: str) -> CollsWork:
        """One handle for several calls just issued: a job behind them (the stream runs calls in
        order) that re-raises the first one's error, if any."""

        def job() -> None:
            for work in works:
                work.wait()

        return self._run(what, outputs, job)


def _unpack(gathered: np.ndarray, targets: list[torch.Tensor]) -> None:
    """Copy consecutive pieces of a flat array into the tensors of a list (of the same dtype)."""
    start = 0
    for target in targets:
        piece = as_buffer(target, -1, "unpack")
        piece.array[...] = gathered.reshape(-1)[start:start + piece.array.size]
        start += piece.array.size
        piece.write_back()
