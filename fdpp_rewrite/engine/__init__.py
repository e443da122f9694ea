"""The GPU engine (docs/design.md: the torch backend): build a rewritten graph into an engine folder, run it with the
plugin library's kernels and CUDA graphs, benchmark it.

    python -m fdpp_rewrite build model.fdpp.onnx -o engines/m [--max-batch 8 --max-seq 2048]
    python -m fdpp_rewrite run engines/m --prompt "..." [--max-new-tokens 64 --temperature 0.7 ...]
    python -m fdpp_rewrite bench engines/m [--batch 1 --context 128 --new-tokens 128]

Modules: build.py (lowering and the engine folder; GEMM plans from fdpp_rewrite/gemm_plans.py), folder.py (the
atomic folder swap), manifest.py (reading and checking manifest, plan and weights), verify.py (`fdpp verify`),
hf_interface.py (Hugging Face graphs), ops.py (ONNX op -> torch), backends.py (fdpp ops -> kernels on `cuda`,
reference math on `cpu`), ablations.py (the stock-torch peer and `bench --ablate` as wrapper backends),
interpreter.py (per-bucket tracing into replayable Programs), runtime.py (Engine: load, one forward pass; its calls
forward to slots.py, the contiguous slot API, or paged_engine.py, the step API of a paged engine), kv_cache.py
(contiguous slots and their lengths), paged_cache.py (block pools and the block table), paged_step.py (RopeAppend and
attention split over block tables), paged/ (block pool, prefix cache, sizing), buckets.py, programs.py (traced
Programs and CUDA graphs), sampling.py, generation.py (batch generate), tensor_parallel.py (sharding) and
tp_group.py (ranks at run time), bench.py, cli.py.

Decisions (what docs/design.md records):
- The plan is the graph's own node list, not a model: every family the rewriter supports lowers through the same
  interpreter. Shape-only subgraphs are folded on the host per bucket (see interpreter.py); nothing is read back
  from the GPU inside a step other than the sampled tokens.
- Buckets: decode batch sizes 1, 2, 4, ... up to max_batch (and max_batch itself); KV lengths 128, 256, ... up to
  max_seq (and max_seq itself). A decode step of batch B at longest length L runs the bucket (smallest batch
  bucket >= B, smallest KV bucket > L): its caches are the views cache[:Bb, :, :Lb] of the one allocation, so a
  short context reads a short cache. Padding slots get past_len 0 and token 0; their rows are never read.
- The KV cache is allocated once per engine, [max_batch, Hkv, max_seq, D] per layer (the graph's fixed capacity
  dimension replaced by max_seq); ScatterND into a cache input is an in-place index write, as is RopeAppend.
- The glue ops come from the rewriter (fdpp_rewrite/passes/norm.py, rope_append.py): fdpp::RMSNorm runs the norm
  kernel, fdpp::RopeAppend the rope_append kernel (writing the caches in place). A llama-family decode step is then 8
  launches per layer: 4 GEMMs, 2 norms, rope_append, attention.
- A paged engine (build --kv-memory) keeps a pool of 64-token blocks per cache input and a block table per row;
  every call is one step of B decode rows and P prompt chunks (tokens-major [1, B + P x C]), so the prefill of a
  batch of prompts runs as batched chunk rounds, and a row costs only a table row (256 rows by default).
- On a contiguous engine, prefill runs one sequence at a time at batch 1 into its slot, right-padded to a prefill
  bucket (16, 32, ...) so every prompt length of a bucket replays one traced Program (exact: see Engine.prefill);
  decode steps of a bucket are traced once, then captured as one CUDA graph and replayed.
- wrapper=ablations.TorchKernels swaps only the GEMMs (cuBLAS through torch, epilogues unfused) and the attention
  (SDPA) for stock torch: the peer `bench --kernels fdpp torch` measures against.
- Two graph interfaces, told apart by build from the graph's inputs: our exporter's (input_ids, past_len,
  key_cache.N / value_cache.N written in place) and torch.onnx exports of transformers' models (input_ids,
  attention_mask, position_ids, past_key_values.N.*; present = Concat(past, new), lowered to an in-place append
  into the engine's cache: hf_interface.py). A prefill-only Hugging Face export is refused (one line).
- Format version FORMAT_VERSION; a newer engine, another GPU or another plugin library build is a one-line error.
"""

FORMAT_VERSION = 1
