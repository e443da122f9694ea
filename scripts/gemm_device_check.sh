#!/usr/bin/env bash
# One GPU session for the flat GEMM: correctness tests, compute-sanitizer, the benchmark and the profiles.
#   scripts/gemm_device_check.sh OUT_DIR [tests] [sanitize] [bench] [profile]
# OUT_DIR receives at most 5 files (the device tool returns few): log.txt, bench_results.json,
# bench_plots.tgz, profile.json, profile_plots.tgz. Environment: FDPP_PLUGIN_LIB (default
# build/libfdpp_plugins.so; built with CMake here if it cannot be loaded), PRESETS (profile step; default the
# five the project ships), *_TIMEOUT per step in seconds.
set -uo pipefail
out=${1:?usage: scripts/gemm_device_check.sh OUT_DIR [tests] [sanitize] [bench] [profile]}
shift
steps=${*:-tests sanitize bench profile}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
export FDPP_PLUGIN_LIB=${FDPP_PLUGIN_LIB:-$PWD/build/libfdpp_plugins.so}
log="$out/log.txt"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee -a "$log"
check_lib='import torch; from fdpp_rewrite.gpu import gemm; gemm.library(); print("library", gemm._lib.library_path(), "cuBLASLt", gemm.cublaslt_available(), "CUTLASS", gemm.cutlass_available(), gemm.device_info())'
if ! python3 -c "$check_lib" 2>&1 | tee -a "$log"; then
  echo "library did not load; building it here" | tee -a "$log"
  cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release >>"$log" 2>&1 && cmake --build build-device -j "$(nproc)" >>"$log" 2>&1
  export FDPP_PLUGIN_LIB=$PWD/build-device/libfdpp_plugins.so
fi

for step in $steps; do
  echo "== step $step ($(date +%T))" | tee -a "$log"
  case $step in
    tests)
      timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider --tb=short --maxfail=25 \
        -m "gpu and not slow" tests/gpu/test_gemm.py 2>&1 | tail -40 | tee -a "$log" ;;
    sanitize)
      timeout "${SANITIZE_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider --tb=short \
        tests/gpu/test_gemm_sanitizer.py 2>&1 | tail -40 | tee -a "$log" ;;
    bench)
      timeout "${BENCH_TIMEOUT:-300}" python3 scripts/bench_gemm.py --out "$work/bench" --force 2>&1 | tee -a "$log"
      cp "$work/bench/results.json" "$out/bench_results.json" 2>/dev/null
      (cd "$work/bench" 2>/dev/null && tar czf "$out/bench_plots.tgz" ./*.png command.txt) ;;
    profile)
      # shellcheck disable=SC2086
      timeout "${PROFILE_TIMEOUT:-600}" python3 -m fdpp_rewrite.profile ${PRESETS:-llama2-7b llama2-13b opt-6.7b chatglm2-6b smollm2-135m} \
        --out "$out/profile.json" --plots "$work/plots" --reps "${PROFILE_REPS:-20}" --force 2>&1 | tee -a "$log"
      (cd "$work" && tar czf "$out/profile_plots.tgz" plots) ;;
    *)
      echo "unknown step $step" | tee -a "$log" ;;
  esac
done
echo "== done ($(date +%T))" | tee -a "$log"
