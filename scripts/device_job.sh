#!/usr/bin/env bash
# The one project script for the GPU machine: GPU tests, compute-sanitizer, benchmarks, the calibration check
# and the GEMM profiles, in one call. Everything lands in a scratch results/ folder and is packed into
# $OUT/device_results.tgz (DEVICE_ARCHIVE names it instead; written to a temporary name, then moved, so a reader
# never sees half an archive; scripts/engine_job.sh writes its own, engine_results-*.tgz) after every stage (the
# device tool returns at most 8 files). A stage that fails or times out does not stop the others; the summary at
# the end says which passed.
#
#   scripts/device_job.sh                          # every stage
#   scripts/device_job.sh attention_tests gemm_bench   # only these
#
# The library: $FDPP_PLUGIN_LIB if set and loadable, else build/libfdpp_plugins.so, else it is built here
# (without CUTLASS headers unless the nvidia-cutlass wheel is installed: ImplC is then cuBLASLt only; with
# BENCH_ABLATIONS=ON the benchmark-only padding ablation is built too, for gemm_bench's pad16/pad64 columns).
# wgmma_probe runs the sm_90 prefill's smoke test first, so that a broken wgmma kernel is named on its own.
# JOB_DEADLINE_S (seconds from the script's start, less JOB_MARGIN_S, default 30, for the archive): each stage's
# own limit is cut to what is left (SIGTERM, SIGKILL 10 s later), and a stage with under 30 s left is SKIPPED.
# Wheels in .whl/ (scripts/device_wheels.sh; carry `.whl`) are installed into /tmp/site first: nvidia-cutlass gives
# the build its CUTLASS headers (the tests and scripts here import nothing else from them).
set -uo pipefail
JOB_START=$(date +%s)
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/device}
ARCHIVE=${DEVICE_ARCHIVE:-device_results.tgz}
WORK=$(mktemp -d)
RESULTS=$WORK/results
mkdir -p "$RESULTS" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # as scripts/engine_job.sh: once per set of wheels
  if [ "$(ls .whl/*.whl)" != "$(cat /tmp/site/.engine_job_wheels 2>/dev/null)" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl && ls .whl/*.whl >/tmp/site/.engine_job_wheels
  fi
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
export FDPP_PLUGIN_LIB=${FDPP_PLUGIN_LIB:-$PWD/build/libfdpp_plugins.so}
CALIBRATION=${CALIBRATION:-out/calibration}

END=$(( JOB_START + ${JOB_DEADLINE_S:-86400} - ${JOB_MARGIN_S:-30} ))  # no stage (nor the build) runs past it
timeout() {  # $1: a step's own limit in seconds, cut to what is left before END (at least 1); then the command
  local limit=$1 left=$(( END - $(date +%s) )); shift
  left=$(( left < 1 ? 1 : left ))
  command timeout -k 10 $(( left < limit ? left : limit )) "$@"
}

if [ $(( END - $(date +%s) )) -lt 30 ]; then
  echo "=== no time left for the library's build (JOB_DEADLINE_S)"
elif ! python3 -c "from fdpp_rewrite.gpu import lib; lib.load()" 2>/dev/null; then
  echo "=== $FDPP_PLUGIN_LIB does not load; building the library here"
  timeout 120 cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DFDPP_CUDA_ARCHS=90a \
    -DFDPP_BENCH_ABLATIONS="${BENCH_ABLATIONS:-OFF}" >"$RESULTS/cmake.log" 2>&1 \
    && timeout 900 cmake --build build-device -j "$(nproc)" >>"$RESULTS/cmake.log" 2>&1
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
pack() {  # the results into $OUT/$ARCHIVE, whole or not at all
  local tmp=$OUT/$ARCHIVE.$$.tmp
  tar -C "$WORK" -czf "$tmp" results && mv -f "$tmp" "$OUT/$ARCHIVE" || rm -f "$tmp"
}
for stage in $STAGES; do
  start=$(date +%s)
  if [ $(( END - start )) -lt 30 ]; then
    VERDICT[$stage]="SKIPPED ($(( END - start )) s left of JOB_DEADLINE_S)"; echo "=== $stage: ${VERDICT[$stage]}"
    continue
  fi
  echo "=== $stage ($(date +%T), at most $(( END - start )) s)"
  if "stage_$stage" >"$RESULTS/$stage.log" 2>&1; then VERDICT[$stage]=ok; else VERDICT[$stage]="FAILED (rc $?)"; fi
  tail -n 25 "$RESULTS/$stage.log"
  echo "=== $stage: ${VERDICT[$stage]} in $(( $(date +%s) - start )) s"
  pack   # after every stage, so a timeout still returns what ran
done
echo "=== summary"
for stage in $STAGES; do echo "$stage: ${VERDICT[$stage]}"; done | tee "$RESULTS/summary.txt" "$OUT/summary.txt"
pack
