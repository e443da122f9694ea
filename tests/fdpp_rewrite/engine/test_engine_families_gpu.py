"""The newer families on the GPU (cuda backend): Llama 3's scaled rotary table, Qwen2's q/k/v biases on the
fused qkv FlatGemm, Mistral's GQA with head_dim != hidden / heads, GPT-2's LayerNorm + GELU glue, Phi-3's head_dim
96 (in the 128 kernels), Gemma 2's head_dim 256 with its soft cap and sliding-window layers, and a bfloat16 engine,
each against the cpu backend on the same rewritten graph. Tiny presets: their GEMM shapes are profiled at build
time."""

import io

import pytest

pytestmark = pytest.mark.gpu

PROMPT = [5, 17, 42, 8, 99, 3, 250, 11, 100, 4, 77, 12]


# (preset, dtype) and how far the cuda engine's logits may be from the cpu backend's (both round to the dtype)
ENGINES = [("tiny-llama3", "float16"), ("tiny-qwen2", "float16"), ("tiny-mistral", "float16"),
           ("tiny-gpt2", "float16"), ("tiny-phi3", "float16"), ("tiny-gemma2", "float16"),
           ("tiny-llama3", "bfloat16")]
LOGIT_TOLERANCE = {"float16": 0.05, "bfloat16": 0.25}  # bfloat16 keeps 8 bits of mantissa, float16 11


@pytest.fixture(scope="module", params=ENGINES, ids=[f"{preset}-{dtype}" for preset, dtype in ENGINES])
def engine_dir(request, tmp_path_factory):
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    preset, dtype = request.param
    folder = tmp_path_factory.mktemp(f"{preset}-{dtype}")
    onnx_path = folder / "model.onnx"
    export_model(preset, onnx_path, dtype=dtype, max_cache=160, progress=False)
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    build_engine(rewritten, folder / "engine", backend="cuda", max_batch=2, max_seq=160, stream=io.StringIO())
    return folder / "engine", dtype


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

    engine_dir, dtype = engine_dir
    cuda_tokens, cuda_logits = _greedy_with_logits(Engine(engine_dir), [PROMPT, PROMPT[:5]], 6)
    cpu_tokens, cpu_logits = _greedy_with_logits(Engine(engine_dir, backend="cpu"), [PROMPT, PROMPT[:5]], 6)
    assert cpu_logits.abs().max().item() > 0.1
    diff = (cuda_logits - cpu_logits).abs().max().item()
    assert diff < LOGIT_TOLERANCE[dtype], diff  # the dtype on both sides, different accumulation orders
    # tokens agree up to the first step where the cpu backend's top two are within the tolerance
    top2 = cpu_logits.topk(2, dim=-1).values
    decided = ((top2[..., 0] - top2[..., 1]) > 0.1).all(dim=1).tolist()
    agree = next((i for i, ok in enumerate(decided) if not ok), len(decided))
    assert [t[:agree] for t in cuda_tokens] == [t[:agree] for t in cpu_tokens]
