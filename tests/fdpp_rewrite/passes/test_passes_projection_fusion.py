"""The projection fusion pass: q/k/v and gate/up MatMuls merged into one MatMul + Split (still standard ops,
so the fused graph runs in onnxruntime and must give the original's outputs)."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from rewrite_graphs import TinyConfig, build_tiny_model, decode_feeds

from fdpp_rewrite.passes import attention, common, projection_fusion


def fuse(model, with_attention=True):
    graph = gs.import_onnx(model)
    common.sanitize(graph)
    if with_attention:
        attention.run(graph)
    report = projection_fusion.run(graph)
    return gs.export_onnx(graph), report


def weight_matmul_count(model):
    graph = gs.import_onnx(model)
    return len(projection_fusion.weight_matmuls(graph))


@pytest.mark.parametrize("cfg", [TinyConfig(), TinyConfig(qkv_bias=True, heads=6, kv_heads=3, layers=3),
                                 TinyConfig(dtype="float16", layout="4d")])
def test_fuses_qkv_and_gate_up_per_layer(cfg):
    model = build_tiny_model(cfg)
    fused, report = fuse(model, with_attention=False)
    # the fusion does not depend on the attention pass: q/k/v feed the standard chain's MatMul(probs, v) as well
    assert report.replaced == {"qkv": cfg.layers, "gate_up": cfg.layers}

    graph = gs.import_onnx(model)
    common.sanitize(graph)
    attention.run(graph)
    before = len(projection_fusion.weight_matmuls(graph))
    report = projection_fusion.run(graph)
    fused_model = gs.export_onnx(graph)
    assert report.replaced == {"qkv": cfg.layers, "gate_up": cfg.layers}
    # per layer: q, k, v -> 1 and gate, up -> 1
    assert len(projection_fusion.weight_matmuls(graph)) == before - 3 * cfg.layers
    splits = [n for n in fused_model.graph.node if n.op_type == "Split"]
    sizes = sorted(tuple(numpy_helper.to_array(next(i for i in fused_model.graph.initializer if i.name == n.input[1])))
                   for n in splits)
    hq, hkv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    assert sizes == sorted([(hq, hkv, hkv)] * cfg.layers + [(cfg.intermediate, cfg.intermediate)] * cfg.layers)
    # biases are concatenated: one Add per fused qkv, none left on the single projections
    if cfg.qkv_bias:
        assert sum(n.op_type == "Add" and any(i.startswith("fdpp_fusion/qkv_bias") for i in n.input)
                   for n in fused_model.graph.node) == cfg.layers


@pytest.mark.parametrize("cfg", [TinyConfig(qkv_bias=True), TinyConfig(dtype="float16", layout="4d")])
def test_fused_graph_gives_the_same_outputs(cfg):
    """Fusion alone (no attention pass) keeps a standard graph that runs in onnxruntime."""
    model = build_tiny_model(cfg)
    fused, _ = fuse(model, with_attention=False)
    feeds = decode_feeds(cfg, batch=2, seq=3)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = ort.InferenceSession(fused.SerializeToString()).run(None, feeds)
    atol = 2e-3 if cfg.dtype == "float16" else 1e-5
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32), atol=atol, rtol=atol)


def _mlp_graph(activation="silu", shared=True, k=8, n=12):
    """x -> gate, up -> activation(gate) * up (or gate * up for "none", Relu(gate) * up for "relu")."""
    rng = np.random.default_rng(0)
    wg = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "wg")
    wu = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "wu")
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]),
             helper.make_node("MatMul", ["x" if shared else "x2", "wu"], ["u"])]
    if activation == "silu":
        nodes += [helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["sg", "g"], ["act"])]
    elif activation == "relu":
        nodes += [helper.make_node("Relu", ["g"], ["act"])]
    else:
        nodes += [helper.make_node("Identity", ["g"], ["act"])]
    nodes.append(helper.make_node("Mul", ["u", "act"], ["y"]))  # operands swapped on purpose
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])]
    if not shared:
        inputs.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, ["batch", k]))
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])
    graph = helper.make_graph(nodes, "mlp", inputs, [output], initializer=[wg, wu])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_gate_up_with_silu_in_either_operand_order():
    model = _mlp_graph("silu")
    fused, report = fuse(model, with_attention=False)
    assert report.replaced == {"gate_up": 1} and weight_matmul_count(fused) == 1
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = ort.InferenceSession(fused.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    weight = next(i for i in fused.graph.initializer if i.name.startswith("fdpp_fusion/gate_up_weight"))
    assert list(weight.dims) == [8, 24]  # [K, gate | up]


@pytest.mark.parametrize("activation", ["none", "relu"])
def test_gate_up_without_silu_is_left_alone(activation):
    fused, report = fuse(_mlp_graph(activation), with_attention=False)
    assert report.total == 0 and weight_matmul_count(fused) == 2
    assert any("not gate/up of a SiLU-gated MLP" in m for m in report.near_misses)


def test_projections_on_different_inputs_are_not_fused():
    fused, report = fuse(_mlp_graph("silu", shared=False), with_attention=False)
    assert report.total == 0 and weight_matmul_count(fused) == 2 and not report.near_misses


def test_qkv_not_sharing_an_input_are_not_fused():
    """Give k its own copy of the normed input (an Identity): q, k, v no longer read one tensor."""
    model = build_tiny_model(TinyConfig(layers=1))
    graph = gs.import_onnx(model)
    kv_projections = [n for n in graph.nodes if n.op == "MatMul" and isinstance(n.inputs[1], gs.Constant)
                      and n.inputs[1].shape[1] == TinyConfig().kv_heads * TinyConfig().head_dim]
    k_proj = kv_projections[0]
    copy = gs.Variable("normed_copy", dtype=np.float32)
    graph.nodes.append(gs.Node("Identity", inputs=[k_proj.inputs[0]], outputs=[copy]))
    k_proj.inputs[0] = copy
    graph.toposort()
    model = gs.export_onnx(graph)
    graph = gs.import_onnx(model)
    common.sanitize(graph)  # the Identity stays: it is not a constant
    attention.run(graph)
    report = projection_fusion.run(graph)
    assert "qkv" not in report.replaced and report.replaced == {"gate_up": 1}
    assert any("2 MatMuls read" in m for m in report.near_misses)  # q and v alone


def test_three_projections_that_feed_no_attention_are_not_fused():
    """x -> three MatMuls -> Add: no Softmax chain and no attention op downstream, so not q/k/v."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), f"w{i}") for i in range(3)]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"p{i}"]) for i in range(3)]
    nodes += [helper.make_node("Add", ["p0", "p1"], ["s"]), helper.make_node("Add", ["s", "p2"], ["y"])]
    graph = helper.make_graph(nodes, "three", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              initializer=weights)
    fused, report = fuse(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), with_attention=False)
    assert report.total == 0 and weight_matmul_count(fused) == 3
    assert any("not all feed an attention" in m for m in report.near_misses)


def test_mixed_dtypes_are_not_fused():
    model = _mlp_graph("silu")
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(
        numpy_helper.to_array(model.graph.initializer[1]).astype(np.float16), "wu"))
    graph = gs.import_onnx(model)  # not valid ONNX to run, but the pass must refuse before anything else
    report = projection_fusion.run(graph)
    assert report.total == 0 and any("different K or dtype" in m for m in report.near_misses)
    onnx.checker.check_model(_mlp_graph("silu"))
