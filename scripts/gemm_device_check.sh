#!/usr/bin/env bash
# One GPU session for the flat GEMM: correctness tests, the benchmark, compute-sanitizer; logs under $1.
#   scripts/gemm_device_check.sh OUT_DIR [tests|bench|sanitize|profile PRESET...]...
# Uses $FDPP_PLUGIN_LIB (default build/libfdpp_plugins.so); builds it with CMake if it cannot be loaded.
set -uo pipefail
out=${1:?usage: scripts/gemm_device_check.sh OUT_DIR [steps]}
shift
steps=${*:-tests bench sanitize}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
export FDPP_PLUGIN_LIB=${FDPP_PLUGIN_LIB:-$PWD/build/libfdpp_plugins.so}
log="$out/log.txt"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee -a "$log"
if ! python3 -c "import torch; from fdpp_rewrite.gpu import gemm; gemm.library(); print('library', gemm._lib.library_path(), 'cuBLASLt', gemm.cublaslt_available(), 'CUTLASS', gemm.cutlass_available(), gemm.device_info())" 2>&1 | tee -a "$log"; then
  echo "library did not load; building it here" | tee -a "$log"
  cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release >>"$log" 2>&1 && cmake --build build-device -j "$(nproc)" >>"$log" 2>&1
  export FDPP_PLUGIN_LIB=$PWD/build-device/libfdpp_plugins.so
fi

for step in $steps; do
  case $step in
    tests)
      timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider --tb=short --maxfail=25 -m "gpu and not slow" \
        tests/gpu/test_gemm.py 2>&1 | tail -60 | tee -a "$log" ;;
    bench)
      timeout ${BENCH_TIMEOUT:-240} python3 scripts/bench_gemm.py --out "$out/bench" --force 2>&1 | tee -a "$log" ;;
    sanitize)
      timeout ${SANITIZE_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_gemm_sanitizer.py \
        -k "${SANITIZE_TOOLS:-memcheck or racecheck or synccheck}" 2>&1 | tail -40 | tee -a "$log" ;;
    profile)
      ;;  # handled below with its presets
    *)
      break ;;
  esac
done
if [[ " $steps " == *" profile "* ]]; then
  presets=${steps#*profile }
  timeout 500 python3 -m fdpp_rewrite.profile $presets --out "$out/profile.json" --plots "$out/plots" --force 2>&1 \
    | tee -a "$log"
fi
