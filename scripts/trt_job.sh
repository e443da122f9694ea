#!/usr/bin/env bash
# The TensorRT adapters on the H200 (issue 26): TensorRT-RTX installed from wheels carried in parts, the library
# built with TensorRT's headers, the harness's GPU tests (enqueue, CUDA graphs) and TensorRT-RTX plan builds.
# Results go to $OUT: summary.txt, one log per stage, results.tgz (everything, packed after every stage).
#
# Here, once (nothing fetched is committed; .thirdparty/ and .trt-parts/ are git-ignored):
#   fetch NVIDIA/TensorRT, then: git -C <mirror> archive HEAD include | tar -x -C .thirdparty/tensorrt
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d /tmp/rtx tensorrt-rtx-cu13-libs==1.7.1.116 tensorrt-rtx-cu13-bindings==1.7.1.116
#   mkdir -p .trt-parts/1 .trt-parts/2 .trt-parts/3 .trt-parts/4
#   split -b 30M -d /tmp/rtx/tensorrt_rtx_cu13_libs-*.whl /tmp/rtx/libs.part. && \
#     for i in 0 1 2 3; do [ -f /tmp/rtx/libs.part.0$i ] && mv /tmp/rtx/libs.part.0$i .trt-parts/$((i+1))/; done
#   cp /tmp/rtx/tensorrt_rtx_cu13_bindings-*.whl .trt-parts/1/
# On the device, one call per part while the machine stays warm (the parts wait in /tmp/trt_parts), then the job:
#   run carry=[".trt-parts/1"]  command="scripts/trt_job.sh stash"      (and so on for 2, 3, 4)
#   run carry=[".thirdparty"]   command="scripts/trt_job.sh"           (install lib tests presets llama2)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=python3
OUT=${OUT:-$PWD/out/trt}
WORK=${TRT_WORK:-/tmp/trt_job}
PARTS=/tmp/trt_parts SITE=${TRT_SITE:-/tmp/trt_site} BUILD=${TRT_BUILD:-/tmp/trt-build}
mkdir -p "$OUT" "$WORK" "$PARTS"
export FDPP_PLUGIN_LIB=$BUILD/libfdpp_plugins.so
declare -A LIMIT=([stash]=60 [install]=120 [lib]=${LIB_TIMEOUT:-400} [tests]=${TESTS_TIMEOUT:-300}
                  [presets]=${PRESETS_TIMEOUT:-300} [llama2]=${LLAMA2_TIMEOUT:-300})

stage_stash() {  # keep this call's carried parts for the install stage
  cp -v .trt-parts/*/* "$PARTS"/ && ls -la "$PARTS"
}

stage_install() {  # join the libs wheel, install both, add the link TensorRT-RTX's ONNX parser dlopens
  local libs=$WORK/tensorrt_rtx_cu13_libs-1.7.1.116-py3-none-manylinux_2_28_x86_64.whl
  cat "$PARTS"/libs.part.* >"$libs" || return 1
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$libs" \
    "$PARTS"/tensorrt_rtx_cu13_bindings-*.whl || return 1
  ln -sf libtensorrt_rtx.so.1 "$SITE/tensorrt_rtx_libs/libtensorrt_rtx.so"
  PYTHONPATH=$SITE $PY -c "import tensorrt_rtx_bindings as t; print('tensorrt_rtx', t.__version__)"
}

stage_lib() {  # the library with the adapters, and the harness beside it
  [ -f .thirdparty/tensorrt/include/NvInferRuntime.h ] || { echo "carry .thirdparty (TensorRT's headers)"; return 1; }
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFDPP_CUDA_ARCHS=90a \
    -DTensorRT_INCLUDE_DIR="$PWD/.thirdparty/tensorrt/include" >/dev/null \
    && time cmake --build "$BUILD" -j "$(nproc)" >"$WORK/build.log" 2>&1 \
    || { tail -n 30 "$WORK/build.log"; return 1; }
  grep -i "warning" "$WORK/build.log" | grep -v ptxas  # our code's warnings: none expected
  nm -D --defined-only "$FDPP_PLUGIN_LIB" | awk '{print $3}' | grep -v '^fdpp_'  # getCreators, setLoggerFinder
}

stage_tests() {  # harness (build phase, round trip, enqueue eager + CUDA graph) and TensorRT-RTX plan builds
  PYTHONPATH=$PYTHONPATH:$SITE timeout 280 $PY -m pytest -q -p no:cacheprovider --tb=short -rs tests/plugins/trt
}

build_one() {  # $1: a rewritten graph, $2: the plan to write; prints the one line build says
  PYTHONPATH=$PYTHONPATH:$SITE $PY -m fdpp_rewrite build "$1" --backend tensorrt -o "$2" --max-batch 8 --force 2>&1 \
    | grep -E "^(wrote|error)" | tail -1
}

nodes_graph() {  # $1: a rewritten graph, $2: dtype, $3: where to write its FlatGemm + attention nodes alone
  $PY - "$@" <<'EOF'
import sys
import onnx
sys.path.insert(0, "tests/helpers")
from trt_harness_io import fdpp_nodes_graph
onnx.save(fdpp_nodes_graph(onnx.load(sys.argv[1]), sys.argv[2]), sys.argv[3])
EOF
}

stage_presets() {  # every family's tiny preset: the whole rewritten graph, then its fdpp nodes alone, fp16 and bf16
  for preset in tiny-llama tiny-smollm2 tiny-llama3 tiny-qwen2 tiny-mistral tiny-opt tiny-gpt2 tiny-chatglm; do
    local dir=$WORK/$preset
    $PY -m fdpp_rewrite export "$preset" --dtype float16 --max-cache 256 -o "$dir/model.onnx" --force >/dev/null 2>&1 \
      && $PY -m fdpp_rewrite rewrite "$dir/model.onnx" --force >/dev/null 2>&1 || { echo "$preset: export failed"; continue; }
    echo "$preset whole graph: $(build_one "$dir/model.fdpp.onnx" "$dir/model.plan")"
    for dtype in float16 bfloat16; do
      nodes_graph "$dir/model.fdpp.onnx" $dtype "$dir/nodes_$dtype.onnx" \
        && echo "$preset fdpp nodes $dtype: $(build_one "$dir/nodes_$dtype.onnx" "$dir/nodes_$dtype.plan")"
    done
  done
}

stage_llama2() {  # one real-size llama2-7b layer: qkv FlatGemm [12288, 4096] and 32-head attention over 2048
  local dir=$WORK/llama2
  $PY -m fdpp_rewrite export llama2-7b --layers 1 --random-init --dtype float16 --max-cache 2048 \
    -o "$dir/model.onnx" --force >/dev/null 2>&1 \
    && $PY -m fdpp_rewrite rewrite "$dir/model.onnx" --profile engines/profiles/h200.json --force >/dev/null 2>&1 \
    || { echo "llama2-7b: export failed"; return 1; }
  echo "llama2-7b whole layer: $(build_one "$dir/model.fdpp.onnx" "$dir/model.plan")"
  for dtype in float16 bfloat16; do
    nodes_graph "$dir/model.fdpp.onnx" $dtype "$dir/nodes_$dtype.onnx" \
      && echo "llama2-7b fdpp nodes $dtype: $(build_one "$dir/nodes_$dtype.onnx" "$dir/nodes_$dtype.plan")"
  done
}

export -f stage_stash stage_install stage_lib stage_tests build_one nodes_graph stage_presets stage_llama2
export PY WORK PARTS SITE BUILD FDPP_PLUGIN_LIB
STAGES=${*:-install lib tests presets llama2}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
for stage in $STAGES; do
  start=$(date +%s)
  if timeout "${LIMIT[$stage]}" bash -c "stage_$stage" >"$OUT/$stage.log" 2>&1; then verdict=ok; else verdict="FAILED (rc $?)"; fi
  tail -n 40 "$OUT/$stage.log"
  echo "$stage: $verdict in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
  if [ "$stage" != stash ]; then  # after every stage: a later timeout keeps what ran
    tar -C "$OUT" -czf "$WORK/results.tgz" --exclude results.tgz . && cp "$WORK/results.tgz" "$OUT/"
  fi
done
