"""The newer families on the GPU (cuda backend, fp16): Llama 3's scaled rotary table, Qwen2's q/k/v biases on the
fused qkv FlatGemm, Mistral's GQA with head_dim != hidden / heads, and GPT-2's LayerNorm + GELU glue, each against
the cpu backend on the same rewritten graph. Tiny presets: their GEMM shapes are profiled at build time."""

import io

import pytest

pytestmark = pytest.mark.gpu

PROMPT = [5, 17, 42, 8, 99, 3, 250, 11, 100, 4, 77, 12]


@pytest.fixture(scope="module", params=["tiny-llama3", "tiny-qwen2", "tiny-mistral", "tiny-gpt2"])
def engine_dir(request, tmp_path_factory):
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    folder = tmp_path_factory.mktemp(request.param)
    onnx_path = folder / "model.onnx"
    export_model(request.param, onnx_path, dtype="float16", max_cache=160, progress=False)
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    build_engine(rewritten, folder / "engine", backend="cuda", max_batch=2, max_seq=160, stream=io.StringIO())
    return folder / "engine"


def _greedy_with_logits(engine, prompts, steps):
    import torch

    from fdpp_rewrite.engine.runtime import Sampler

    captured, sampler = [], Sampler()

    def record(logits):
        captured.append(logits.float().cpu())
        return sampler(logits)

    return engine.generate(prompts, steps, sampler=record).tokens, torch.stack(captured)


def test_cuda_equals_the_cpu_backend(engine_dir):
    from fdpp_rewrite.engine.runtime import Engine

    cuda_tokens, cuda_logits = _greedy_with_logits(Engine(engine_dir), [PROMPT, PROMPT[:5]], 6)
    cpu_tokens, cpu_logits = _greedy_with_logits(Engine(engine_dir, backend="cpu"), [PROMPT, PROMPT[:5]], 6)
    assert cpu_logits.abs().max().item() > 0.1
    diff = (cuda_logits - cpu_logits).abs().max().item()
    assert diff < 0.05, diff  # fp16 on both sides, different accumulation orders
    # tokens agree up to the first step where the cpu backend's top two are within the tolerance
    top2 = cpu_logits.topk(2, dim=-1).values
    decided = ((top2[..., 0] - top2[..., 1]) > 0.1).all(dim=1).tolist()
    agree = next((i for i, ok in enumerate(decided) if not ok), len(decided))
    assert [t[:agree] for t in cuda_tokens] == [t[:agree] for t in cpu_tokens]
