"""The rope_append pass and fdpp::RopeAppend's CPU reference: exported graphs of each rotary form (full, partial
interleaved, none), rope scaling read from the graph, near-misses left alone, and the whole rewrite's op count."""

import io
from collections import Counter

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from fdpp_rewrite import cli
from fdpp_rewrite.compare import compare_models
from fdpp_rewrite.contracts import load_contract, node_attributes
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models import get_config
from fdpp_rewrite.models.reference import rope_inv_freq
from fdpp_rewrite.passes import attention, common, rope_append
from fdpp_rewrite.passes.rope_match import match_rotation
from fdpp_rewrite.ref_ops import rope_append as reference_rope_append
from fdpp_rewrite.rewrite import rewrite_model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """preset -> path of a one-layer float32 export (cached for the module)."""
    folder = tmp_path_factory.mktemp("rope_exports")
    paths = {}

    def get(preset, dtype="float32", layers=1):
        key = (preset, dtype, layers)
        if key not in paths:
            path = folder / f"{preset}-{dtype}-{layers}.onnx"
            assert cli.main(["export", preset, "--layers", str(layers), "--max-cache", "16", "--dtype", dtype,
                             "-o", str(path)]) == 0
            paths[key] = path
        return onnx.load(str(paths[key]))

    return get


def rewrite_rope(model):
    graph = gs.import_onnx(model)
    common.sanitize(graph)
    attention.run(graph)
    report = rope_append.run(graph)
    common.sanitize(graph)
    return gs.export_onnx(graph, do_type_check=False), report


def op_counts(model):
    return Counter(node.op_type for node in model.graph.node)


def inv_freq_of(model, node):
    (init,) = [i for i in model.graph.initializer if i.name == node.input[6]]
    return onnx.numpy_helper.to_array(init)


@pytest.mark.parametrize("preset, rope_dim, interleaved", [
    ("tiny-llama", 64, 0),       # full rotary, halves
    ("tiny-chatglm", 64, 1),     # partial rotary (half of head_dim 128), adjacent pairs
    ("tiny-opt", 0, 0),          # learned positions: append only
])
def test_each_rotary_form_becomes_one_rope_append(exported, preset, rope_dim, interleaved):
    model = exported(preset)
    rewritten, report = rewrite_rope(model)
    counts = op_counts(rewritten)
    assert counts["RopeAppend"] == 1 and report.total == 1 and not report.near_misses, report.near_misses
    assert not {"ScatterND", "Sin", "Cos", "Neg", "Slice"} & set(counts), counts
    (node,) = [n for n in rewritten.graph.node if n.op_type == "RopeAppend"]
    attrs = node_attributes(node)
    config = get_config(preset)
    assert (attrs["rope_dim"], attrs["interleaved"]) == (rope_dim, interleaved)
    assert (attrs["num_heads"], attrs["num_kv_heads"], attrs["head_dim"]) == (config.num_heads, config.num_kv_heads,
                                                                              config.head_dim)
    assert list(node.input)[3:6] == ["key_cache.0", "value_cache.0", "past_len"]
    assert list(node.output)[1:] == ["key_cache_out.0", "value_cache_out.0"]  # the graph's outputs, written in place
    (attn,) = [n for n in rewritten.graph.node if n.op_type == "AsyncSoftmaxAttention"]
    assert list(attn.input)[:3] == list(node.output)  # the attention reads the op's outputs
    want = rope_inv_freq(config).numpy() if rope_dim else np.zeros(0, np.float32)
    np.testing.assert_array_equal(inv_freq_of(rewritten, node), want)
    report = compare_models(model, rewritten, batch=2, prefill=5)
    assert report.passed, [(r.step, r.output, r.max_abs) for r in report.rows if not r.passed]


def test_rope_scaling_in_the_graph_is_honoured(exported):
    """An exporter that baked a scaling into the rotary table (here: linear scaling by 4): the op carries the
    graph's table, not a recomputed theta formula, and the rewrite still equals the original."""
    model = exported("tiny-llama")
    config = get_config("tiny-llama")
    base = rope_inv_freq(config).numpy()
    (table,) = [i for i in model.graph.initializer
                if i.data_type == onnx.TensorProto.FLOAT and list(i.dims) == [len(base)]
                and np.array_equal(onnx.numpy_helper.to_array(i), base)]
    table.CopyFrom(onnx.numpy_helper.from_array(base / 4, table.name))
    rewritten, report = rewrite_rope(model)
    (node,) = [n for n in rewritten.graph.node if n.op_type == "RopeAppend"]
    np.testing.assert_array_equal(inv_freq_of(rewritten, node), base / 4)
    assert compare_models(model, rewritten, batch=2, prefill=5).passed


def _scatter_nodes(graph):
    return [n for n in graph.nodes if n.op == "ScatterND"]


def test_indices_off_by_one_are_left_alone(exported):
    """Cache writes at past_len + s + 1 are not the contract's positions: evaluation catches it."""
    graph = gs.import_onnx(exported("tiny-llama"))
    common.sanitize(graph)
    indices = _scatter_nodes(graph)[0].inputs[1]
    shifted = gs.Variable("shifted_indices", dtype=np.int64)
    graph.nodes.append(gs.Node("Add", inputs=[indices, gs.Constant("one_step", np.array([0, 0, 1], np.int64))],
                               outputs=[shifted]))
    for node in _scatter_nodes(graph):
        node.inputs[1] = shifted
    attention.run(graph)
    report = rope_append.run(graph)
    assert report.total == 0 and len(_scatter_nodes(graph)) == 2
    assert any("not (b, h, past_len[b] + s)" in miss for miss in report.near_misses), report.near_misses


def test_query_without_rotation_is_left_alone(exported):
    """k is rotated but the attention reads an unrotated q: not a RoPE layer the op can express."""
    graph = gs.import_onnx(exported("tiny-llama"))
    common.sanitize(graph)
    attention.run(graph)
    (attn,) = [n for n in graph.nodes if n.op == "AsyncSoftmaxAttention"]
    rotation = match_rotation(attn.inputs[0])
    attn.inputs[0] = rotation.source
    report = rope_append.run(graph)
    assert report.total == 0 and len(_scatter_nodes(graph)) == 2
    assert any("only one of q and k" in miss for miss in report.near_misses), report.near_misses


def test_cache_writes_not_feeding_the_attention_directly_are_not_matched():
    """tests/helpers/rewrite_graphs.py writes the caches through Transposes (a [B, S, H, D] ScatterND): no candidate."""
    from rewrite_graphs import build_tiny_model

    graph = gs.import_onnx(build_tiny_model())
    common.sanitize(graph)
    attention.run(graph)
    report = rope_append.run(graph)
    assert report.total == 0 and not report.near_misses and len(_scatter_nodes(graph)) == 4


def test_rewritten_llama_layer_keeps_no_glue_ops(exported):
    """The whole rewrite: per layer two RMSNorm, one RopeAppend, one attention and four FlatGemm remain, and no
    Softmax, ReduceMean, ScatterND or Sin/Cos rotation chain."""
    layers = 2
    model = exported("tiny-llama", dtype="float16", layers=layers)
    result = rewrite_model(model, stream=io.StringIO())
    counts = op_counts(result.model)
    assert counts["RMSNorm"] == 2 * layers + 1 and counts["RopeAppend"] == layers
    assert counts["AsyncSoftmaxAttention"] == layers and counts["FlatGemm"] == 4 * layers + 1
    for op in ("Softmax", "ReduceMean", "ScatterND", "Sin", "Cos", "Sqrt", "Neg", "Mul", "Add", "Div"):
        assert counts[op] == 0, (op, counts)
    assert compare_models(model, result.model, batch=2, prefill=5).passed


@pytest.mark.parametrize("rope_dim, interleaved", [(8, 0), (4, 1), (0, 0)])
def test_reference_rotates_and_appends(rope_dim, interleaved):
    rng = np.random.default_rng(0)
    batch, heads, kv_heads, seq, dim, cap = 2, 4, 2, 3, 8, 10
    q = rng.standard_normal((batch, heads, seq, dim)).astype(np.float32)
    k = rng.standard_normal((batch, kv_heads, seq, dim)).astype(np.float32)
    v = rng.standard_normal((batch, kv_heads, seq, dim)).astype(np.float32)
    kc, vc = np.zeros((batch, kv_heads, cap, dim), np.float32), np.zeros((batch, kv_heads, cap, dim), np.float32)
    past = np.array([0, 8], np.int64)  # sequence 1: positions 8, 9 fit, 10 does not
    inv = (1.0 / 10000 ** (np.arange(0, rope_dim, 2) / max(rope_dim, 1))).astype(np.float32)
    q_out, k_out, v_out = reference_rope_append(q, k, v, kc, vc, past, inv, rope_dim=rope_dim,
                                                interleaved=interleaved)

    def rotate(x, positions):  # the textbook formula, one pair at a time
        out = x.astype(np.float64).copy()
        for i in range(rope_dim // 2):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + rope_dim // 2)
            angle = positions * np.float64(inv[i])
            out[..., a] = x[..., a] * np.cos(angle) - x[..., b] * np.sin(angle)
            out[..., b] = x[..., b] * np.cos(angle) + x[..., a] * np.sin(angle)
        return out

    for b in range(batch):
        pos = past[b] + np.arange(seq)
        np.testing.assert_allclose(q_out[b], rotate(q[b], pos), atol=1e-5)
        keep = pos < cap
        np.testing.assert_allclose(k_out[b][:, pos[keep]], rotate(k[b], pos)[:, keep], atol=1e-5)
        np.testing.assert_array_equal(v_out[b][:, pos[keep]], v[b][:, keep])
        untouched = np.setdiff1d(np.arange(cap), pos)
        assert not k_out[b][:, untouched].any() and not v_out[b][:, untouched].any()
    assert not kc.any() and not vc.any()  # the inputs are not modified: the reference returns copies
    with pytest.raises(FdppError, match="rope_dim 3 must be even"):
        reference_rope_append(q, k, v, kc, vc, past, inv, rope_dim=3)


def test_contract():
    contract = load_contract("RopeAppend")
    attrs = contract.validate_attributes({"num_heads": 4, "num_kv_heads": 2, "head_dim": 64})
    assert attrs["rope_dim"] == 0 and attrs["interleaved"] == 0
    with pytest.raises(FdppError, match="rope_dim <= head_dim"):
        contract.validate_attributes({"num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "rope_dim": 128})
    aliases = {spec["name"]: spec.get("aliases") for spec in contract.outputs}
    assert aliases == {"query_out": None, "key_cache_out": "key_cache", "value_cache_out": "value_cache"}
