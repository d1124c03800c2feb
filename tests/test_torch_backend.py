"""The torch.distributed backend "colls" (colls/torch) against Gloo in the same processes.

Importing torch costs seconds per process, so each world size is one job that runs every check
(tests/torch_worker.py: every ProcessGroup method x dtype x op against Gloo, AVG, PREMUL_SUM and
bfloat16 by hand, async handles and futures, sub-groups, a tensor in registered memory, DDP,
FSDP2, a dead rank) and prints one line per failed check: 2 ranks under torchrun (env://, torch's
store), 3 and 4 under `colls run` (no torch variables set). PyTorch's own DDP tests run on colls in
tests/test_torch_suite.py.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKER = str(REPO_ROOT / "tests" / "torch_worker.py")
EVERYTHING = "reductions,by_hand,copies,asynchrony,registered,ddp,fsdp2"
JOB_TIMEOUT_S = 240   # a 4-rank job takes about 25 s on 2 idle cores


def child_env(**extra: str) -> dict[str, str]:
    """Our environment, the repo importable, no inherited COLLS_* or torch rendezvous variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("COLLS_") and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["COLLS_TIMEOUT"] = "60"
    env["COLLS_JOB"] = "torch" + secrets.token_hex(4)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=REPO_ROOT, env=child_env(**env), capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S)


def assert_clean(result: subprocess.CompletedProcess, ranks: int) -> None:
    """Exit status 0 and no FAIL line; else the failed checks (or the output's tail) as the message."""
    failed = [line for line in result.stdout.splitlines() if "FAIL " in line]
    assert result.returncode == 0 and not failed, (
        f"exit {result.returncode}; {len(failed)} failed checks:\n" + "\n".join(failed[:40])
        + f"\n--- output tail:\n{result.stdout[-3000:]}\n--- stderr tail:\n{result.stderr[-3000:]}")
    for rank in range(ranks):   # every rank got to the end of every part
        assert f"rank {rank}: fsdp2 took" in result.stdout, result.stdout[-3000:]


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_two_ranks_under_torchrun_match_gloo():
    """Every method at 2 ranks, bitwise for floats; plain DDP bitwise; FSDP2; the functional
    all_reduce; env:// with torch's store."""
    result = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                  "--master-addr", "127.0.0.1", "--master-port", str(free_port()), WORKER,
                  EVERYTHING + ",functional"])
    assert_clean(result, 2)


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_three_ranks_under_colls_run_match_gloo_and_survive_a_dead_rank():
    """Every method at 3 ranks under `colls run` (no MASTER_ADDR set by hand); then the last rank
    dies and the others' next all_reduce raises PeerLost naming it, within seconds."""
    result = run([sys.executable, "-m", "colls.cli", "run", "-n", "3", sys.executable, WORKER,
                  EVERYTHING + ",dead_rank"])
    assert_clean(result, 3)
    lines = re.findall(r"dead rank: after ([\d.]+) s (\w+): (.*)", result.stdout)
    assert len(lines) == 2, result.stdout[-2000:]
    for seconds, kind, message in lines:
        assert kind == "PeerLost" and "rank 2" in message, message
        assert float(seconds) < 30


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_four_ranks_under_colls_run_match_gloo():
    """Every method at 4 ranks; plain DDP within 1e-12 of DDP over Gloo after 5 steps; then calls
    of different sizes on each rank raise a colls error on every rank within seconds."""
    result = run([sys.executable, "-m", "colls.cli", "run", "-n", "4", sys.executable, WORKER,
                  EVERYTHING + ",mismatch"])
    assert_clean(result, 4)
    errors = re.findall(r"mismatch: after ([\d.]+) s (\w+): (.*)", result.stdout)
    assert len(errors) == 4, result.stdout[-2000:]
    assert all(float(seconds) < 30 for seconds, _, _ in errors), errors


ENDS_ON_GLOO = """
import torch, torch.distributed as dist
import colls.torch
dist.init_process_group("colls")
gloo = dist.new_group(backend="gloo")
tensor = torch.zeros(1 << 18)
for _ in range(20):
    dist.all_reduce(tensor)
    dist.all_reduce(tensor, group=gloo)
dist.destroy_process_group()
"""
EXIT_RUNS = 3


@pytest.mark.timeout(EXIT_RUNS * JOB_TIMEOUT_S + 30)
def test_a_program_whose_last_call_is_on_a_gloo_group_exits_cleanly(tmp_path):
    """Gloo's worker thread frees a call's tensors after `wait()` returned, taking the GIL; without
    the pause colls.torch leaves it at exit, a program that destroys its groups right after such a
    call aborted as the interpreter finalized ("terminate called without an active exception") in
    11 of 16 runs at 4 ranks on 2 cores. Run EXIT_RUNS times: each must exit 0."""
    script = tmp_path / "ends_on_gloo.py"
    script.write_text(ENDS_ON_GLOO)
    for attempt in range(EXIT_RUNS):
        result = run([sys.executable, "-m", "colls.cli", "run", "-n", "4", sys.executable, str(script)])
        assert result.returncode == 0, (f"run {attempt}: exit {result.returncode}\n{result.stdout[-2000:]}"
                                        f"\n{result.stderr[-2000:]}")


@pytest.mark.mpi
@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_three_ranks_under_mpiexec_over_the_mpi_transport_match_gloo():
    """COLLS_TRANSPORT=mpi under plain mpiexec (no torch variables set): the collectives run over
    MPI, sub-groups through MPI_Comm_create_group."""
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec (pip install -e '.[mpi]')")
    result = run([mpiexec, "-n", "3", sys.executable, WORKER, "reductions,by_hand,copies,asynchrony"],
                 COLLS_TRANSPORT="mpi")
    failed = [line for line in result.stdout.splitlines() if "FAIL " in line]
    assert result.returncode == 0 and not failed, "\n".join(failed[:40]) + result.stderr[-3000:]
    assert result.stdout.count("asynchrony took") == 3, result.stdout[-3000:]


def test_bfloat16_rounding_matches_torch():
    """colls' float32 -> bfloat16 rounding equals torch's on a million random float32 patterns (NaNs
    aside: torch's vectorized path writes 0xFFFF where its scalar path, and ours, write 0x7FC0), and a
    pairwise bfloat16 op equals torch's bfloat16 arithmetic on every pattern pair drawn."""
    from colls.torch.dtypes import BFLOAT16_OPS, narrow, widen

    patterns = np.random.default_rng(0).integers(0, 2 ** 32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    values = patterns.view(np.float32)
    finite = ~np.isnan(values)
    ours = narrow(values)
    theirs = torch.from_numpy(values.copy()).bfloat16().view(torch.uint16).numpy()
    assert np.array_equal(ours[finite], theirs[finite])
    assert np.all(ours[~finite] == 0x7FC0)
    assert np.array_equal(widen(ours[finite]), torch.from_numpy(theirs[finite].copy()).view(
        torch.bfloat16).float().numpy(), equal_nan=True)
    left, right = (np.random.default_rng(seed).integers(0, 2 ** 16, 100_000, dtype=np.uint32)
                   .astype(np.uint16) for seed in (1, 2))
    as_bf16 = [torch.from_numpy(side.copy()).view(torch.bfloat16) for side in (left, right)]
    for kind, torch_op in ((dist_op("SUM"), torch.add), (dist_op("PRODUCT"), torch.mul),
                           (dist_op("MIN"), torch.minimum), (dist_op("MAX"), torch.maximum)):
        ours = BFLOAT16_OPS[kind].fn(left, right)
        theirs = torch_op(*as_bf16).view(torch.uint16).numpy()
        both = ~(np.isnan(widen(ours)) | np.isnan(widen(theirs)))
        assert np.array_equal(ours[both], theirs[both]), kind
        assert np.array_equal(np.isnan(widen(ours)), np.isnan(widen(theirs))), kind


def dist_op(name: str):
    import torch.distributed as dist

    return getattr(dist.ReduceOp.RedOpType, name)


def test_refusals_name_the_rank_and_argument():
    """A tensor colls cannot move, or an op its dtype lacks, is refused before anything moves."""
    import torch.distributed as dist

    from colls import InvalidArgument
    from colls.torch.dtypes import as_buffer, colls_op

    with pytest.raises(InvalidArgument, match=r"rank 3: all_reduce: tensor is on meta"):
        as_buffer(torch.ones(2, device="meta"), 3, "all_reduce")
    with pytest.raises(InvalidArgument, match=r"rank 1: broadcast: tensor must be a torch.Tensor"):
        as_buffer([1.0], 1, "broadcast")
    with pytest.raises(TypeError, match=r"rank 0: all_reduce: .*BAND.*torch.float32"):
        colls_op(dist.ReduceOp.BAND, torch.float32, 0, "all_reduce")
    with pytest.raises(TypeError, match=r"rank 2: reduce: .*BXOR on torch.bfloat16"):
        colls_op(dist.ReduceOp.BXOR, torch.bfloat16, 2, "reduce")


THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE_PAGE_PROBE = """
import re, torch
import colls.torch  # noqa: F401
tensor = torch.zeros(4 << 20)   # 16 MiB
address, region = tensor.data_ptr(), None
for line in open("/proc/self/smaps"):
    bounds = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
    if bounds:
        region = int(bounds[1], 16) <= address < int(bounds[2], 16)
    elif region and line.startswith("THPeligible:"):
        print(line.split()[1])
"""


@pytest.mark.skipif(not THP_MODE.exists() or "[madvise]" not in THP_MODE.read_text(),
                    reason="the kernel's THP mode is not madvise, so the variable makes no difference here")
def test_import_puts_large_tensors_in_huge_pages_unless_the_user_said_no():
    """`import colls.torch` sets torch's THP_MEM_ALLOC_ENABLE, so a large tensor made afterwards may
    be backed by huge pages (its mapping is THP-eligible); a user's own THP_MEM_ALLOC_ENABLE=0 wins."""
    for setting, eligible in ((None, "1"), ("0", "0")):
        env = child_env()
        env.pop("THP_MEM_ALLOC_ENABLE", None)
        if setting is not None:
            env["THP_MEM_ALLOC_ENABLE"] = setting
        result = subprocess.run([sys.executable, "-c", HUGE_PAGE_PROBE], cwd=REPO_ROOT, env=env,
                                capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split() == [eligible], (setting, result.stdout, result.stderr[-2000:])
