#!/usr/bin/env bash
# The GPU checks in one go, for a machine with an NVIDIA GPU and cupy (no network needed):
#   bash bench/gpu_run.sh [OUT_DIR] [quick|full]
# quick: the GPU tests without the 64 MiB matrix, and the all_reduce benchmark at 2 and 4 ranks;
# full: every GPU test, then every collective's benchmark at 2 ranks too. Logs go to OUT_DIR.
set -u
out=${1:-gpu-out}
mode=${2:-full}
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
    tail -n 25 "$out/$name.log"
}
{ nvidia-smi -L; $python -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"; } \
    >"$out/machine.log" 2>&1
cat "$out/machine.log"
step smoke 120 $python -m colls.cli run -n 2 --transport cuda_ipc --timeout 100 tests/gpu_worker.py matrix 0 1 7
for n in 2 4; do
    step "bench$n" 240 $python -m colls.cli bench --transport cuda_ipc -n "$n" -b 1M -e 1G -f 4 \
        --json "$out/bench$n.json" --timeout 220
done
if [ "$mode" = quick ]; then
    step tests 420 $python -m pytest -q -p no:cacheprovider -m "gpu and not slow" tests/test_cuda.py
else
    step tests 600 $python -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py
fi
if [ "$mode" = full ]; then
    step bench_all 300 $python -m colls.cli bench --transport cuda_ipc -n 2 -c all -b 1M -e 256M -f 16 \
        --json "$out/bench_all.json" --timeout 280
fi
ls /dev/shm | grep -c '^colls-' | sed 's/^/colls segments left in \/dev\/shm: /' | tee -a "$out/summary.log"
cat "$out/summary.log"
