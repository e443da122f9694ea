"""The engine on the cpu backend: the lowering of exported + rewritten graphs, the KV cache logic (slots,
per-sequence lengths, buckets, in-place writes) and the bad-input errors. The reference for the tokens is
`fdpp_rewrite.generate`'s greedy decoding of the same graph in onnxruntime (with the CPU reference ops)."""

import io
import json
import os

import numpy as np
import pytest

from fdpp_rewrite.engine.build import build_engine
from fdpp_rewrite.engine.buckets import batch_buckets, kv_buckets, prefill_buckets
from fdpp_rewrite.engine.runtime import Engine, Sampler
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models import get_config

PROMPT = [5, 17, 42, 8, 99, 3, 250, 11]


def _export_rewrite(folder, preset, max_cache=160):
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    onnx_path = folder / f"{preset}.onnx"
    export_model(preset, onnx_path, dtype="float32", max_cache=max_cache, progress=False)
    return onnx_path, rewrite_file(onnx_path, stream=io.StringIO())


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-opt", "tiny-smollm2", "tiny-chatglm", "tiny-llama3",
                                        "tiny-qwen2", "tiny-mistral", "tiny-gpt2"])
def built(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    onnx_path, rewritten = _export_rewrite(folder, request.param)
    engine_dir = folder / "engine"
    build_engine(rewritten, engine_dir, backend="cpu", max_batch=4, max_seq=160, stream=io.StringIO())
    return request.param, onnx_path, rewritten, engine_dir


@pytest.fixture(scope="module")
def engine(built):
    return Engine(built[3])


def _onnxruntime_greedy(path, prompt, steps):
    from fdpp_rewrite.generate import CacheLayout, greedy_decode, open_session

    session = open_session(path)
    return greedy_decode(session, prompt, steps, CacheLayout.from_session(session))


def test_buckets():
    assert prefill_buckets(100) == [16, 32, 64, 100]
    assert batch_buckets(12) == [1, 2, 4, 8, 12]
    assert batch_buckets(1) == [1]
    assert kv_buckets(1000) == [128, 256, 512, 1000]
    assert kv_buckets(64) == [64]


def test_engine_folder(built):
    _, _, rewritten, engine_dir = built
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["backend"] == "cpu"
    assert manifest["max_batch"] == 4 and manifest["max_seq"] == 160
    plan = json.loads((engine_dir / "plan.json").read_text())
    gemms = [n for n in plan["nodes"] if n["op"] == "FlatGemm"]
    assert gemms and set(plan["gemm_plans"]) == {n["name"] for n in gemms}
    assert not [p for p in engine_dir.parent.iterdir() if p.name.startswith(".engine")]  # no temp folder left


def test_glue_ops_come_from_the_rewriter(built, engine):
    """One RopeAppend per layer (the full, partial-interleaved and rope-free forms alike) and, where the family has
    RMSNorm, two per layer plus the final one; no standard-op RoPE, cache write or norm chain is left."""
    layers = engine.num_layers
    norms = 0 if get_config(built[0]).norm == "layernorm" else 2 * layers + 1
    ops = [n["op"] for n in engine.plan["nodes"]]
    assert engine.manifest["glue_ops"] == {"rms_norm": norms, "rope_append": layers}
    assert ops.count("RopeAppend") == layers and "ScatterND" not in ops and "ReduceMean" not in ops


def test_greedy_tokens_equal_onnxruntime(built, engine):
    _, onnx_path, rewritten, _ = built
    expected = _onnxruntime_greedy(rewritten, PROMPT, 12)
    assert engine.generate([PROMPT], 12).tokens[0] == expected
    assert _onnxruntime_greedy(onnx_path, PROMPT, 12) == expected  # the rewrite itself changed nothing


def test_logits_equal_onnxruntime_each_step(built, engine):
    """Prefill and decode logits against onnxruntime on the original graph, step by step (float32)."""
    import onnxruntime as ort

    from fdpp_rewrite.generate import CacheLayout

    session = ort.InferenceSession(str(built[1]), providers=["CPUExecutionProvider"])
    layout = CacheLayout.from_session(session)
    caches = layout.empty_caches(1)
    captured = []
    sampler = Sampler()

    def record(logits):
        captured.append(logits.clone())
        return sampler(logits)

    tokens = engine.generate([PROMPT], 4, sampler=record).tokens[0]
    ids, past = PROMPT, 0
    for step, engine_logits in enumerate(captured):
        outputs = session.run(layout.output_names(), {"input_ids": np.array([ids], np.int64),
                                                      "past_len": np.array([past], np.int64), **caches})
        for k in range(layout.num_layers):
            caches[f"key_cache.{k}"], caches[f"value_cache.{k}"] = outputs[1 + 2 * k], outputs[2 + 2 * k]
        np.testing.assert_allclose(engine_logits[0].numpy(), outputs[0][0, -1], atol=2e-4, rtol=2e-4)
        past += len(ids)
        ids = [tokens[step]] if step < len(tokens) else ids


def test_batch_of_two_lengths_equals_each_alone(engine):
    short, long = PROMPT[:3], PROMPT + [7, 7, 1]
    together = engine.generate([short, long], 10).tokens
    assert together[0] == engine.generate([short], 10).tokens[0]
    assert together[1] == engine.generate([long], 10).tokens[0]
    engine.generate([short, long], 3)
    assert engine.past_len[:2].tolist() == [len(short) + 2, len(long) + 2]  # per-sequence lengths on the device


def test_batch_of_three_runs_the_batch_bucket_of_four(engine):
    prompts = [PROMPT[:2], PROMPT[:5], PROMPT]
    together = engine.generate(prompts, 6).tokens
    assert [engine.generate([p], 6).tokens[0] for p in prompts] == together
    assert any(key[0] == (4, 1) for key in engine.programs)


def test_kv_bucket_switch(built):
    """max_seq 160 has KV buckets [128, 160]: a decode that crosses position 128 switches views mid-sequence,
    and the tokens still equal onnxruntime's (whose cache is the full 160)."""
    engine = Engine(built[3])
    prompt = (PROMPT * 16)[:124]
    tokens = engine.generate([prompt], 10).tokens[0]
    assert {key[1] for key in engine.programs} == {128, 160}
    assert tokens == _onnxruntime_greedy(built[2], prompt, 10)


def test_cache_written_in_place(built):
    engine = Engine(built[3])
    pointers = [cache.data_ptr() for cache in engine.caches]
    engine.generate([PROMPT], 3)
    assert [cache.data_ptr() for cache in engine.caches] == pointers
    written = engine.caches[0][0, :, : len(PROMPT) + 2]
    assert bool((written.abs().sum(-1) > 0).all())  # the prompt's rows and the two decode steps' rows
    padded = engine.prefill_buckets[0]  # the prefill also wrote its padding rows, up to its bucket (16)
    assert float(engine.caches[0][0, :, padded:].abs().sum()) == 0.0  # nothing past them
    assert float(engine.caches[0][1:].abs().sum()) == 0.0  # other slots untouched


def test_stock_torch_baseline_equals_the_reference_ops(built, engine):
    """TorchKernels (torch GEMMs with unfused epilogues, SDPA attention) computes the same model."""
    from fdpp_rewrite.engine.ablations import TorchKernels

    baseline = Engine(built[3], wrapper=TorchKernels)
    ours_tokens, ours = _greedy_logits(engine, [PROMPT, PROMPT[:3]], 6)
    theirs_tokens, theirs = _greedy_logits(baseline, [PROMPT, PROMPT[:3]], 6)
    assert ours_tokens == theirs_tokens
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-4, rtol=1e-4)


def _greedy_logits(engine, prompts, steps):
    import torch

    captured, sampler = [], Sampler()

    def record(logits):
        captured.append(logits.clone())
        return sampler(logits)

    return engine.generate(prompts, steps, sampler=record).tokens, torch.stack(captured)


def test_sampling_is_seeded(engine):
    a = engine.generate([PROMPT], 8, Sampler(temperature=1.0, top_k=20, top_p=0.9, seed=3)).tokens
    b = engine.generate([PROMPT], 8, Sampler(temperature=1.0, top_k=20, top_p=0.9, seed=3)).tokens
    assert a == b


def test_stop_ids_end_a_sequence(engine):
    first = engine.generate([PROMPT], 12).tokens[0]
    cut = next((i for i, token in enumerate(first) if token not in first[:i] and i > 0), 0)
    assert engine.generate([PROMPT], 12, stop_ids={first[cut]}).tokens[0] == first[:cut]


@pytest.mark.parametrize("prompts, new_tokens, message", [
    ([list(range(1, 160))], 8, "exceed the engine's max sequence of 160"),
    ([PROMPT] * 5, 4, "exceed the engine's max batch of 4"),
    ([[]], 4, "prompt 0 is empty"),
    ([[1, 100000]], 4, "outside the vocabulary"),
    ([PROMPT], 0, "--max-new-tokens must be at least 1"),
])
def test_bad_requests_are_one_line_errors(engine, prompts, new_tokens, message):
    with pytest.raises(FdppError, match=message) as info:
        engine.generate(prompts, new_tokens)
    assert "\n" not in str(info.value)


def test_engine_from_a_newer_format(built, tmp_path):
    import shutil

    copy = tmp_path / "newer"
    shutil.copytree(built[3], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format_version"] = 99
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FdppError, match="engine format 99, newer than"):
        Engine(copy)


def test_truncated_engine_folders(built, tmp_path):
    import shutil

    copy = tmp_path / "cut"
    shutil.copytree(built[3], copy)
    weights = copy / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(FdppError, match="does not match the sha256 in its manifest"):
        Engine(copy)
    os.remove(copy / "plan.json")
    with pytest.raises(FdppError, match="lacks plan.json"):
        Engine(copy)
    with pytest.raises(FdppError, match="not an engine folder"):
        Engine(tmp_path / "nothing")


@pytest.mark.parametrize("gpu, library, message", [
    (("NVIDIA H100 80GB HBM3", "9.0"), "abc", "was built for NVIDIA H200 .* this GPU is NVIDIA H100"),
    (("NVIDIA H200", "9.0"), "def", "another plugin library build"),
    (("NVIDIA H200", "9.0"), None, "no loadable plugin library"),
])
def test_cuda_engine_on_another_gpu_or_library(monkeypatch, gpu, library, message):
    """check_device with the GPU and the library faked: a one-line error naming the mismatch."""
    from fdpp_rewrite import errors
    from fdpp_rewrite.engine import manifest as engine_manifest
    from fdpp_rewrite.gpu import device

    manifest = {"backend": "cuda", "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"},
                "library": {"sha256": "abc"}}
    monkeypatch.setattr(errors, "require_gpu", lambda what: None)
    monkeypatch.setattr(device, "gpu_facts", lambda: {"name": gpu[0], "cc": gpu[1]})
    monkeypatch.setattr(device, "library_facts", lambda: None if library is None else {"sha256": library, "path": "x"})
    with pytest.raises(FdppError, match=message) as info:
        engine_manifest.check_device(manifest, "engines/e")
    assert "\n" not in str(info.value)
    monkeypatch.setattr(device, "gpu_facts", lambda: {"name": "NVIDIA H200", "cc": "9.0"})
    monkeypatch.setattr(device, "library_facts", lambda: {"sha256": "abc", "path": "x"})
    engine_manifest.check_device(manifest, "engines/e")  # the same GPU and library: no error


def test_cpu_engine_refuses_the_cuda_backend(built):
    with pytest.raises(FdppError, match="built for the cpu backend"):
        Engine(built[3], backend="cuda")


def test_build_refuses_bad_input(built, tmp_path):
    _, onnx_path, rewritten, engine_dir = built
    with pytest.raises(FdppError, match="has no fdpp nodes; rewrite it first"):
        build_engine(onnx_path, tmp_path / "e", backend="cpu")
    with pytest.raises(FdppError, match="exists; pass --force"):
        build_engine(rewritten, engine_dir, backend="cpu")
    with pytest.raises(FdppError, match="export with --dtype float16"):
        build_engine(rewritten, tmp_path / "e", backend="cpu", dtype="float16")
    with pytest.raises(FdppError, match="no ONNX file"):
        build_engine(tmp_path / "missing.fdpp.onnx", tmp_path / "e", backend="cpu")


def test_cli_run_and_bench(built, capsys, tmp_path):
    from fdpp_rewrite.cli import main

    assert main(["run", str(built[3]), "--token-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "5"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == ",".join(map(str, _onnxruntime_greedy(built[2], PROMPT, 5)))
    assert main(["bench", str(built[3]), "--context", "16", "--new-tokens", "4", "--batch", "1", "2",
                 "--kernels", "fdpp", "torch", "--out", str(tmp_path / "b.json")]) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert [(p["kernels"], p["batch"]) for p in report["points"]] == [("fdpp", 1), ("fdpp", 2), ("torch", 1),
                                                                       ("torch", 2)]
    assert all(p["tokens_per_s"] > 0 for p in report["points"])
    assert "the torch baseline's decode tokens/s" in capsys.readouterr().out
    assert main(["run", str(built[3]), "--prompt", "hi"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err
    for peer in (["--ablate"], ["--kernels", "fdpp", "gptfast"]):  # GPU-only peers, refused before any engine runs
        assert main(["bench", str(built[3]), *peer]) == 2
        err = capsys.readouterr().err
        assert "needs a cuda engine" in err and len(err.strip().splitlines()) == 1
    for bad in (["--batch", "0"], ["--context", "0"], ["--new-tokens", "1"]):  # refused before any generation
        assert main(["bench", str(built[3]), "--context", "16", "--new-tokens", "4", *bad]) == 2
        err = capsys.readouterr().err
        assert "--new-tokens >= 2" in err and len(err.strip().splitlines()) == 1


def test_bench_engine_script(tmp_path):
    """scripts/bench_engine.py: export, rewrite, build and bench in one run, fdpp kernels and the baseline."""
    import subprocess
    import sys

    from fdpp_rewrite import REPO_ROOT

    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "bench_engine.py"), "tiny-llama", "--dtype",
                             "float32", "--backend", "cpu", "--batch", "1", "--context", "16", "--new-tokens", "3",
                             "--work", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert [p["kernels"] for p in report["points"]] == ["fdpp", "torch"]
    assert "fdpp kernels" in result.stdout


def test_long_prompts_are_prefilled_in_chunks(built, monkeypatch):
    """A prompt over MAX_PREFILL_CHUNK runs as chunks (the prefill attention's grid bounds one pass); the tokens
    equal an unchunked prefill of the same prompt."""
    from fdpp_rewrite.engine import buckets

    prompt = [(7 * i + 3) % 200 for i in range(40)]
    whole = Engine(built[3]).generate([prompt], 6).tokens
    monkeypatch.setattr(buckets, "MAX_PREFILL_CHUNK", 16)
    chunked_engine = Engine(built[3])
    assert chunked_engine.generate([prompt], 6).tokens == whole
    assert any(shape == (1, 16) for (shape, _kv) in chunked_engine.programs)  # the chunks ran as their own Program


def test_gpu_build_gives_silu_mul_gemms_their_one_launch_decode_plan():
    """The plans a cuda build reads from the committed H200 profile (no GPU needed to read them): llama2-7b's
    gate_up shape as a silu_mul node keeps M <= 16 on ImplB, the same shape without the epilogue keeps the plan."""
    from fdpp_rewrite.gemm_plans import GemmNode, resolve_cuda_plans

    shape = (22016, 4096, "float16")
    resolved = resolve_cuda_plans({"gate_up": GemmNode(shape, "silu_mul", {}), "plain": GemmNode(shape, "none", {})},
                                  "NVIDIA H200", stream=io.StringIO())
    plans = resolved.plans
    assert resolved.profile_file is not None and resolved.measured == []
    assert (plans["gate_up"]["m2"], plans["gate_up"]["implb"]["loader"]) == (16, "pair")
    assert (plans["plain"]["m2"], plans["plain"]["implb"]["loader"]) == (8, "rows")


def test_roofline_is_bytes_over_the_faster_stream_read():
    from fdpp_rewrite.engine.bench import add_roofline

    points = [{"weight_bytes": 13.2e9, "kv_bytes_mean": 0.1e9, "ms_per_step": 3.8}, {"ms_per_step": 1.0}]
    add_roofline(points, max([3.9e12, 4.2e12]))
    assert points[0]["roofline_ms"] == pytest.approx(13.3e9 / 4.2e12 * 1e3)
    assert points[0]["roofline_pct"] == pytest.approx(100 * 13.3e9 / 4.2e12 * 1e3 / 3.8)
    assert "roofline_ms" not in points[1]  # a point without bytes (a cpu engine) gets none
