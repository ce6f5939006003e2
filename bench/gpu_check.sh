#!/usr/bin/env bash
# One device-tool call on a GPU machine: the GPU tests, then the CUDA table (torch's minifier
# against ours with a fresh child per candidate and with long-lived children at parallelism
# 2/4/8). Every step has its own time cap so the call ends inside the tool's 10-minute limit and
# each log and JSON record written so far comes back under $OUT. docs/bench.md, "On a GPU machine".
#
#   run: bash bench/gpu_check.sh      (carry: .whl, made here by `make gpu-wheels`)
set -u
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --find-links .whl -e . -r .whl/requirements.txt || exit 1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  nproc; } 2>&1 | tee "$OUT/machine.txt"

set -o pipefail
started=$SECONDS
# -v names each test as it ends and --timeout fails a stuck one with its traceback, so a run cut
# short by the outer cap still says which tests failed (a quiet -q log cut at 170 s said only ".F.F").
timeout "${GPU_TESTS_S:-200}" python3 -m pytest -v -ra -m gpu -p no:cacheprovider -n "${GPU_TEST_WORKERS:-4}" \
    --dist loadgroup --timeout "${GPU_TEST_TIMEOUT_S:-150}" --tb short --durations 15 2>&1 | tee "$OUT/gpu-tests.log"
echo "gpu tests: rc $? in $((SECONDS - started)) s" | tee -a "$OUT/gpu-tests.log"

# bench NAME CAP ARGS...: one bench/run.py call on CUDA, capped at CAP seconds; its JSON grows run by run.
# The logs share one file: the device tool brings back at most 8 files from $OUT.
bench() {
    local name=$1 cap=$2
    shift 2
    echo "== $name: $* (cap $cap s)" >> "$OUT/bench.log"
    PYTHONUNBUFFERED=1 timeout "$cap" python3 bench/run.py --device cuda --limit 150 --no-culprit \
        --work out/bench-"$name" --json "$OUT/$name.json" "$@" 2>&1 | tee -a "$OUT/bench.log"
}
[ "${GPU_BENCH:-all}" = all ] && bench relu ${GPU_BENCH_RELU_S:-100} --cases relu_cos --minifiers torch ours --reuse 0
bench relu-reuse ${GPU_BENCH_REUSE_S:-40} --cases relu_cos --minifiers ours --reuse 50
bench layer ${GPU_BENCH_LAYER_S:-140} --cases transformer_layer --minifiers torch ours --reuse 50 --parallelism 4
[ "${GPU_BENCH:-all}" = all ] && bench layer-fresh ${GPU_BENCH_FRESH_S:-60} --cases transformer_layer --minifiers ours --reuse 0 --parallelism 4
exit 0
