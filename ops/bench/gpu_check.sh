#!/usr/bin/env bash
# GPU check for a machine with one CUDA GPU, torch and triton, and no network.
# Runs in at most 8 minutes (each step has its own timeout):
#   1. the kernel tests on the GPU (compiled kernels, not the interpreter);
#   2. kernel microbenchmarks against torch SDPA / torch matmul;
#   3. the engine end to end on CUDA with a tiny random model (Triton ops vs CPU torch ops,
#      INT8/INT4 engines, CUDA-graph decode vs eager);
#   4. self-draft speed-up: decode of the Llama-3-8B shape with INT4/INT8 weights vs bf16;
#   5. decode throughput of a Llama-3-8B-shaped model (random bf16 weights) at batch
#      1, 16, 64, 256, with achieved bandwidth as a fraction of a measured copy peak.
# Results: $OUT (or ./gpu_check_out): gpu_check.json, kernel_tests.log, gpu_check.log.
# Usage: ops/bench/gpu_check.sh [extra gpu_check.py args, e.g. --context 2048]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu_check_out}"
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
mkdir -p "$OUT"
export OUT

"$PYTHON" - <<'PY' || { echo "gpu_check: no usable CUDA device" >&2; exit 2; }
import torch, triton
assert torch.cuda.is_available()
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
PY

# Step 1: a failing or slow test must not stop the benchmarks, so record its status.
# Compiling the kernel variants dominates: spread it over processes when xdist is there.
PARALLEL=()
"$PYTHON" -c "import xdist" 2>/dev/null && PARALLEL=(-n 8)
timeout 200 "$PYTHON" -m pytest tests/kernels -q -p no:cacheprovider -o addopts="-ra" \
    ${PARALLEL[@]+"${PARALLEL[@]}"} --junitxml="$OUT/kernel_tests.xml" >"$OUT/kernel_tests.log" 2>&1
tests_status=$?
tail -n 40 "$OUT/kernel_tests.log"
echo "kernel tests exit status: $tests_status (124: timed out)" | tee -a "$OUT/kernel_tests.log"

timeout 270 "$PYTHON" ops/bench/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
bench_status=${PIPESTATUS[0]}

echo "gpu_check: tests=$tests_status bench=$bench_status results in $OUT"
[ "$tests_status" -eq 0 ] && [ "$bench_status" -eq 0 ]
