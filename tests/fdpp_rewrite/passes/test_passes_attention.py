"""The attention pass: should-match and should-not-match graphs, checked by structure and by running the
rewritten graph (CPU reference ops) against the original (onnxruntime)."""

import json

import numpy as np
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from rewrite_graphs import HEAD_DIM, TinyConfig, attention_feeds, build_attention_graph, build_tiny_model, decode_feeds

from fdpp_rewrite.calibration.settings import attention_nodes as layer_nodes
from fdpp_rewrite.calibration.settings import load_calibration
from fdpp_rewrite.contracts import node_attributes
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.passes import attention, common
from fdpp_rewrite.ref_session import make_reference_session


def rewrite_attention(model, calibration=None):
    graph = gs.import_onnx(model)
    common.sanitize(graph)
    report = attention.run(graph, calibration)
    return gs.export_onnx(graph), report


def attention_nodes(model):
    return layer_nodes(model.graph.node)


def assert_same_outputs(original, rewritten, feeds, atol=2e-5):
    expected = ort.InferenceSession(original.SerializeToString()).run(None, feeds)
    got = make_reference_session(rewritten).run(None, feeds)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32), atol=atol, rtol=atol)


@pytest.mark.parametrize("layout, heads, kv_heads", [
    ("grouped-5d", 4, 2), ("grouped-5d", 3, 3), ("grouped-5d", 9, 3), ("4d", 4, 2), ("4d", 4, 4), ("4d", 9, 1),
])
def test_causal_mask_becomes_past_len(layout, heads, kv_heads):
    model = build_attention_graph(layout=layout, heads=heads, kv_heads=kv_heads)
    rewritten, report = rewrite_attention(model)
    (node,) = attention_nodes(rewritten)
    attrs = node_attributes(node)
    assert attrs["mask_mode"] == "past_len" and list(node.input)[1:] == ["key", "value", "past_len"]
    assert (attrs["num_heads"], attrs["num_kv_heads"], attrs["head_dim"]) == (heads, kv_heads, HEAD_DIM)
    assert attrs["scale"] == pytest.approx(1 / np.sqrt(HEAD_DIM))
    assert (attrs["phi"], attrs["guard_lo"], attrs["guard_hi"]) == (0.0, -60.0, 10.0)
    assert report.replaced == {f"{layout}/past_len": 1}
    assert not any(n.op_type in ("Softmax", "Expand") for n in rewritten.graph.node)  # chain and repeat_kv gone
    assert_same_outputs(model, rewritten, attention_feeds(model, batch=3, seq=2))


@pytest.mark.parametrize("options", [
    {"scale_op": "Div"}, {"scale_op": "none"}, {"mask_first": True}, {"casts": True},
    {"casts": True, "dtype": "float16"}, {"layout": "4d", "casts": True, "dtype": "float16", "scale_op": "Div"},
])
def test_chain_variants(options):
    model = build_attention_graph(**options)
    rewritten, _ = rewrite_attention(model)
    (node,) = attention_nodes(rewritten)
    dtype = np.dtype(options.get("dtype", "float32"))
    root = np.sqrt(float(HEAD_DIM))
    expected_scale = {"none": 1.0, "Div": 1.0 / float(root.astype(dtype))}.get(options.get("scale_op"),
                                                                            float((1.0 / root).astype(dtype)))
    assert node_attributes(node)["scale"] == pytest.approx(expected_scale, rel=1e-6)  # the graph's own constant
    atol = 2e-3 if options.get("dtype") == "float16" else 2e-5
    assert_same_outputs(model, rewritten, attention_feeds(model), atol=atol)


@pytest.mark.parametrize("layout", ["grouped-5d", "4d"])
def test_mask_not_from_past_len_is_a_bias(layout):
    model = build_attention_graph(layout=layout, mask="input")
    rewritten, report = rewrite_attention(model)
    (node,) = attention_nodes(rewritten)
    assert node_attributes(node)["mask_mode"] == "bias" and report.replaced == {f"{layout}/bias": 1}
    assert_same_outputs(model, rewritten, attention_feeds(model))


def test_sliding_window_from_past_len_is_past_len_with_the_window():
    """Causal within the 4 latest keys, computed from past_len: the op's past_len rule with window 4 (the 19-key
    cache lets rows reach past the window, so evaluating the mask sees it)."""
    model = build_attention_graph(mask="sliding")
    rewritten, report = rewrite_attention(model)
    (node,) = attention_nodes(rewritten)
    assert (node_attributes(node)["mask_mode"], node_attributes(node)["window"]) == ("past_len", 4)
    assert report.replaced == {"grouped-5d/past_len+window": 1} and not report.near_misses
    assert_same_outputs(model, rewritten, attention_feeds(model, seq=3))


def test_a_window_longer_than_the_small_probes_is_seen_in_a_dynamic_cache():
    """A symbolic cache length with a 600-key window: at the small sizes the mask looks causal, so the pass also
    evaluates it with a long cache (attention_mask.LONG_CACHE_PROBE); dropping the window would be a silent wrong
    answer past 600 tokens."""
    model = build_attention_graph(mask="sliding", kv_len="cache", window=600)
    rewritten, report = rewrite_attention(model)
    (node,) = attention_nodes(rewritten)
    assert (node_attributes(node)["mask_mode"], node_attributes(node)["window"]) == ("past_len", 600)
    assert_same_outputs(model, rewritten, attention_feeds(model, seq=3))


def test_a_past_len_mask_of_no_rule_is_a_bias():
    """Computed from past_len alone, but neither causal nor windowed (one key hidden): evaluating it must catch
    that, and the mask goes to the op as a bias."""
    model = build_attention_graph(mask="gap")
    rewritten, report = rewrite_attention(model)
    (node,) = attention_nodes(rewritten)
    assert node_attributes(node)["mask_mode"] == "bias"
    assert any("nor a sliding window" in miss for miss in report.near_misses)
    assert_same_outputs(model, rewritten, attention_feeds(model, seq=3))


def test_no_mask():
    model = build_attention_graph(mask="none")
    rewritten, _ = rewrite_attention(model)
    (node,) = attention_nodes(rewritten)
    assert node_attributes(node)["mask_mode"] == "none" and len(node.input) == 3
    assert_same_outputs(model, rewritten, attention_feeds(model))


@pytest.mark.parametrize("options, reason", [
    ({"softmax_axis": 2}, "not the last axis"),
    ({"probs_output": True}, "probabilities feed"),
    ({"scale_op": "MulVector"}, "not by a scalar constant"),
])
def test_should_not_match(options, reason):
    model = build_attention_graph(**options)
    rewritten, report = rewrite_attention(model)  # the only chain is rejected: a near miss, not an error
    assert report.total == 0 and not attention_nodes(rewritten)
    assert len(report.near_misses) == 1 and reason in report.near_misses[0]
    assert any(n.op_type == "Softmax" for n in rewritten.graph.node)


def test_near_miss_is_reported_beside_a_match():
    """A full model with one extra Softmax over the wrong axis: the real chains are replaced, the extra one
    is reported and left alone."""
    model = build_tiny_model(TinyConfig(layers=1))
    graph = gs.import_onnx(model)
    logits = next(t for t in graph.outputs if t.name == "logits")
    extra = gs.Variable("extra_probs", dtype=np.float32)
    graph.nodes.append(gs.Node("Softmax", name="stray_softmax", attrs={"axis": 1}, inputs=[logits], outputs=[extra]))
    graph.outputs.append(extra)
    common.sanitize(graph)
    report = attention.run(graph)
    assert report.total == 1
    assert any("stray_softmax" in miss and "not the last axis" in miss for miss in report.near_misses)


def test_grouped_model_layers_and_outputs():
    cfg = TinyConfig(layers=3, heads=6, kv_heads=2)
    model = build_tiny_model(cfg)
    rewritten, report = rewrite_attention(model)
    assert report.replaced == {"grouped-5d/past_len": 3} and len(attention_nodes(rewritten)) == 3
    assert_same_outputs(model, rewritten, decode_feeds(cfg, batch=3, seq=2, past=(0, 7, 20)))


def test_calibration_sets_phi_and_guards_per_layer(tmp_path):
    cfg = TinyConfig(layers=2)
    model = build_tiny_model(cfg)
    path = tmp_path / "calib.json"
    layers = [{"layer": 1, "phi": 3.5, "guard_lo": -20.0, "guard_hi": 15.0},
              {"layer": 0, "phi": -2.0, "guard_lo": -30.0, "guard_hi": 12.0}]
    path.write_text(json.dumps({"schema": "fdpp-calibration/1", "layers": layers}))
    rewritten, _ = rewrite_attention(model, load_calibration(path))
    got = [(a["phi"], a["guard_lo"], a["guard_hi"]) for a in map(node_attributes, attention_nodes(rewritten))]
    assert got == [(-2.0, -30.0, 12.0), (3.5, -20.0, 15.0)]  # graph order = layer order
    assert_same_outputs(model, rewritten, decode_feeds(cfg))  # phi changes speed, never results


def test_synchronized_verdict_is_stamped_on_its_layer_only(tmp_path):
    from fdpp_rewrite import ref_ops

    cfg = TinyConfig(layers=2)
    model = build_tiny_model(cfg)
    path = tmp_path / "calib.json"
    layers = [{"layer": 0, "phi": 0.0, "guard_lo": -80.0, "guard_hi": 60.0, "softmax": "synchronized"},
              {"layer": 1, "phi": 0.0, "guard_lo": -80.0, "guard_hi": 60.0, "softmax": "unified"}]
    path.write_text(json.dumps({"schema": "fdpp-calibration/1", "layers": layers}))
    rewritten, report = rewrite_attention(model, load_calibration(path))
    stamped = [node_attributes(n).get("softmax") for n in attention_nodes(rewritten)]
    assert stamped == ["synchronized", None] and any("synchronized" in note for note in report.notes)
    ref_ops.COUNTERS.reset()
    assert_same_outputs(model, rewritten, decode_feeds(cfg))  # the reference honours it: same outputs ...
    assert ref_ops.COUNTERS.fallback_rows * 2 == ref_ops.COUNTERS.attention_rows  # ... layer 0's rows all exact


@pytest.mark.parametrize("content, message", [
    ({"schema": "fdpp-calibration/1", "layers": [{"layer": 0, "phi": 0.0, "guard_lo": -9.0, "guard_hi": 9.0}]},
     "has 1 layers but the graph has 2"),
    ({"schema": "other", "layers": []}, "fdpp-calibration/1"),
    ({"schema": "fdpp-calibration/1", "layers": [{"layer": 0, "phi": 0.0}, {"layer": 1}]}, "layer entry 0"),
    ({"schema": "fdpp-calibration/1", "layers": [{"layer": 0, "phi": 0.0, "guard_lo": -9.0, "guard_hi": 99.0},
                                                 {"layer": 1, "phi": 0.0, "guard_lo": -9.0, "guard_hi": 9.0}]},
     "guard_hi"),
    ({"schema": "fdpp-calibration/1", "layers": [{"layer": 0, "phi": 0.0, "guard_lo": -9.0, "guard_hi": 9.0,
                                                  "softmax": "fast"},
                                                 {"layer": 1, "phi": 0.0, "guard_lo": -9.0, "guard_hi": 9.0}]},
     "softmax must be one of unified, synchronized"),
])
def test_bad_calibration(tmp_path, content, message):
    path = tmp_path / "calib.json"
    path.write_text(json.dumps(content))
    with pytest.raises(FdppError, match=message):
        rewrite_attention(build_tiny_model(TinyConfig(layers=2)), load_calibration(path))


def test_no_attention_at_all():
    graph = gs.Graph(inputs=[gs.Variable("x", dtype=np.float32, shape=[2, 4])])
    y = gs.Variable("y", dtype=np.float32, shape=[2, 4])
    graph.nodes.append(gs.Node("Relu", inputs=[graph.inputs[0]], outputs=[y]))
    graph.outputs = [y]
    report = attention.run(graph)  # nothing to replace: the rewrite decides whether that is an error
    assert report.total == 0 and not report.near_misses and [n.op for n in graph.nodes] == ["Relu"]
