#!/usr/bin/env bash
# The one project script for the GPU machine: build, GPU tests, sanitizer, benchmarks, profiles, calibration
# check. Results go under $OUT (default ./out), packed into one archive because the device tool returns at most
# 8 files. Each stage runs even if an earlier one failed; the summary at the end says which passed.
#
#   scripts/device_job.sh                 # every stage
#   scripts/device_job.sh build test      # only these
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
RESULTS=$OUT/results
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 FDPP_RESULTS="$RESULTS"
JOBS=$(nproc)

# Wheels carried in .whl/ (packages the GPU image lacks).
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

stage_build() {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFDPP_CUDA_ARCHS=90a >/dev/null && cmake --build build -j "$JOBS"
}
stage_test() { python3 -m pytest -q -m gpu tests/gpu -rs --junitxml="$RESULTS/gpu-tests.xml"; }
stage_sanitize() { scripts/sanitize.sh; }
stage_bench_gemm() { python3 scripts/bench_gemm.py --out "$RESULTS/gemm"; }
stage_bench_attention() { python3 scripts/bench_attention.py --out "$RESULTS/attention"; }
stage_profile() {
  python3 -m fdpp_rewrite profile llama2-7b llama2-13b opt-6.7b chatglm2-6b smollm2-135m \
    --out "$RESULTS/profiles/h200.json" --plots "$RESULTS/profiles/plots"
}
stage_calibration_check() { python3 scripts/calibration_gpu_check.py --out "$RESULTS/calibration"; }

ALL="build test sanitize bench_gemm bench_attention profile calibration_check"
STAGES=${*:-$ALL}
declare -A VERDICT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$RESULTS/gpu.txt"
for stage in $STAGES; do
  stage=${stage//-/_}
  echo "=== $stage"
  start=$(date +%s)
  if "stage_$stage" 2>&1 | tee "$RESULTS/$stage.log"; then VERDICT[$stage]=ok; else VERDICT[$stage]=FAILED; fi
  echo "=== $stage: ${VERDICT[$stage]} in $(( $(date +%s) - start )) s"
done
tar -C "$OUT" -czf "$OUT/results.tgz" results
echo "=== summary"
for stage in $STAGES; do stage=${stage//-/_}; echo "$stage: ${VERDICT[$stage]}"; done
