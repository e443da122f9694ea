"""The engine on the GPU (cuda backend, fp16): CUDA-graph replay against eager runs of the same Programs, KV and
batch bucket switches, per-sequence lengths, the cache written in place, the tokens and logits against the
cpu backend on the same graph, and the paged engine (kv_memory / kv_blocks) against the contiguous one. The model:
smollm2-135m's shapes (every GEMM shape is in engines/profiles/h200.json, so the build profiles nothing), 2 layers,
random weights."""

import io

import pytest

pytestmark = pytest.mark.gpu

PROMPT = [5, 17, 42, 8, 99, 3, 250, 11, 1000, 4096, 77, 12]


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    folder = tmp_path_factory.mktemp("gpu_engine")
    onnx_path = folder / "model.onnx"
    export_model("smollm2-135m", onnx_path, dtype="float16", max_cache=384, num_layers=2, random_init=True,
                 progress=False)
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    out = folder / "engine"
    manifest = build_engine(rewritten, out, backend="cuda", max_batch=4, max_seq=384, stream=io.StringIO())
    assert manifest["gemm_shapes_profiled_now"] == []  # every shape came from the profile
    assert manifest["glue_ops"] == {"rms_norm": 5, "rope_append": 2}  # the rope_append kernel serves both layers
    return out


def _engine(engine_dir, **options):
    from fdpp_rewrite.engine.runtime import Engine

    return Engine(engine_dir, **options)


def _greedy_with_logits(engine, prompts, steps):
    import torch

    from fdpp_rewrite.engine.runtime import Sampler

    captured, sampler = [], Sampler()

    def record(logits):
        captured.append(logits.float().cpu())
        return sampler(logits)

    tokens = engine.generate(prompts, steps, sampler=record).tokens
    return tokens, torch.stack(captured)


def test_graph_replay_equals_eager(engine_dir):
    import torch

    graphs, eager = _engine(engine_dir), _engine(engine_dir, use_graphs=False)
    a_tokens, a_logits = _greedy_with_logits(graphs, [PROMPT], 12)
    b_tokens, b_logits = _greedy_with_logits(eager, [PROMPT], 12)
    assert graphs.graphs and not eager.graphs
    assert a_tokens == b_tokens
    assert torch.equal(a_logits, b_logits)  # the same kernels on the same inputs: bit for bit


def test_prompt_passes_replay_captured_graphs_and_equal_eager(engine_dir):
    """A prompt pass is captured on its first run per (slot, prefill bucket, KV bucket) and replayed after; whole
    prompts and chunks after earlier ones (past_len > 0) give the eager engine's logits bit for bit."""
    import torch

    graphs, eager = _engine(engine_dir), _engine(engine_dir, use_graphs=False)
    for prompt in (PROMPT, [7, 300, 12, 9000, 5, 6]):  # one prefill bucket (16): the second replays the first's graph
        a_tokens, a_logits = _greedy_with_logits(graphs, [prompt], 6)
        b_tokens, b_logits = _greedy_with_logits(eager, [prompt], 6)
        assert a_tokens == b_tokens and torch.equal(a_logits, b_logits)
    assert set(graphs.prefill_graphs) == {(0, 16, 128)} and not eager.prefill_graphs

    prompt = (PROMPT * 10)[:100]  # chunks of 32, 32, 32, 4 after 0, 32, 64, 96 tokens
    runs = []
    for engine in (graphs, graphs, eager):  # captured, replayed, eager
        engine.reset()
        runs.append([engine.prefill_chunk(1, prompt[i:i + 32]) for i in range(0, len(prompt), 32)])
        assert engine.lengths[1] == len(prompt)
    assert {key for key in graphs.prefill_graphs if key[0] == 1} == {(1, 32, 128), (1, 16, 128)}
    for captured, replayed, alone in zip(*runs):
        assert torch.equal(captured, alone) and torch.equal(replayed, alone)


def test_kv_and_batch_bucket_switches(engine_dir):
    import torch

    graphs, eager = _engine(engine_dir), _engine(engine_dir, use_graphs=False)
    prompts = [(PROMPT * 11)[:120], PROMPT[:5], PROMPT]  # crosses KV 128 -> 256; batch 3 runs bucket 4
    a_tokens, a_logits = _greedy_with_logits(graphs, prompts, 16)
    b_tokens, b_logits = _greedy_with_logits(eager, prompts, 16)
    assert {key for key in graphs.graphs} == {(4, 128), (4, 256)}
    assert a_tokens == b_tokens and torch.equal(a_logits, b_logits)


def test_per_sequence_lengths_equal_each_alone(engine_dir):
    engine = _engine(engine_dir)
    prompts = [PROMPT[:3], PROMPT, (PROMPT * 4)[:40]]
    together, together_logits = _greedy_with_logits(engine, prompts, 8)
    for index, prompt in enumerate(prompts):
        alone, alone_logits = _greedy_with_logits(engine, [prompt], 8)
        assert alone[0] == together[index]
        # batch 1 and batch 4 may take different GEMM paths (ImplA / ImplB): fp16 rounding only
        assert (alone_logits[:, 0] - together_logits[:, index]).abs().max() < 0.05


def test_cache_written_in_place_and_never_copied(engine_dir):
    import torch

    engine = _engine(engine_dir)
    pointers = [cache.data_ptr() for cache in engine.caches]
    engine.generate([PROMPT], 6)
    torch.cuda.synchronize()
    assert [cache.data_ptr() for cache in engine.caches] == pointers
    rows = engine.caches[0][0, :, : len(PROMPT) + 5].float().abs().sum(-1)
    assert bool((rows > 0).all())
    last = max(len(PROMPT) + 5, engine.prefill_buckets[0])  # the decode rows, or the prefill's padding rows
    assert float(engine.caches[0][0, :, last:].float().abs().sum()) == 0.0


def test_tokens_and_logits_equal_the_cpu_backend(engine_dir):
    cuda, cpu = _engine(engine_dir), _engine(engine_dir, backend="cpu")
    a_tokens, a_logits = _greedy_with_logits(cuda, [PROMPT], 6)
    b_tokens, b_logits = _greedy_with_logits(cpu, [PROMPT], 6)
    # fp16 on both sides, with different accumulation orders: compare the first steps' logits within a
    # tolerance, and the tokens up to the first step where the cpu backend's top two are within it
    diff = (a_logits - b_logits).abs().max().item()
    assert diff < 0.1, diff
    top2 = b_logits[:, 0].topk(2, dim=-1).values
    margin_ok = (top2[:, 0] - top2[:, 1]) > 0.2
    agree = next((i for i, ok in enumerate(margin_ok.tolist()) if not ok), len(a_tokens[0]))
    assert a_tokens[0][:agree] == b_tokens[0][:agree]


def test_stock_torch_baseline_computes_the_same_model(engine_dir):
    """TorchKernels (cuBLAS GEMMs, SDPA over the cache view) against this project's kernels: fp16 rounding only."""
    from fdpp_rewrite.engine.ablations import TorchKernels

    ours_tokens, ours = _greedy_with_logits(_engine(engine_dir), [PROMPT, PROMPT[:5]], 6)
    theirs_tokens, theirs = _greedy_with_logits(_engine(engine_dir, wrapper=TorchKernels), [PROMPT, PROMPT[:5]], 6)
    assert (ours[0] - theirs[0]).abs().max().item() < 0.1  # the prefill logits of both sequences
    assert ours_tokens[0][:2] == theirs_tokens[0][:2]


def test_kernel_launches_are_counted(engine_dir):
    from fdpp_rewrite.engine.bench import count_kernels

    engine = _engine(engine_dir)
    engine.generate([PROMPT], 4)
    engine.active = 1
    counts = count_kernels(engine, 1)
    assert counts["eager"] > 0 and counts.get("graph", counts["eager"]) > 0


@pytest.mark.parametrize("ablation", ["synchronized-softmax", "cublaslt-gemm", "static-dispatch", "unfused-glue",
                                      "sdpa-attention"])
def test_each_ablation_computes_the_same_model(engine_dir, ablation):
    """bench --ablate's engines switch one technique each; the model they compute is the same (fp16 rounding)."""
    from fdpp_rewrite.engine.ablations import ABLATIONS
    from fdpp_rewrite.engine.bench import count_kernels

    assert ablation in ABLATIONS
    ours_tokens, ours = _greedy_with_logits(_engine(engine_dir), [PROMPT, PROMPT[:5]], 6)
    engine = _engine(engine_dir, wrapper=ABLATIONS[ablation])
    theirs_tokens, theirs = _greedy_with_logits(engine, [PROMPT, PROMPT[:5]], 6)
    assert (ours[0] - theirs[0]).abs().max().item() < 0.1
    assert ours_tokens[0][:2] == theirs_tokens[0][:2]
    fused = _engine(engine_dir)
    for e in (engine, fused):  # a batch-1 run, whose decode bucket count_kernels replays
        e.generate([PROMPT], 4)
        e.active = 1
    launches, fused_launches = count_kernels(engine, 1)["per_layer"], count_kernels(fused, 1)["per_layer"]
    if ablation == "unfused-glue":  # the separate SiLU-mul, residual add and norm ops are more launches
        assert launches > fused_launches


# -- the paged engine (paged_engine.py) ----------------------------------------------------------------------------

PAGED_PROMPTS = [PROMPT, [(13 * i + 7) % 4000 for i in range(150)], [9, 9]]


def test_paged_tokens_equal_the_contiguous_engine(engine_dir):
    import torch

    paged, contiguous = _engine(engine_dir, kv_memory="1GiB"), _engine(engine_dir)
    assert paged.paged and paged.kv.tensors[0].shape[2] == 64
    ours, our_logits = _greedy_with_logits(paged, PAGED_PROMPTS, 16)
    theirs, their_logits = _greedy_with_logits(contiguous, PAGED_PROMPTS, 16)
    assert ours == theirs
    torch.testing.assert_close(our_logits, their_logits, atol=2e-2, rtol=2e-2)  # other kernels' tile orders


def test_paged_graph_replay_equals_eager(engine_dir):
    import torch

    graphs, eager = _engine(engine_dir, kv_blocks=64), _engine(engine_dir, kv_blocks=64, use_graphs=False)
    for _ in range(2):  # the second generate replays every step the first captured
        a_tokens, a_logits = _greedy_with_logits(graphs, PAGED_PROMPTS, 10)
        b_tokens, b_logits = _greedy_with_logits(eager, PAGED_PROMPTS, 10)
        assert a_tokens == b_tokens and torch.equal(a_logits, b_logits)
    assert any(out is not None for _, out in graphs.paged_steps.values())  # captured graphs
    assert all(out is None for _, out in eager.paged_steps.values())
    assert graphs.kv.used_blocks == eager.kv.used_blocks > 0


def test_a_batched_prefill_equals_each_prompt_alone(engine_dir):
    import torch

    engine = _engine(engine_dir, kv_blocks=64)
    together = engine.prefill_batch(PAGED_PROMPTS).float().cpu()
    alone = []
    for ids in PAGED_PROMPTS:
        engine.reset()
        alone.append(engine.prefill(0, ids).float().cpu())
    torch.testing.assert_close(together, torch.stack(alone), atol=2e-2, rtol=2e-2)
    assert engine.kv.pool.check() is None


def test_paged_pool_is_sized_around_the_measured_largest_step(engine_dir, capsys):
    """kv_memory on cuda: the largest step is measured at load and kept back with its graph pool and the headroom;
    the pool line says so; every captured step writes its logits rows into the one shared buffer."""
    import torch

    from fdpp_rewrite.engine import paged_memory

    engine = _engine(engine_dir, kv_memory="0.05")
    line = capsys.readouterr().err
    assert "KV pool: " in line and "kept back (step peak" in line
    peak = paged_memory.step_peak_bytes(engine)
    assert peak > 0
    free = torch.cuda.mem_get_info()[0]
    _greedy_with_logits(engine, PAGED_PROMPTS, 6)
    assert free - torch.cuda.mem_get_info()[0] <= paged_memory.reserve_bytes(peak)  # the steps fit what was kept
    captured = [out for _, out in engine.paged_steps.values() if out is not None]
    assert captured and all(out.untyped_storage().data_ptr() == engine.step_logits.untyped_storage().data_ptr()
                            for out in captured)


def test_stream_reads_take_the_fastest_of_every_read():
    from fdpp_rewrite.engine.bench import StreamReads

    reads = StreamReads(1.0)  # its quarter is 256 MiB: every read runs
    reads.measure("before")
    reads.measure("after")
    assert [(r["read"], r["when"]) for r in reads.results] == [
        (name, when) for when in ("before", "after") for name in ("sum", "sum of a quarter", "copy")]
    assert all(r["bytes_per_s"] > 1e10 for r in reads.results)
    assert reads.best() == max(r["bytes_per_s"] for r in reads.results)
    reads.close()
    small = StreamReads(0.5)  # a quarter of 128 MiB would partly hit the L2 cache: not run
    assert [name for name, _, _ in small.reads()] == ["sum", "copy"]
    small.close()
