#!/usr/bin/env bash
# The one project script for the GPU machine: GPU tests, compute-sanitizer, benchmarks, the calibration check
# and the GEMM profiles, in one call. Everything lands in $OUT/results/ and is packed into $OUT/results.tgz
# (the device tool returns at most 8 files). A stage that fails or times out does not stop the others; the
# summary at the end says which passed.
#
#   scripts/device_job.sh                          # every stage
#   scripts/device_job.sh attention_tests gemm_bench   # only these
#
# The library: $FDPP_PLUGIN_LIB if set and loadable, else build/libfdpp_plugins.so, else it is built here
# (without CUTLASS headers unless the nvidia-cutlass wheel is installed: ImplC is then cuBLASLt only; with
# BENCH_ABLATIONS=ON the benchmark-only padding ablation is built too, for gemm_bench's pad16/pad64 columns).
# wgmma_probe runs the sm_90 prefill's smoke test first, so that a broken wgmma kernel is named on its own.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/device}
WORK=$(mktemp -d)
RESULTS=$WORK/results
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export FDPP_PLUGIN_LIB=${FDPP_PLUGIN_LIB:-$PWD/build/libfdpp_plugins.so}
CALIBRATION=${CALIBRATION:-out/calibration}

if ! python3 -c "from fdpp_rewrite.gpu import lib; lib.load()" 2>/dev/null; then
  echo "=== $FDPP_PLUGIN_LIB does not load; building the library here"
  cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DFDPP_CUDA_ARCHS=90a \
    -DFDPP_BENCH_ABLATIONS="${BENCH_ABLATIONS:-OFF}" >"$RESULTS/cmake.log" 2>&1 \
    && cmake --build build-device -j "$(nproc)" >>"$RESULTS/cmake.log" 2>&1
  export FDPP_PLUGIN_LIB=$PWD/build-device/libfdpp_plugins.so
fi

PYTEST_GPU="python3 -m pytest -q -p no:cacheprovider --tb=short -rs -m gpu"
SANITIZE="compute-sanitizer --error-exitcode 7 --tool"

stage_wgmma_probe()       { timeout 60 $PYTEST_GPU tests/plugins/kernels/attention/test_attention.py -k wgmma_smoke; }
stage_attention_tests()   { timeout 240 $PYTEST_GPU tests/plugins/kernels/attention/test_attention.py; }
stage_attention_sanitize() {
  timeout 180 $SANITIZE memcheck python3 scripts/sanitize_attention.py \
    && timeout 180 $SANITIZE racecheck python3 scripts/sanitize_attention.py
}
stage_attention_bench()   { timeout 180 python3 scripts/bench_attention.py --out "$RESULTS/attention"; }
stage_calibration_check() {
  timeout 60 python3 scripts/calibration_gpu_check.py --calibration "$CALIBRATION/calibration.json" \
    --qkv "$CALIBRATION/heldout_qkv.pt" --out "$RESULTS/calibration"
}
stage_gemm_tests()        { timeout 200 $PYTEST_GPU --maxfail=25 tests/plugins/kernels/gemm/test_gemm.py; }
stage_gemm_sanitize()     { timeout 240 $PYTEST_GPU tests/plugins/kernels/gemm/test_gemm_sanitizer.py; }
stage_gemm_bench() {  # with the plans of the profile made in this run, if there is one
  local plans=()
  [ -f "$RESULTS/profiles/h200.json" ] && plans=(--profile "$RESULTS/profiles/h200.json")
  timeout "${BENCH_TIMEOUT:-180}" python3 scripts/bench_gemm.py --out "$RESULTS/gemm" --force "${plans[@]}"
}
stage_gemm_loaders()      { timeout 120 python3 scripts/bench_implb_loaders.py --out "$RESULTS/gemm_loaders"; }
stage_profile() {
  timeout "${PROFILE_TIMEOUT:-300}" python3 -m fdpp_rewrite profile \
    ${PRESETS:-llama2-7b llama2-13b opt-6.7b chatglm2-6b smollm2-135m} \
    --out "$RESULTS/profiles/h200.json" --plots "$RESULTS/profiles/plots" --force ${PROFILE_ARGS:---quick}
}

ALL="wgmma_probe attention_tests attention_sanitize attention_bench calibration_check gemm_tests gemm_sanitize gemm_loaders profile gemm_bench"
STAGES=${*:-$ALL}
declare -A VERDICT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$RESULTS/gpu.txt"
echo "library: $FDPP_PLUGIN_LIB" | tee -a "$RESULTS/gpu.txt"
for stage in $STAGES; do
  echo "=== $stage ($(date +%T))"
  start=$(date +%s)
  if "stage_$stage" >"$RESULTS/$stage.log" 2>&1; then VERDICT[$stage]=ok; else VERDICT[$stage]="FAILED (rc $?)"; fi
  tail -n 25 "$RESULTS/$stage.log"
  echo "=== $stage: ${VERDICT[$stage]} in $(( $(date +%s) - start )) s"
  tar -C "$WORK" -czf "$OUT/results.tgz" results   # after every stage, so a timeout still returns what ran
done
echo "=== summary"
for stage in $STAGES; do echo "$stage: ${VERDICT[$stage]}"; done | tee "$RESULTS/summary.txt" "$OUT/summary.txt"
tar -C "$WORK" -czf "$OUT/results.tgz" results
