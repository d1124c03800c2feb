"""One rank of tests/test_torch_backend.py: every ProcessGroup method of the "colls" backend against
the same call on a Gloo group of the same processes (and by hand where Gloo has no such op), then
DDP, FSDP2 and, at 3 ranks, a rank that dies.

Run under `torchrun` or `colls run`; prints "FAIL <what>: <why>" per failed check and exits 1 if
any failed. Every rank can rebuild every rank's input (`data`), so references made by hand need no
communication. Tolerances: integers and bool exact; at 2 ranks every float op bitwise (one
commutative operation per element); at more ranks SUM/PRODUCT/AVG within `size` ulps of the
dtype relative to the magnitude (inputs are positive), MIN/MAX exact.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

import colls
import colls.torch  # noqa: F401 - registers "colls"

FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.int32, torch.int64, torch.uint8)   # int16: Gloo has none (checked by hand)
ALL = (*FLOATS, *INTS, torch.bool)
OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR")
COUNTS = (1, 13, 1031)
failures: list[str] = []


def data(rank: int, count: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank `rank`'s input: floats in [0.5, 1.5), integers in 0..3 (products stay small), bools."""
    generator = torch.Generator().manual_seed(1000 * rank + 17 * count + salt)
    if dtype.is_floating_point:
        return (torch.rand(count, generator=generator, dtype=torch.float64) + 0.5).to(dtype)
    if dtype == torch.bool:
        return torch.rand(count, generator=generator) < 0.5
    return torch.randint(0, 4, (count,), generator=generator).to(dtype)


def tolerance(dtype: torch.dtype, size: int, op: str) -> float:
    """The relative error allowed between two orders of a reduction over `size` ranks."""
    if not dtype.is_floating_point or op in ("MIN", "MAX") or size == 2:
        return 0.0
    return size * torch.finfo(dtype).eps


def check(what: str, got: torch.Tensor, want: torch.Tensor, rtol: float = 0.0) -> None:
    """Record a failure unless `got` equals `want` (bitwise for rtol 0, else within rtol)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        failures.append(f"{what}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
        return
    got, want = got.contiguous(), want.contiguous()
    if rtol == 0.0:
        same = torch.equal(got.view(torch.uint8) if got.is_floating_point() and got.numel() else got,
                           want.view(torch.uint8) if want.is_floating_point() and want.numel() else want)
    else:
        same = torch.allclose(got.double(), want.double(), rtol=rtol, atol=0.0)
    if not same:
        diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0
        failures.append(f"{what}: differs from the reference (max |diff| {diff:.3g}, rtol {rtol:.3g}); "
                        f"got {got.flatten()[:4].tolist()}, want {want.flatten()[:4].tolist()}")


def attempt(what: str, fn, *args, **kwargs) -> None:
    """Run `fn(*args, **kwargs)`, recording an exception as a failure."""
    try:
        fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - reported as a failure with its message
        failures.append(f"{what}: raised {type(error).__name__}: {str(error)[:300]}")


def same_everywhere(what: str, result: torch.Tensor, gloo) -> None:
    """Check that every rank holds the same result, bitwise (gathered over Gloo)."""
    gathered = [torch.empty_like(result) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, result.contiguous(), group=gloo)
    for peer, theirs in enumerate(gathered):
        check(f"{what}: rank {peer}'s result against mine", theirs, result)


def reductions(size: int, rank: int, gloo) -> None:
    """all_reduce, reduce, reduce_scatter(_tensor) and all_reduce_coalesced, every dtype x op."""
    for dtype in ALL:
        for name in OPS:
            op = getattr(dist.ReduceOp, name)
            for count in COUNTS:
                what = f"all_reduce {name} {dtype} count {count}"
                reference = data(rank, count, dtype)
                try:
                    dist.all_reduce(reference, op=op, group=gloo)
                except Exception:  # noqa: BLE001 - Gloo has no such op on this dtype: colls must refuse too
                    if name == "AVG" and not dtype.is_floating_point and dtype != torch.bool:
                        break   # colls averages integers as NCCL does (truncated): `by_hand` checks it
                    attempt(what + " (refused by Gloo)", _refuses, data(rank, count, dtype), op)
                    continue
                mine = data(rank, count, dtype)
                attempt(what, dist.all_reduce, mine, op=op)
                check(what, mine, reference, tolerance(dtype, size, name))
                if count == 13 and dtype in FLOATS:
                    same_everywhere(what, mine, gloo)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for name in ("SUM", "MAX"):
            op = getattr(dist.ReduceOp, name)
            for root in range(size):
                what = f"reduce {name} {dtype} root {root}"
                reference, mine = data(rank, 29, dtype), data(rank, 29, dtype)
                dist.reduce(reference, root, op=op, group=gloo)
                attempt(what, dist.reduce, mine, root, op=op)
                if rank == root:
                    check(what, mine, reference, tolerance(dtype, size, name))
            what = f"reduce_scatter_tensor {name} {dtype}"
            source = data(rank, 6 * size, dtype)
            reference, mine = torch.empty(6, dtype=dtype), torch.empty(6, dtype=dtype)
            dist.reduce_scatter_tensor(reference, source, op=op, group=gloo)
            attempt(what, dist.reduce_scatter_tensor, mine, source, op=op)
            check(what, mine, reference, tolerance(dtype, size, name))
            what = f"reduce_scatter (list) {name} {dtype}"
            blocks = [data(rank, 5, dtype, salt=peer) for peer in range(size)]
            reference, mine = torch.empty(5, dtype=dtype), torch.empty(5, dtype=dtype)
            dist.reduce_scatter(reference, blocks, op=op, group=gloo)
            attempt(what, dist.reduce_scatter, mine, blocks, op=op)
            check(what, mine, reference, tolerance(dtype, size, name))
    what = "all_reduce_coalesced float64"
    reference = [data(rank, n, torch.float64) for n in (3, 7)]
    mine = [t.clone() for t in reference]
    for t in reference:
        dist.all_reduce(t, group=gloo)
    attempt(what, dist.all_reduce_coalesced, mine)
    for got, want in zip(mine, reference, strict=True):
        check(what, got, want, tolerance(torch.float64, size, "SUM"))


def _refuses(tensor: torch.Tensor, op) -> None:
    try:
        dist.all_reduce(tensor, op=op)
    except (TypeError, RuntimeError, ValueError) as error:
        if f"rank {dist.get_rank()}" not in str(error):
            raise AssertionError(f"the refusal does not name the rank: {error}") from None
        return
    raise AssertionError("colls reduced what Gloo refuses")


def by_hand(size: int, rank: int) -> None:
    """AVG, PREMUL_SUM, bfloat16 and int16 against references computed here from every rank's input."""
    inputs = {dtype: [data(r, 257, dtype) for r in range(size)]
              for dtype in (*FLOATS, torch.int16, torch.int64)}
    for dtype in FLOATS:
        exact = sum(t.double() for t in inputs[dtype])
        for name, factor in (("AVG", None), ("PREMUL_SUM 0.5", 0.5),
                             ("PREMUL_SUM tensor 3", torch.tensor(3.0))):
            op = dist.ReduceOp.AVG if factor is None else dist._make_nccl_premul_sum(factor)
            want = (exact / size if factor is None else exact * float(factor)).to(dtype)
            mine = inputs[dtype][rank].clone()
            attempt(f"{name} {dtype}", dist.all_reduce, mine, op=op)
            # the rounding of the sum, of the product by the factor and of the division
            check(f"{name} {dtype} by hand", mine, want, (size + 2) * torch.finfo(dtype).eps)
    for dtype in (torch.int16, torch.int64):   # (Gloo has no int16, and no AVG of integers)
        mine = inputs[dtype][rank].clone()
        attempt(f"AVG {dtype}", dist.all_reduce, mine, op=dist.ReduceOp.AVG)
        total = sum(inputs[dtype])
        check(f"AVG {dtype} by hand (truncated toward zero)", mine,
              torch.div(total, size, rounding_mode="trunc"))
        mine = inputs[dtype][rank].clone()
        attempt(f"BXOR {dtype}", dist.all_reduce, mine, op=dist.ReduceOp.BXOR)
        want = inputs[dtype][0].clone()
        for other in inputs[dtype][1:]:
            want ^= other
        check(f"BXOR {dtype} by hand", mine, want)
    # bfloat16, step by step: each pair widened to float32, added, rounded back (torch's own add)
    bf16 = inputs[torch.bfloat16]
    mine = bf16[rank].clone()
    attempt("bfloat16 SUM", dist.all_reduce, mine)
    if size == 2:
        check("bfloat16 SUM by hand: (a.float() + b.float()).bfloat16()", mine,
              (bf16[0].float() + bf16[1].float()).bfloat16())
    special = torch.tensor([float("nan"), float("inf"), -0.0, 3.0e38, 1.0 + 2 ** -8, 2 ** -133],
                           dtype=torch.bfloat16)
    mine = special.clone()
    attempt("bfloat16 SUM of special values", dist.all_reduce, mine)
    want = special.clone()
    for _ in range(size - 1):
        want = want + special   # torch's bfloat16 add (as Gloo's c10::BFloat16): NaN is 0x7FC0
    check("bfloat16 SUM of NaN, inf, -0, overflow, ties, subnormals by hand", mine, want)


def copies(size: int, rank: int, gloo) -> None:
    """broadcast, all_gather (both), gather, scatter, all_to_all (both), barrier, send/recv."""
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float16):
        for root in range(size):
            what = f"broadcast {dtype} root {root}"
            reference, mine = data(rank, 33, dtype), data(rank, 33, dtype)
            dist.broadcast(reference, root, group=gloo)
            attempt(what, dist.broadcast, mine, root)
            check(what, mine, reference)
        what = f"all_gather_into_tensor {dtype}"
        reference, mine = torch.empty(9 * size, dtype=dtype), torch.zeros(9 * size, dtype=dtype)
        dist.all_gather_into_tensor(reference, data(rank, 9, dtype), group=gloo)
        attempt(what, dist.all_gather_into_tensor, mine, data(rank, 9, dtype))
        check(what, mine, reference)
        what = f"all_gather (list) {dtype}"
        reference = [torch.empty(4, dtype=dtype) for _ in range(size)]
        mine = [torch.zeros(4, dtype=dtype) for _ in range(size)]
        dist.all_gather(reference, data(rank, 4, dtype), group=gloo)
        attempt(what, dist.all_gather, mine, data(rank, 4, dtype))
        for got, want in zip(mine, reference, strict=True):
            check(what, got, want)
        what = f"all_gather_coalesced {dtype}"   # outputs[r][i]: rank r's inputs[i]
        inputs = [data(rank, count, dtype, salt=count) for count in (3, 0, 5)]
        reference = [[torch.empty_like(t) for t in inputs] for _ in range(size)]
        mine = [[torch.zeros_like(t) for t in inputs] for _ in range(size)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)   # (torch will deprecate it)
            dist.all_gather_coalesced(reference, inputs, group=gloo)
            attempt(what, dist.all_gather_coalesced, mine, inputs)
        for got, want in zip(sum(mine, []), sum(reference, []), strict=True):
            check(what, got, want)
        what = f"all_to_all_single {dtype}"
        reference, mine = torch.empty(3 * size, dtype=dtype), torch.zeros(3 * size, dtype=dtype)
        dist.all_to_all_single(reference, data(rank, 3 * size, dtype), group=gloo)
        attempt(what, dist.all_to_all_single, mine, data(rank, 3 * size, dtype))
        check(what, mine, reference)
    sends = [(rank + peer) % 3 for peer in range(size)]            # rows rank -> peer
    receives = [(peer + rank) % 3 for peer in range(size)]         # rows peer -> rank
    source = data(rank, sum(sends) * 2, torch.float64).reshape(-1, 2)
    reference, mine = torch.empty(sum(receives), 2, dtype=torch.float64), torch.zeros(sum(receives), 2,
                                                                                     dtype=torch.float64)
    dist.all_to_all_single(reference, source, receives, sends, group=gloo)
    attempt("all_to_all_single with split sizes", dist.all_to_all_single, mine, source, receives, sends)
    check("all_to_all_single with split sizes", mine, reference)
    inputs = [data(rank, 3, torch.int32, salt=peer) for peer in range(size)]   # Gloo: equal sizes only
    reference = [torch.empty(3, dtype=torch.int32) for _ in range(size)]
    mine = [torch.zeros(3, dtype=torch.int32) for _ in range(size)]
    dist.all_to_all(reference, inputs, group=gloo)
    attempt("all_to_all (list)", dist.all_to_all, mine, inputs)
    for got, want in zip(mine, reference, strict=True):
        check("all_to_all (list)", got, want)
    for root in range(size):
        what = f"gather root {root}"
        reference = [torch.empty(5) for _ in range(size)] if rank == root else None
        mine = [torch.zeros(5) for _ in range(size)] if rank == root else None
        dist.gather(data(rank, 5, torch.float32), reference, root, group=gloo)
        attempt(what, dist.gather, data(rank, 5, torch.float32), mine, root)
        for got, want in zip(mine or [], reference or [], strict=True):
            check(what, got, want)
        what = f"scatter root {root}"
        blocks = [data(peer, 6, torch.int64, salt=root) for peer in range(size)] if rank == root else None
        reference, mine = torch.empty(6, dtype=torch.int64), torch.zeros(6, dtype=torch.int64)
        dist.scatter(reference, blocks, root, group=gloo)
        attempt(what, dist.scatter, mine, blocks, root)
        check(what, mine, reference)
    attempt("barrier", dist.barrier, )
    # a ring of isend/irecv, both posted before either is waited for, and batch_isend_irecv
    right, left = (rank + 1) % size, (rank - 1) % size
    received = torch.zeros(1000, dtype=torch.float64)
    works = (dist.isend(data(rank, 1000, torch.float64), right), dist.irecv(received, left))
    for work in works:
        attempt("isend/irecv ring", work.wait)
    check("isend/irecv ring", received, data(left, 1000, torch.float64))
    received = torch.zeros(7, dtype=torch.bfloat16)
    operations = [dist.P2POp(dist.isend, data(rank, 7, torch.bfloat16), right),
                  dist.P2POp(dist.irecv, received, left)]
    for work in dist.batch_isend_irecv(operations):
        attempt("batch_isend_irecv", work.wait)
    check("batch_isend_irecv", received, data(left, 7, torch.bfloat16))
    # irecv without src (recv_anysource): rank 0 takes one message from every other rank, each
    # with its own tag, in the order the receives were posted
    if rank == 0:
        landed = [torch.zeros(5, dtype=torch.int32) for _ in range(1, size)]
        works = [dist.irecv(landed[peer - 1], tag=100 + peer) for peer in range(1, size)]
        for work in works:
            attempt("irecv without src", work.wait)
        for peer in range(1, size):
            check("irecv without src", landed[peer - 1], data(peer, 5, torch.int32))
    else:
        attempt("irecv without src", dist.send, data(rank, 5, torch.int32), 0, tag=100 + rank)
    # recv without src returns the sender's rank: rank 0 takes one message from each other rank
    if rank == 0:
        senders = []
        for _ in range(1, size):
            landed = torch.zeros(6, dtype=torch.float64)
            try:
                sender = dist.recv(landed, tag=200)
            except Exception as error:  # noqa: BLE001 - reported as a failure
                failures.append(f"recv without src: raised {type(error).__name__}: {error}")
                break
            senders.append(sender)
            check(f"recv without src (from {sender})", landed, data(sender, 6, torch.float64))
        if sorted(senders) != list(range(1, size)):
            failures.append(f"recv without src: senders {senders}, want each of 1..{size - 1} once")
    else:
        attempt("recv without src", dist.send, data(rank, 6, torch.float64), 0, tag=200)
    objects = [None] * size
    attempt("all_gather_object", dist.all_gather_object, objects, {"rank": rank, "list": [rank] * rank})
    if objects != [{"rank": peer, "list": [peer] * peer} for peer in range(size)]:
        failures.append(f"all_gather_object: got {objects}")
    listed = [f"from {rank}", rank] if rank == size - 1 else [None, None]
    attempt("broadcast_object_list", dist.broadcast_object_list, listed, size - 1)
    if listed != [f"from {size - 1}", size - 1]:
        failures.append(f"broadcast_object_list: got {listed}")


def asynchrony(size: int, rank: int, gloo) -> None:
    """async_op handles, futures chained with then(), non-contiguous tensors, sub-groups."""
    tensors = [data(rank, 100 * (i + 1), torch.float64) for i in range(5)]
    references = [t.clone() for t in tensors]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    chained = [w.get_future().then(lambda f: f.value()[0] * 2) for w in works]
    for t in references:
        dist.all_reduce(t, group=gloo)
    for i, (work, future) in enumerate(zip(works, chained, strict=True)):
        attempt(f"async all_reduce {i} wait", work.wait)
        check(f"async all_reduce {i}", tensors[i], references[i], tolerance(torch.float64, size, "SUM"))
        check(f"async all_reduce {i} future.then", future.wait(), references[i] * 2,
              tolerance(torch.float64, size, "SUM"))
    square = data(rank, 12, torch.float32).reshape(3, 4)
    mine, reference = square.t(), square.t().clone()
    dist.all_reduce(reference, group=gloo)
    attempt("all_reduce of a transposed (non-contiguous) tensor", dist.all_reduce, mine)
    check("all_reduce of a transposed tensor, written back", mine.contiguous(), reference,
          tolerance(torch.float32, size, "SUM"))
    members = list(range(0, size, 2)) if size > 2 else [0, 1]
    sub, sub_gloo = dist.new_group(members, backend="colls"), dist.new_group(members, backend="gloo")
    if rank in members:
        mine, reference = data(rank, 50, torch.int64), data(rank, 50, torch.int64)
        dist.all_reduce(reference, group=sub_gloo)
        attempt(f"new_group({members}) all_reduce", dist.all_reduce, mine, group=sub)
        check(f"new_group({members}) all_reduce", mine, reference)
        if dist.get_backend(sub) != "colls":
            failures.append(f"get_backend(new_group) is {dist.get_backend(sub)!r}, not 'colls'")
    attempt("a CUDA-less refusal of a meta tensor", lambda: _refuses_device(rank))
    attempt("coalescing manager", _coalesced, size, rank, gloo)


def _coalesced(size: int, rank: int, gloo) -> None:
    """all_gather_into_tensor twice under `_coalescing_manager` (as FSDP and others batch calls)."""
    outputs, references = [torch.zeros(2 * size), torch.zeros(3 * size)], [torch.empty(2 * size),
                                                                          torch.empty(3 * size)]
    with dist._coalescing_manager(async_ops=True) as manager:
        for output, count in zip(outputs, (2, 3), strict=True):
            dist.all_gather_into_tensor(output, data(rank, count, torch.float32))
    manager.wait()
    for reference, count in zip(references, (2, 3), strict=True):
        dist.all_gather_into_tensor(reference, data(rank, count, torch.float32), group=gloo)
    for output, reference in zip(outputs, references, strict=True):
        check("all_gather_into_tensor under _coalescing_manager", output, reference)


def registered(size: int, rank: int, gloo) -> None:
    """all_reduce of a tensor in colls' registered memory (`torch.from_numpy(colls.alloc(...))`, as
    docs/torch.md suggests for big tensors): Gloo's answer, and over shm the peers read it mapped."""
    tensor = torch.from_numpy(colls.alloc(1 << 18, np.float32))   # 1 MiB: above MAPPED_BYTES
    tensor.copy_(data(rank, 1 << 18, torch.float32))
    reference = tensor.clone()
    dist.all_reduce(reference, group=gloo)
    transport = dist.group.WORLD.comm.transport
    memory, mapped = getattr(transport, "peer_memory", None), []
    if memory is not None:
        read = memory.read_mapped
        memory.read_mapped = lambda *args: (mapped.append(args[0]), read(*args))[1]
    attempt("all_reduce of a registered tensor", dist.all_reduce, tensor)
    if memory is not None:
        del memory.read_mapped
    check("all_reduce of a registered tensor", tensor, reference, tolerance(torch.float32, size, "SUM"))
    reads = torch.tensor([len(mapped)])
    dist.all_reduce(reads, group=gloo)
    if memory is not None and transport.mappable and reads.item() == 0:
        failures.append("all_reduce of a registered tensor: no rank read a peer's tensor mapped")


def functional(size: int, rank: int, gloo) -> None:
    """The functional all_reduce (torch.distributed._functional_collectives: what DTensor and
    torch.compile call; its import costs seconds, so only the 2-rank job runs it)."""
    import torch.distributed._functional_collectives as functional_collectives

    reference = data(rank, 10, torch.float64)
    dist.all_reduce(reference, group=gloo)
    result = functional_collectives.all_reduce(data(rank, 10, torch.float64), "sum", dist.group.WORLD)
    check("functional all_reduce", functional_collectives.wait_tensor(result), reference,
          tolerance(torch.float64, size, "SUM"))


def _refuses_device(rank: int) -> None:
    try:
        dist.all_reduce(torch.ones(2, device="meta"))
    except Exception as error:  # noqa: BLE001 - what matters is the message
        if f"rank {rank}" not in str(error) or "CPU" not in str(error):
            raise AssertionError(f"the refusal names neither the rank nor the CPU: {error}") from None
        return
    raise AssertionError("a meta tensor was accepted")


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 5)).double()


def train(wrapped: torch.nn.Module, rank: int, steps: int = 5) -> list[float]:
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 20, generator=generator, dtype=torch.float64)
        loss = wrapped(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def ddp(size: int, rank: int, gloo) -> None:
    """Plain DDP (init_sync=True) over colls against DDP over Gloo: same model, data and steps."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    tolerance_ = 0.0 if size == 2 else 1e-12
    hooks = (None, default_hooks.allreduce_hook) if size == 2 else (None,)
    for hook in hooks:
        what = f"DDP{' with allreduce_hook' if hook else ''}"
        try:
            ours, theirs = DDP(model(rank), bucket_cap_mb=0.01), DDP(model(rank), process_group=gloo,
                                                                    bucket_cap_mb=0.01)
            if hook is not None:
                ours.register_comm_hook(None, hook)
                theirs.register_comm_hook(gloo, hook)
            train(ours, rank)
            train(theirs, rank)
        except Exception as error:  # noqa: BLE001 - reported
            failures.append(f"{what}: raised {type(error).__name__}: {error}")
            continue
        for (name, a), b in zip(ours.module.named_parameters(), theirs.module.parameters(), strict=True):
            check(f"{what} 5 steps, parameter {name}", a.detach(), b.detach(), tolerance_)


def fsdp2(size: int, rank: int, gloo) -> None:
    """FSDP2 (fully_shard) on the CPU over colls against the same over Gloo."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    losses = {}
    for name, group in (("colls", None), ("gloo", gloo)):
        mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
        sharded = model(0)
        for layer in sharded:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        try:
            losses[name] = torch.tensor(train(sharded, rank), dtype=torch.float64)
        except Exception as error:  # noqa: BLE001 - reported
            failures.append(f"FSDP2 over {name}: raised {type(error).__name__}: {error}")
            return
    check("FSDP2 losses, colls against Gloo", losses["colls"], losses["gloo"], 0.0 if size == 2 else 1e-12)


def dead_rank(size: int, rank: int) -> None:
    """The last rank leaves without a word; the others' next all_reduce fails in wait(), naming it."""
    dist.barrier()
    if rank == size - 1:
        os._exit(0)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1000))
    except Exception as error:  # noqa: BLE001 - what matters is the message
        print(f"rank {rank}: dead rank: after {time.monotonic() - start:.1f} s {type(error).__name__}: "
              f"{str(error)[:200]}", flush=True)
        if f"rank {size - 1}" not in str(error):
            failures.append(f"dead rank: the error does not name rank {size - 1}: {error}")
    else:
        failures.append("dead rank: all_reduce with a dead peer returned")
    if time.monotonic() - start > 30:
        failures.append(f"dead rank: the error took {time.monotonic() - start:.0f} s")


def mismatch(size: int, rank: int) -> None:
    """Each rank all_reduces a different number of elements: every rank raises a colls error
    within seconds (a CollectiveMismatch naming the sizes, or the abort it causes), none hangs."""
    from colls import CollsError

    dist.barrier()
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4 + rank))
    except CollsError as error:
        print(f"rank {rank}: mismatch: after {time.monotonic() - start:.1f} s {type(error).__name__}: "
              f"{str(error)[:200]}", flush=True)
    else:
        failures.append("mismatch: all_reduce of different sizes returned")
    if time.monotonic() - start > 30:
        failures.append(f"mismatch: the error took {time.monotonic() - start:.0f} s")


def main() -> int:
    dist.init_process_group("colls")
    size, rank = dist.get_world_size(), dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    transport = dist.group.WORLD.comm.transport.name
    if transport != os.environ.get("COLLS_TRANSPORT", "shm"):
        failures.append(f"the group runs over {transport}, COLLS_TRANSPORT says "
                        f"{os.environ.get('COLLS_TRANSPORT')}")
    parts = sys.argv[1].split(",")
    for part in parts:
        start = time.monotonic()
        if part in ("reductions", "copies", "asynchrony", "registered", "ddp", "fsdp2", "functional"):
            globals()[part](size, rank, gloo)
        elif part == "by_hand":
            by_hand(size, rank)
        else:
            continue
        print(f"rank {rank}: {part} took {time.monotonic() - start:.1f} s", flush=True)
    for failure in failures:
        print(f"FAIL rank {rank}/{size}: {failure}", flush=True)
    last = [part for part in parts if part in ("dead_rank", "mismatch")]
    if last and not failures:   # the world is unusable afterwards: these come last
        globals()[last[0]](size, rank)
        for failure in failures:
            print(f"FAIL rank {rank}/{size}: {failure}", flush=True)
        os._exit(1 if failures else 0)   # the world has lost a rank: no orderly teardown
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
