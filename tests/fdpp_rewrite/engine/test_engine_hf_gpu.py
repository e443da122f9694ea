"""The engine on torch.onnx exports of transformers' tiny Llama (GQA, float16, decode with cache, dynamo=True and
dynamo=False) on the GPU (cuda backend): decode steps are captured as CUDA graphs and replay to the eager run's
tokens, the tokens and logits match the cpu backend on the same graph, and a batch of two lengths gives each
sequence's tokens alone."""

import io

import pytest

pytestmark = pytest.mark.gpu

pytest.importorskip("transformers")
pytest.importorskip("onnxscript")
hf_exports = pytest.importorskip("hf_exports")

PROMPTS = [[1, 5, 9, 22, 7, 64, 3], [3, 4, 100]]
NEW_TOKENS = 12


@pytest.fixture(scope="module", params=["dynamo", "torchscript"])
def engine_dirs(request, tmp_path_factory):
    """(cuda engine, cpu engine) folders built from one float16 export."""
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.rewrite import rewrite_file

    folder = tmp_path_factory.mktemp(f"hf-gpu-{request.param}")
    try:
        original = hf_exports.export_hf("llama", request.param == "dynamo", True, folder, dtype="float16")
    except hf_exports.ExportUnsupported as exc:
        pytest.skip(str(exc))
    rewritten = rewrite_file(original, output=folder / "model.fdpp.onnx", stream=io.StringIO())
    dirs = []
    for backend in ("cuda", "cpu"):
        build_engine(rewritten, folder / backend, backend=backend, max_batch=4, max_seq=48, stream=io.StringIO())
        dirs.append(folder / backend)
    return dirs


def _greedy_with_logits(engine, prompts):
    import torch

    from fdpp_rewrite.engine.runtime import Sampler

    captured, sampler = [], Sampler()

    def record(logits):
        captured.append(logits.float().cpu())
        return sampler(logits)

    tokens = engine.generate(prompts, NEW_TOKENS, sampler=record).tokens
    return tokens, torch.stack(captured)


def test_graph_replay_equals_eager_and_the_cpu_backend(engine_dirs):
    import torch

    from fdpp_rewrite.engine.runtime import Engine

    cuda_dir, cpu_dir = engine_dirs
    graphs, eager, cpu = Engine(cuda_dir), Engine(cuda_dir, use_graphs=False), Engine(cpu_dir)
    tokens, logits = _greedy_with_logits(graphs, [PROMPTS[0]])
    assert graphs.graphs and not eager.graphs  # the decode steps replayed captured graphs
    eager_tokens, eager_logits = _greedy_with_logits(eager, [PROMPTS[0]])
    cpu_tokens, cpu_logits = _greedy_with_logits(cpu, [PROMPTS[0]])
    assert tokens == eager_tokens == cpu_tokens
    torch.testing.assert_close(logits, eager_logits, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(logits, cpu_logits, atol=3e-2, rtol=3e-2)


def test_batch_of_two_lengths_equals_each_alone(engine_dirs):
    from fdpp_rewrite.engine.runtime import Engine

    engine = Engine(engine_dirs[0])
    together = engine.generate(PROMPTS, NEW_TOKENS).tokens
    assert together == [engine.generate([p], NEW_TOKENS).tokens[0] for p in PROMPTS]
