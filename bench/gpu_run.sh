#!/usr/bin/env bash
# The GPU checks in one go, for a machine with an NVIDIA GPU and cupy (no network needed):
#   bash bench/gpu_run.sh [OUT_DIR] [quick|full] [ARCHIVE.tgz]
# quick: the GPU tests without the slow ones (64 MiB matrix), and the all_reduce benchmark at 2 and
# 4 ranks; full: every GPU test, the all_reduce benchmark under NVIDIA's MPS where the machine has
# it, every collective's benchmark at 2 ranks, all_reduce with 128 MiB chunks, and all_reduce at 2
# and 4 ranks (most wanted first: the device time is short). Logs and JSON go to
# OUT_DIR (and, after every step, into ARCHIVE.tgz when given: a run cut short keeps what it did).
set -u
out=${1:-gpu-out}
mode=${2:-full}
archive=${3:-}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
step() {   # step NAME SECONDS COMMAND...: run with a deadline, log, note the status and the time
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local status=$?
    echo "== $name: exit $status in $((SECONDS - start)) s" | tee -a "$out/summary.log"
    grep -v DeprecationWarning "$out/$name.log" | tail -n 25
    if [ -n "$archive" ]; then tar czf "$archive" -C "$out" .; fi
}
bench() {   # bench NAME RANKS SIZES...: the all_reduce benchmark over cuda_ipc
    local name=$1 ranks=$2
    shift 2
    step "$name" 240 $python -m colls.cli bench --transport cuda_ipc -n "$ranks" "$@" \
        --json "$out/$name.json" --timeout 220
}
{ nvidia-smi -L; $python -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"; } \
    >"$out/machine.log" 2>&1
cat "$out/machine.log"
step smoke 120 $python -m colls.cli run -n 2 --transport cuda_ipc --timeout 100 tests/gpu_worker.py matrix 0 1 7
if [ "$mode" = quick ]; then
    step tests 420 $python -m pytest -q -p no:cacheprovider -m "gpu and not slow" tests/test_cuda.py
    bench bench2 2 -b 1M -e 1G -f 4
    bench bench4 4 -b 1M -e 1G -f 4
    exit 0
fi
step tests 480 $python -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py
if command -v nvidia-cuda-mps-control >/dev/null; then   # all ranks in one GPU context: no context switches
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/colls-mps CUDA_MPS_LOG_DIRECTORY=/tmp/colls-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        bench mps_bench2 2 -b 1M -e 1G -f 4
        bench mps_bench4 4 -b 1M -e 1G -f 4
        echo quit | nvidia-cuda-mps-control
        sleep 1
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
    echo "== no nvidia-cuda-mps-control here" | tee -a "$out/summary.log"
fi
bench bench_all 2 -c all -b 1M -e 256M -f 16
COLLS_CUDA_CHUNK_BYTES=$((128 << 20)) bench bench2_chunk128M 2 -b 64M -e 1G -f 4
bench bench2 2 -b 1M -e 1G -f 4
bench bench4 4 -b 1M -e 1G -f 4
ls /dev/shm | grep -c '^colls-' | sed 's/^/colls segments left in \/dev\/shm: /' | tee -a "$out/summary.log"
if [ -n "$archive" ]; then tar czf "$archive" -C "$out" .; fi
cat "$out/summary.log"
