"""Tensor parallelism on the GPU: an engine of one rank (NCCL, world size 1, the all-reduce captured in the decode
CUDA graphs) gives the plain engine's greedy tokens and logits on the same float16 graph."""

import io

import pytest

pytestmark = pytest.mark.gpu

PROMPT = [5, 17, 42, 8, 99, 3, 250, 11, 1000, 4096, 77, 12]


def test_nccl_world_size_one_equals_the_plain_engine(tmp_path):
    import torch

    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.engine.runtime import Engine
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    onnx_path = tmp_path / "model.onnx"
    export_model("smollm2-135m", onnx_path, dtype="float16", max_cache=256, num_layers=2, random_init=True,
                 progress=False)
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    for name, size in (("plain", None), ("tp1", 1)):
        build_engine(rewritten, tmp_path / name, backend="cuda", max_batch=2, max_seq=256, tensor_parallel=size,
                     stream=io.StringIO())
    plain = Engine(tmp_path / "plain")
    expected = plain.generate([PROMPT, PROMPT[:5]], 16).tokens
    expected_logits = plain.prefill(0, PROMPT).float().cpu()
    engine = Engine(tmp_path / "tp1")
    try:
        assert engine.leader is not None and torch.distributed.get_backend() == "nccl"
        tokens = engine.generate([PROMPT, PROMPT[:5]], 16).tokens
        logits = engine.prefill(0, PROMPT).float().cpu()
        assert engine.graphs  # decode steps replayed CUDA graphs holding the NCCL all-reduce
    finally:
        engine.close()
    assert tokens == expected
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=2e-2)
