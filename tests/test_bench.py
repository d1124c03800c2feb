"""`colls bench`: sizes and factors as nccl-tests define them, the exact check, and real runs under
mpiexec at tiny sizes (every collective, both transports, the JSON file, a planted bug caught by
#wrong, flat memory over 1000 all-reduces, the Gloo baseline where torch is installed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from planted_faults import in_every_process

import colls
from colls.bench.cases import count_wrong, fill, make_case, pattern, reduced_pattern
from colls.bench.spec import bus_factor, element_counts, format_bytes, parse_size, size_steps
from colls.launcher import find_mpiexec

REPO_ROOT = Path(__file__).resolve().parent.parent
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and find_mpiexec() is not None
NOT_INSTALLED = "{} is not installed (it comes with the optional bench extra)"
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and mpiexec (pip install 'colls[mpi]')")
RECORD_FIELDS = {"collective", "implementation", "algorithm", "transport", "ranks", "dtype", "op", "bytes",
                 "count_in", "count_out", "iterations", "time_median_s", "time_min_s", "algbw_GBps",
                 "busbw_GBps", "wrong", "baselines", "memcpy"}
BASELINE_FIELDS = {"iterations", "time_median_s", "time_min_s", "algbw_GBps", "busbw_GBps", "ratio", "wrong"}


def colls_bench(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`colls bench args…` through `python -m colls.cli`, output captured as text."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environment.get("PYTHONPATH")]))
    environment.update(env)
    return subprocess.run([sys.executable, "-m", "colls.cli", "bench", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=100)


# -- without processes -----------------------------------------------------------------------------

@pytest.mark.timeout(10)
def test_sizes_parse_and_step_like_nccl_tests():
    assert [parse_size(text) for text in ("8", "1K", "64k", "256M", "1G", "2MiB", "3MB")] == \
        [8, 1024, 65536, 256 << 20, 1 << 30, 2 << 20, 3 << 20]
    assert size_steps(8, 64, 2) == [8, 16, 32, 64]
    assert size_steps(1 << 20, 16 << 20, 4) == [1 << 20, 4 << 20, 16 << 20]
    assert size_steps(0, 4, 2) == [0, 2, 4]
    with pytest.raises(ValueError):
        parse_size("12X")
    with pytest.raises(ValueError):
        size_steps(8, 64, 1)
    assert format_bytes(64 << 20) == "64 MiB" and format_bytes(1020) == "1020 B"


@pytest.mark.timeout(10)
def test_bus_factors_and_counts_are_nccl_tests():
    assert bus_factor("all_reduce", 4) == 1.5
    for collective in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(collective, 4) == 0.75
    assert bus_factor("broadcast", 4) == bus_factor("reduce", 4) == 1.0
    # the size is the larger per-rank buffer: all_gather's output, reduce_scatter's input
    assert element_counts("all_gather", 4096, 4, "float32") == (256, 1024)
    assert element_counts("reduce_scatter", 4096, 4, "float32") == (1024, 256)
    assert element_counts("all_to_all", 1000, 3, "float32") == (249, 249)
    assert element_counts("all_reduce", 8, 4, "float64") == (1, 1)
    assert element_counts("all_gather", 8, 4, "float32") == (1, 4)   # at least one element per rank


@pytest.mark.timeout(10)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg", "bxor"])
def test_check_is_exact_and_catches_one_wrong_element(op):
    dtype = np.dtype("int64" if op == "bxor" else "float32")
    ranks = 3
    nbytes = 1000 * dtype.itemsize
    buffers = [make_case("all_reduce", nbytes, op, dtype.name, r, ranks).x for r in range(ranks)]
    ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
             "bxor": np.bitwise_xor}[op]
    expected = buffers[0].copy()
    for buffer in buffers[1:]:
        expected = ufunc(expected, buffer)
    if op == "avg":
        expected = (expected / ranks).astype(dtype)
    assert count_wrong(expected, reduced_pattern(op, ranks, dtype)) == 0
    expected[777] += 1
    assert count_wrong(expected, reduced_pattern(op, ranks, dtype)) == 1


@pytest.mark.timeout(30)
def test_a_bench_buffer_is_memory_of_its_own_whatever_was_freed_before():
    import mmap

    from colls.bench.cases import fresh_array

    def mapped(address: int) -> list[str]:   # the mappings that hold `address`
        with open("/proc/self/maps") as maps:
            ranges = [[int(bound, 16) for bound in line.split()[0].split("-")] for line in maps]
        return [(low, high) for low, high in ranges if low <= address < high]

    big = np.ones(24 << 20, np.uint8)
    del big   # glibc now serves blocks up to 24 MiB from its heap
    heap = np.empty(16 << 20, np.uint8)
    buffer = fresh_array(4 << 20, np.float32)   # 16 MiB
    assert buffer.dtype == np.float32 and buffer.size == 4 << 20 and buffer.flags.writeable
    address = buffer.ctypes.data
    assert address % mmap.PAGESIZE == 0 and len(mapped(address)) == 1   # mapped for it: page-aligned
    buffer.fill(7)
    assert int(buffer[-1]) == 7
    del buffer
    assert mapped(address) == []   # and goes with it
    assert fresh_array(100, np.int64).size == 100   # small ones are numpy's own
    del heap


@pytest.mark.timeout(10)
def test_block_placement_is_checked():
    # all_to_all on rank 1 of 2: block j must be rank j's block 1; swapping two blocks is caught
    case = make_case("all_to_all", 104 * 4, "sum", "float32", 1, 2)
    block = case.block
    for source in range(2):
        fill(case.out[source * block:(source + 1) * block], pattern("sum", source, case.dtype), block)
    assert case.wrong(case.out) == 0
    case.out[:] = np.concatenate([case.out[block:], case.out[:block]])
    assert case.wrong(case.out) > 0


# -- real runs under mpiexec -------------------------------------------------------------------------

@needs_mpi
@pytest.mark.mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "mpi"])
def test_every_collective_runs_right_and_writes_json(tmp_path, transport):
    result = colls_bench("-n", "2", "--transport", transport, "-c", "all", "-b", "8", "-e", "512", "-f", "8",
                         "-w", "1", "--iters", "3", "--baselines", "mpi", "--json", "out.json",
                         "--markdown", "out.md", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "# wrong elements: 0 OK" in result.stdout
    for collective in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert f"# {collective}" in result.stdout
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["spec"]["ranks"] == 2 and data["versions"]["mpi4py"]
    records = data["records"]
    assert len(records) == 6 * 3   # 8 B, 64 B and 512 B for each collective
    for record in records:
        assert RECORD_FIELDS <= set(record), set(RECORD_FIELDS) - set(record)
        assert record["transport"] == transport and record["ranks"] == 2 and record["wrong"] == 0
        assert record["iterations"] == 3 and 0 < record["time_min_s"] <= record["time_median_s"]
        assert record["busbw_GBps"] == pytest.approx(record["algbw_GBps"] *
                                                     bus_factor(record["collective"], 2))
        assert BASELINE_FIELDS <= set(record["baselines"]["mpi"])
        assert record["baselines"]["mpi"]["wrong"] == 0
        assert record["memcpy"]["algbw_GBps"] > 0
        assert record["algorithm"] in colls.algorithms(record["collective"])
        if len(os.sched_getaffinity(0)) >= 2:   # the machine's mode around the point: two round trips
            assert len(record["round_trip_ns"]) == 2 and all(0 < t < 1e6 for t in record["round_trip_ns"])
            # and two 256 KiB exchanges (tens of microseconds: more than the copy, less than a second)
            assert len(record["exchange_us"]) == 2 and all(1 < t < 1e6 for t in record["exchange_us"])
    table = (tmp_path / "out.md").read_text()
    assert table.count("| size | algorithm |") == 6 and "colls / MPI" in table


@needs_mpi
@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_more_ranks_than_cpus_still_record_the_machines_mode(tmp_path):
    # 4 ranks on this 2-CPU machine: ranks 2 and 3 sleep while 0 and 1 bounce the line
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no round trip to measure")
    result = colls_bench("-n", "4", "-c", "all_reduce", "-b", "8", "-e", "64K", "-f", "8192", "-w", "1",
                         "--iters", "3", "--no-baselines", "--json", "out.json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    records = json.loads((tmp_path / "out.json").read_text())["records"]
    assert len(records) == 2
    allowed = os.sched_getaffinity(0)
    for record in records:
        assert len(record["round_trip_ns"]) == 2 and all(0 < t < 1e6 for t in record["round_trip_ns"])
        assert len(record["exchange_us"]) == 2 and all(1 < t < 1e6 for t in record["exchange_us"])
        # where each rank ran as the point began and ended: CPUs this machine lets it run on
        cpus = record["cpus"]
        assert len(cpus) == 4 and all(len(pair) == 2 and set(pair) <= allowed for pair in cpus), cpus


@needs_mpi
@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_ranks_that_fail_at_start_say_why_and_leave_no_mpich_segment(tmp_path):
    def mpich_segments() -> set[str]:
        return {name for name in os.listdir("/dev/shm") if name.startswith("mpich_shm_")}

    before = mpich_segments()
    result = colls_bench("-n", "2", "-c", "all_gather", "-b", "1M", "-e", "1M", "--iters", "3",
                         "--no-baselines", cwd=tmp_path, COLLS_SHM_SLOTS="four")
    assert result.returncode != 0
    assert "COLLS_SHM_SLOTS='four': give an integer" in result.stderr
    # every rank called MPI_Abort: MPICH never unlinked its segment, colls bench did
    assert mpich_segments() - before == set()
    # set but empty: as if unset
    empty = colls_bench("-n", "2", "-c", "all_gather", "-b", "1M", "-e", "1M", "--iters", "3",
                        "--no-baselines", cwd=tmp_path, COLLS_SHM_SLOTS="")
    assert empty.returncode == 0, empty.stdout + empty.stderr


@needs_mpi
@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_pinned_ranks_share_the_cpus_round_robin_and_record_it(tmp_path):
    cpus = len(os.sched_getaffinity(0))
    result = colls_bench("-n", "4", "--pin", "-c", "broadcast", "-b", "1K", "-e", "1K", "-w", "1",
                         "--iters", "3", "--no-baselines", "--json", "out.json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = [rank % cpus for rank in range(4)]
    pinned = ", ".join(f"{rank}->{cpu}" for rank, cpu in enumerate(expected))
    assert "# pinned: rank r on CPU index " + pinned in result.stdout
    (record,) = json.loads((tmp_path / "out.json").read_text())["records"]
    assert record["placement"] == expected and record["wrong"] == 0
    if cpus >= 2:   # pinned runs record the machine's mode as unpinned ones do
        assert len(record["exchange_us"]) == 2 and all(1 < t < 1e6 for t in record["exchange_us"])
    unpinned = colls_bench("-n", "2", "-c", "broadcast", "-b", "1K", "-e", "1K", "-w", "1", "--iters", "3",
                           "--no-baselines", "--json", "free.json", cwd=tmp_path)
    assert unpinned.returncode == 0 and "pinned" not in unpinned.stdout
    assert "placement" not in json.loads((tmp_path / "free.json").read_text())["records"][0]


@needs_mpi
@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_registered_buffers_for_colls_beside_mpis_own(tmp_path):
    result = colls_bench("-n", "3", "-c", "all", "-b", "1M", "-e", "1M", "-w", "1", "--iters", "3",
                         "--baselines", "mpi", "--registered", "--json", "out.json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "# --registered: colls' buffers in registered memory" in result.stdout
    records = json.loads((tmp_path / "out.json").read_text())["records"]
    assert len(records) == 6
    for record in records:
        assert record["registered"] is True and record["wrong"] == 0, record
        assert record["baselines"]["mpi"]["wrong"] == 0, record


@needs_mpi
@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_a_planted_bug_shows_in_wrong_and_the_exit_status(tmp_path):
    planted = in_every_process(tmp_path, "odd_skip_reduction")   # the ranks plant it at startup
    path = os.pathsep.join([planted, str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    result = colls_bench("-n", "3", "-c", "reduce", "--algorithm", "binomial", "-b", "1K", "-e", "1K",
                         "-w", "1", "--iters", "2", "--no-baselines", cwd=tmp_path, PYTHONPATH=path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout and "some results were wrong" in result.stderr


@needs_mpi
@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_memory_stays_flat_over_1000_all_reduces(tmp_path):
    result = colls_bench("-n", "2", "--memcheck", "--memcheck-calls", "1000", "-b", "64K", "--json", "m.json",
                         cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (record,) = json.loads((tmp_path / "m.json").read_text())["records"]
    assert record["mode"] == "memcheck" and record["calls"] == 1000 and record["wrong"] == 0
    assert len(record["growth_bytes"]) == 2
    assert max(record["growth_bytes"]) < 2 << 20, record


@needs_mpi
@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_gloo_baseline_beside_colls(tmp_path):
    pytest.importorskip("torch.distributed", exc_type=ImportError, reason=NOT_INSTALLED.format("torch"))
    result = colls_bench("-n", "2", "-c", "all_reduce,all_gather", "-b", "1K", "-e", "1K", "-w", "1",
                         "--iters", "3", "--baselines", "gloo", "--json", "g.json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Gloo us" in result.stdout
    for record in json.loads((tmp_path / "g.json").read_text())["records"]:
        gloo = record["baselines"]["gloo"]
        assert BASELINE_FIELDS <= set(gloo) and gloo["wrong"] == 0 and gloo["ratio"] > 0


@needs_mpi
@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib", exc_type=ImportError, reason=NOT_INSTALLED.format("matplotlib"))
    result = colls_bench("-n", "2", "-b", "8", "-e", "64", "-w", "1", "--iters", "2", "--baselines", "mpi",
                         "--plot", "p.png", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(10)
def test_targets_table_judges_ratios():
    from colls.bench.targets import table

    def record(nbytes, seconds, mpi_ratio, gloo_ratio):
        return {"collective": "all_reduce", "ranks": 2, "transport": "shm", "bytes": nbytes,
                "time_median_s": seconds,
                "baselines": {"mpi": {"ratio": mpi_ratio, "time_median_s": seconds * mpi_ratio},
                              "gloo": {"ratio": gloo_ratio, "time_median_s": seconds * gloo_ratio}}}

    records = [record(8, 4e-6, 0.5, 30.0), record(64 << 10, 40e-6, 1.1, 8.0),
               record(16 << 20, 4e-3, 1.3, 4.0), record(32 << 20, 8e-3, 1.2, 2.0)]
    records[3]["round_trip_ns"] = [640.2, 612.7]   # the machine's mode then: shown beside the worst point
    records[3]["exchange_us"] = [141.3, 139.6]
    lines = table([{"records": records}]).splitlines()[2:]
    verdict = {tuple(line.strip("| ").split(" | ")[:2]): line.rsplit(" | ", 1)[1].strip(" |")
               for line in lines}
    assert verdict["all_reduce, 2 ranks, busbw vs MPICH", ">= 1.0x at every size >= 64 KiB"] == "met"
    assert verdict["all_reduce, 2 ranks, busbw vs MPICH", ">= 1.25x at >= 16 MiB"] == "not met"
    assert verdict["all_reduce, 2 ranks, 8 B latency", "<= 2x MPICH"] == "met"   # 2x exactly
    assert verdict["all_reduce, 2 ranks, 8 B latency", ">= 20x faster than Gloo"] == "met"
    assert verdict["any collective vs Gloo", ">= 3x busbw at every size"] == "not met"
    assert verdict["broadcast, 2 ranks", ">= 1.0x MPICH busbw at >= 1 MiB"] == "no data"
    assert any("worst 1.20x at 32 MiB (round trip 613-640 ns; 256 KiB exchange 140-141 us)" in line
               for line in lines)


ROTATION_PROGRAM = """
import json
from mpi4py import MPI
from colls.bench.runner import ROUNDS, Contender, Prepared, measure
from colls.bench.spec import Spec

calls = []
contenders = [Contender(name, Prepared(lambda name=name: calls.append(name), None), None)
              for name in ("colls", "MPI", "Gloo")]
spec = Spec(1, "shm", ("all_reduce",), (8,), warmup=1, iters=ROUNDS, baselines=())
measure(MPI.COMM_WORLD, contenders, spec)
print(json.dumps(calls[3:]))   # the timed calls, after one warm-up call each
"""


@needs_mpi
@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_timed_rounds_have_each_contender_follow_each_other_equally_often():
    # each round times one call of each; a call slows the next ones (a big copy evicts the caches),
    # so over the whole run each implementation must follow each other one as often: with the
    # rounds rotated instead, colls followed Gloo in two rounds of three and MPI in one
    from collections import Counter
    from itertools import pairwise

    from colls.bench.runner import ROUNDS

    result = subprocess.run([find_mpiexec(), "-n", "1", sys.executable, "-c", ROTATION_PROGRAM],
                            capture_output=True, text=True, timeout=50, cwd=Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr
    calls = json.loads(result.stdout.strip().splitlines()[-1])
    rounds = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    assert len(rounds) == ROUNDS and all(sorted(r) == ["Gloo", "MPI", "colls"] for r in rounds)
    pairs = Counter(pairwise(calls))
    assert all(a != b for a, b in pairs), pairs   # no implementation right after itself
    assert len(pairs) == 6, pairs                  # every ordered pair of different ones occurs
    assert max(pairs.values()) - min(pairs.values()) <= 1, pairs   # and as often (the end cuts one)
