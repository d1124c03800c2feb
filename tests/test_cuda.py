"""The cuda_ipc transport: its CPU-side logic everywhere; every collective on device memory where
there is a GPU (real processes, real CUDA IPC, cupy buffers, checked exactly against numpy).

The GPU probe runs in a subprocess: this process must not initialise CUDA, since `colls.spawn`
forks and a forked child cannot use its parent's CUDA context.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transports.cuda_ipc import (
    HANDLE_BYTES,
    MAX_CHUNK_BYTES,
    chunk_step,
    device_geometry,
    import_cupy,
    pack_entry,
    unpack_entry,
)
from transports.errors import TransportError

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "gpu_worker.py"
GiB = 1 << 30


@functools.lru_cache(maxsize=1)
def gpu_devices() -> tuple[int, str]:
    """(devices, why none) from a subprocess that imports cupy and counts CUDA devices."""
    probe = "import cupy; print(cupy.cuda.runtime.getDeviceCount())"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return 0, "probing for a GPU timed out"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return 0, f"no usable GPU (cupy: {last})"
    count = int(done.stdout.strip() or 0)
    return count, "" if count else "cupy sees no CUDA device"


def needs_gpu():
    count, why = gpu_devices()
    if not count:
        pytest.skip(f"GPU test skipped: {why}")


def run_ranks(n: int, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`colls run -n n --transport cuda_ipc tests/gpu_worker.py args...`, with a hard deadline."""
    command = [sys.executable, "-m", "colls.cli", "run", "-n", str(n), "--transport", "cuda_ipc",
               "--timeout", str(timeout), str(WORKER), *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 60, cwd=ROOT, env=env)
    sys.stdout.write(done.stdout[-20000:])
    sys.stderr.write(done.stderr[-20000:])
    return done


def assert_every_rank(done: subprocess.CompletedProcess, n: int, verdict: str, why: str) -> None:
    """The job succeeded and each of its `n` ranks printed `verdict`."""
    assert done.returncode == 0, why
    assert done.stdout.count(verdict) == n


# -- CPU side: runs everywhere ---------------------------------------------------------------------

def test_geometry_gives_each_sender_four_slots_within_a_64th_of_the_device():
    chunk, slots = device_geometry(4, 141 * 10**9, slots=4, chunk_bytes=0)
    assert (chunk, slots) == (MAX_CHUNK_BYTES, 4)
    chunk, slots = device_geometry(4, 16 * GiB, slots=4, chunk_bytes=0)
    assert chunk * slots * 4 <= 16 * GiB // 64 and chunk % (1 << 20) == 0
    assert device_geometry(8, 1 * GiB, slots=4, chunk_bytes=0)[0] == 1 << 20   # never below 1 MiB


def test_geometry_refuses_a_chunk_that_is_not_whole_pages():
    with pytest.raises(TransportError, match="device_chunk_bytes"):
        device_geometry(2, GiB, slots=4, chunk_bytes=5000)
    with pytest.raises(TransportError, match="device_slots"):
        device_geometry(2, GiB, slots=0, chunk_bytes=1 << 20)


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8, 12, 24, 4096])
def test_a_chunk_holds_whole_elements(itemsize):
    step = chunk_step(1 << 20, itemsize)
    assert step % itemsize == 0 and (1 << 20) - itemsize < step <= 1 << 20


def test_an_element_larger_than_a_slot_gets_no_chunks():
    assert chunk_step(4096, 8192) == 0


def test_setup_entries_round_trip_and_refuse_a_short_handle():
    handle = bytes(range(HANDLE_BYTES))
    entry = pack_entry(1234, 1, 1 << 25, 4, handle, "colls-job-abcdef")
    assert unpack_entry(entry) == (1234, 1, 1 << 25, 4, handle, "colls-job-abcdef")
    with pytest.raises(TransportError, match="64 B"):
        pack_entry(1, 0, 4096, 4, b"short", "colls-x")


def test_without_cupy_the_transport_says_how_to_get_it():
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(TransportError, match="pip install cupy"):
            import_cupy()
    else:
        pytest.skip("cupy is installed here")


def test_launcher_and_init_know_the_transport():
    from colls.bootstrap import TRANSPORTS

    assert "cuda_ipc" in TRANSPORTS
    done = subprocess.run([sys.executable, "-m", "colls.cli", "run", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert "cuda_ipc" in done.stdout


# -- on a GPU ----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_collective_and_algorithm_on_device_buffers_matches_numpy(n):
    """counts {0, 1, 7, 2^20 + 3} x float32/float16/int32, every algorithm, exact."""
    needs_gpu()
    assert_every_rank(run_ranks(n, "matrix", timeout=480), n, " 0 failures", "FAIL lines above")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_collective_at_64_mib_on_device_buffers_matches_numpy(n):
    """The 64 MiB count of the matrix (float32: 16 Mi elements; the dtypes alike), every algorithm."""
    needs_gpu()
    done = run_ranks(n, "matrix", str(16 << 20), timeout=480)
    assert_every_rank(done, n, " 0 failures", "FAIL lines above")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, 3])
def test_ddp_on_cupy_equals_serial_training(n):
    needs_gpu()
    assert_every_rank(run_ranks(n, "ddp", timeout=300), n, "identical on every rank: True", "ddp != serial")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, 4])
def test_point_to_point_async_groups_dlpack_and_errors_on_device(n):
    needs_gpu()
    assert_every_rank(run_ranks(n, "checks", timeout=300), n, " 0 problems", "FAIL lines above")


# the data-parallel loops have run on a GPU; the model-parallel ones were made device-aware later and
# checked on the CPU only
TRAIN_ON_GPU = {
    "ps": ["-n", "2"], "ddp": ["-n", "2"], "zero1": ["-n", "2"], "zero2": ["-n", "2"], "zero3": ["-n", "2"],
    "gpipe": ["--pp", "2"], "1f1b": ["--pp", "2"],
    "interleaved": ["--pp", "2", "--chunks", "2", "--blocks", "4"],
    "tp": ["--tp", "2"], "dp_tp": ["--dp", "2", "--tp", "2"],
    "ep": ["--ep", "2", "--experts", "4", "--top-k", "2"],
    "pp_ep": ["--pp", "2", "--ep", "2", "--experts", "2"], "3d": ["--dp", "2", "--tp", "2", "--pp", "2"],
}


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", list(TRAIN_ON_GPU))
def test_colls_train_on_the_gpu_matches_serial_training_there(strategy, tmp_path):
    """`colls train --device cuda`: every training loop on cupy over cuda_ipc, against serial
    training on the same GPU (float64: relative difference <= 1e-10, as on the host)."""
    needs_gpu()
    report_file = tmp_path / "report.json"
    command = [sys.executable, "-m", "colls.cli", "train", "--strategy", strategy, *TRAIN_ON_GPU[strategy],
               "--device", "cuda", "--steps", "3", "--check-serial", "--json", str(report_file)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    sys.stdout.write(done.stdout[-5000:])
    sys.stderr.write(done.stderr[-5000:])
    assert done.returncode == 0
    difference = json.loads(report_file.read_text())["serial_difference"]
    assert difference["relative"] <= 1e-10 and difference["identical_across_ranks"]


class CudaArrayInterface:
    """An input that says, through DLPack, that its memory is on a CUDA device (and has none)."""

    def __dlpack_device__(self):
        return (2, 0)   # kDLCUDA, device 0


def test_a_gpu_array_on_a_host_transport_is_refused_by_name_before_anything_moves():
    from colls.communicator import Communicator
    from transports.errors import InvalidArgument
    from transports.local import LocalWorld

    comm = Communicator(LocalWorld(1).transport(0))
    with pytest.raises(InvalidArgument, match=r"rank 0: all_reduce: x is a GPU array .*cuda_ipc"):
        comm.all_reduce(CudaArrayInterface())
    with pytest.raises(InvalidArgument, match=r"rank 0: broadcast: x is a GPU array"):
        comm.broadcast(CudaArrayInterface())
    assert comm.stats() == {} or all(s["calls"] == 0 for s in comm.stats().values())


def cupy_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("cupy") is None


@pytest.mark.skipif(not cupy_missing(), reason="cupy is installed here")
def test_gpu_commands_without_cupy_say_what_to_install():
    bench = subprocess.run([sys.executable, "-m", "colls.cli", "bench", "--transport", "cuda_ipc", "-n", "2"],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bench.returncode == 2 and "pip install cupy" in bench.stderr
    train = subprocess.run([sys.executable, "-m", "colls.cli", "train", "--strategy", "ddp",
                            "--device", "cuda"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert train.returncode == 2 and "--device cuda needs cupy" in train.stderr


