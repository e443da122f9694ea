"""Tensor parallelism on the cpu backend (gloo): a sharded engine of N ranks gives the unsharded engine's greedy
tokens and logits on the same graph; the shards' shapes; the one-line errors for sizes the model cannot take."""

import io
import json

import numpy as np
import pytest

from fdpp_rewrite.engine.build import build_engine, read_graph
from fdpp_rewrite.engine.runtime import Engine
from fdpp_rewrite.errors import FdppError

PROMPTS = [[5, 17, 42, 8, 99, 3, 250, 11], [7, 1, 64]]
STEPS = 6


def _rewritten(folder, preset):
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    onnx_path = folder / f"{preset}.onnx"
    export_model(preset, onnx_path, dtype="float32", max_cache=160, progress=False)
    return rewrite_file(onnx_path, stream=io.StringIO())


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    cache = {}

    def get(preset):
        if preset not in cache:
            cache[preset] = _rewritten(tmp_path_factory.mktemp(preset), preset)
        return cache[preset]
    return get


def _build(graph, out, size=None):
    return build_engine(graph, out, backend="cpu", max_batch=2, max_seq=160, tensor_parallel=size,
                        stream=io.StringIO())


def _greedy_and_logits(engine):
    result = engine.generate(PROMPTS, STEPS)
    logits = engine.prefill(0, PROMPTS[0])
    return result.tokens, logits.numpy().copy()


# tiny-qwen2: 4 query heads, 2 KV heads (split at N=2, replicated at N=4); tiny-opt: MHA with biases and ReLU;
# tiny-chatglm: partial rotary and GQA
@pytest.mark.parametrize("preset, size", [("tiny-qwen2", 2), ("tiny-qwen2", 4), ("tiny-opt", 2), ("tiny-chatglm", 2)])
def test_sharded_engine_equals_unsharded(graphs, tmp_path, preset, size):
    graph = graphs(preset)
    _build(graph, tmp_path / "plain")
    manifest = _build(graph, tmp_path / "tp", size)
    assert manifest["tensor_parallel"] == size and len(manifest["rank_gemm_shapes"]) == size
    assert sorted(p.name for p in (tmp_path / "tp").iterdir()) == ["manifest.json"] + [f"rank_{r}" for r in
                                                                                      range(size)]
    plain_tokens, plain_logits = _greedy_and_logits(Engine(tmp_path / "plain"))
    engine = Engine(tmp_path / "tp")
    try:
        tokens, logits = _greedy_and_logits(engine)
        # slot-level calls (the server's) are mirrored too: a second sequence decoded alone
        engine.reset()
        engine.prefill_chunk(1, PROMPTS[1])
        step = engine.decode_slots([1], engine.prefill(0, PROMPTS[0]).argmax().reshape(1))
    finally:
        engine.close()
    assert tokens == plain_tokens
    np.testing.assert_allclose(logits, plain_logits, rtol=0, atol=1e-4)
    assert step.shape == (1, plain_logits.shape[-1])


def test_shards_split_heads_and_mlp(graphs):
    """tiny-qwen2 at N=4: each rank holds one query head and one (replicated) KV head; o and down are split by input
    columns with the all-reduce after them, and only rank 0 adds their residual."""
    from fdpp_rewrite.engine.tensor_parallel import shard

    plan, arrays = read_graph(graphs("tiny-qwen2"))
    gemms = [n for n in plan["nodes"] if n["op"] == "FlatGemm"]
    qkv, o, up, down = gemms[:4]
    ranks = [shard(plan, arrays, 4, rank) for rank in range(4)]
    for rank, (rank_plan, rank_arrays) in enumerate(ranks):
        nodes = {n["name"]: n for n in rank_plan["nodes"]}
        attention = next(n for n in rank_plan["nodes"] if n["op"] == "AsyncSoftmaxAttention")
        assert (attention["attrs"]["num_heads"], attention["attrs"]["num_kv_heads"]) == (1, 1)
        assert rank_plan["num_kv_heads"] == 1
        assert rank_arrays[qkv["inputs"][1]].shape == (64 * 3, 256)  # q, k, v of one head each
        assert rank_arrays[o["inputs"][1]].shape == (256, 64)
        assert rank_arrays[up["inputs"][1]].shape == (2 * 344 // 4, 256)
        assert rank_arrays[down["inputs"][1]].shape == (256, 344 // 4)
        for name in (o["name"], down["name"]):
            assert nodes[name]["attrs"]["all_reduce"] == 1
            assert (nodes[name]["attrs"]["epilogue"] == "residual") == (rank == 0)
    # ranks 0 and 1 share KV head 0, ranks 2 and 3 KV head 1
    k_rows = [r[1][qkv["inputs"][1]][64:128] for r in ranks]
    assert np.array_equal(k_rows[0], k_rows[1]) and not np.array_equal(k_rows[1], k_rows[2])
    assert np.array_equal(k_rows[2], arrays[qkv["inputs"][1]][256 + 64:256 + 128])
    assert plan["nodes"][0] is not ranks[0][0]["nodes"][0] and "all_reduce" not in o["attrs"]  # input unchanged


@pytest.mark.parametrize("size, message", [(2, "does not divide the model's 3 query heads"),
                                           (3, "must be one of 1, 2, 4, 8")])
def test_bad_sizes_are_one_line_errors(graphs, tmp_path, size, message):
    with pytest.raises(FdppError, match=message) as error:
        _build(graphs("tiny-llama"), tmp_path / "tp", size)
    assert "\n" not in str(error.value) and not (tmp_path / "tp").exists()


def test_more_ranks_than_gpus_is_a_one_line_error():
    import torch

    from fdpp_rewrite.engine.tp_group import check_gpus

    count = torch.cuda.device_count()
    with pytest.raises(FdppError, match=f"over {count + 1} GPUs and {count} are visible"):
        check_gpus(count + 1)


def test_a_rank_folder_alone_is_refused(graphs, tmp_path):
    _build(graphs("tiny-opt"), tmp_path / "tp", 2)
    rank = json.loads((tmp_path / "tp" / "rank_1" / "manifest.json").read_text())
    assert rank["tensor_parallel_rank"] == {"rank": 1, "size": 2}
    with pytest.raises(FdppError, match="load the engine folder above its rank folders"):
        Engine(tmp_path / "tp" / "rank_1").generate([PROMPTS[0]], 2)
