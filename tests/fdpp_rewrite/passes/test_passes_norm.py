"""The norm pass and fdpp::RMSNorm's CPU reference: should-match and should-not-match graphs, checked by structure
and by running the rewritten graph (CPU reference ops) against the original (onnxruntime)."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from rewrite_graphs import TinyConfig, build_tiny_model, decode_feeds

from fdpp_rewrite import cli
from fdpp_rewrite.contracts import load_contract, node_attributes, register_onnx_schemas
from fdpp_rewrite.passes import common, norm
from fdpp_rewrite.ref_ops import rms_norm
from fdpp_rewrite.ref_session import make_reference_session

HIDDEN = 16
NP = {"float32": np.float32, "float16": np.float16}
ONNX = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def norm_graph(dtype="float32", casts=None, axis=-1, keepdims=1, weight_input=False, extra_output=None,
               swap_operands=False, eps=1e-5, weight_shape=(HIDDEN,), square="mul", inverse="div",
               weight_in_float32=False) -> onnx.ModelProto:
    """x [B, S, H] -> the exported RMSNorm chain -> y. casts default: only for float16 (as the exporter writes).
    extra_output: 'mean' or 'normed' makes that intermediate a graph output too. Hugging Face's forms:
    square "pow" (Pow(x, 2)); inverse "reciprocal" or "one_div" (x * Reciprocal(rms) or x * Div(1, rms));
    weight_in_float32 (Gemma: Mul(normed32, float32 weight), then the Cast back)."""
    casts = dtype != "float32" if casts is None else casts
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x32 = "x"
    if casts:
        nodes.append(helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT))
        x32 = "x32"
    if square == "pow":
        nodes.append(helper.make_node("Pow", [x32, "two"], ["sq"]))
        inits.append(numpy_helper.from_array(np.array(2.0, np.float32), "two"))
    else:
        nodes.append(helper.make_node("Mul", [x32, x32], ["sq"]))
    nodes += [helper.make_node("ReduceMean", ["sq"], ["mean"], axes=[axis], keepdims=keepdims),
              helper.make_node("Add", ["eps", "mean"] if swap_operands else ["mean", "eps"], ["ms"]),
              helper.make_node("Sqrt", ["ms"], ["rms"])]
    if inverse == "div":
        nodes.append(helper.make_node("Div", [x32, "rms"], ["normed32"]))
    else:
        nodes.append(helper.make_node("Reciprocal", ["rms"], ["inv"]) if inverse == "reciprocal" else
                     helper.make_node("Div", ["one", "rms"], ["inv"]))
        nodes.append(helper.make_node("Mul", ["inv", x32] if swap_operands else [x32, "inv"], ["normed32"]))
        inits.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    inits.append(numpy_helper.from_array(np.array(eps, np.float32), "eps"))
    normed = "normed32"
    if casts and not weight_in_float32:
        nodes.append(helper.make_node("Cast", ["normed32"], ["normed"], to=ONNX[dtype]))
        normed = "normed"
    scaled = "y32" if weight_in_float32 else "y"
    nodes.append(helper.make_node("Mul", ["w", normed] if swap_operands else [normed, "w"], [scaled]))
    if weight_in_float32:
        nodes.append(helper.make_node("Cast", [scaled], ["y"], to=ONNX[dtype]))
    weight = (1.0 + 0.1 * rng.standard_normal(weight_shape)).astype(np.float32 if weight_in_float32 else NP[dtype])
    inputs = [helper.make_tensor_value_info("x", ONNX[dtype], ["batch", "seq", HIDDEN])]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("w", ONNX[dtype], list(weight_shape)))
    else:
        inits.append(numpy_helper.from_array(weight, "w"))
    outputs = [helper.make_tensor_value_info("y", ONNX[dtype], ["batch", "seq", HIDDEN])]
    if extra_output == "mean":
        outputs.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    elif extra_output == "normed":
        outputs.append(helper.make_tensor_value_info(normed, ONNX[dtype], None))
    graph = helper.make_graph(nodes, "norm", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def rewrite_norms(model):
    graph = gs.import_onnx(model)
    common.sanitize(graph)
    report = norm.run(graph)
    return gs.export_onnx(graph), report


def feeds_for(model, dtype="float32", batch=3, seq=5, seed=1):
    rng = np.random.default_rng(seed)
    feeds = {"x": (rng.standard_normal((batch, seq, HIDDEN)) * 3).astype(NP[dtype])}
    for info in model.graph.input:
        if info.name == "w":
            feeds["w"] = (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(NP[dtype])
    return feeds


def op_types(model):
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("dtype, casts, swap", [("float32", False, False), ("float32", True, False),
                                                ("float16", True, False), ("float16", True, True)])
def test_exported_chain_becomes_one_rms_norm(dtype, casts, swap):
    model = norm_graph(dtype, casts=casts, swap_operands=swap, eps=1e-6)
    rewritten, report = rewrite_norms(model)
    assert op_types(rewritten) == ["RMSNorm"] and report.replaced == {"rms_norm": 1}
    node = rewritten.graph.node[0]
    assert list(node.input) == ["x", "w"] and list(node.output) == ["y"]
    assert node_attributes(node)["epsilon"] == pytest.approx(1e-6, rel=1e-6)  # the graph's own constant
    feeds = feeds_for(model, dtype)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    got = make_reference_session(rewritten).run(None, feeds)[0]
    atol, rtol = load_contract("RMSNorm").tolerance(dtype)
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("form", [
    {"square": "pow", "inverse": "reciprocal"},                            # LlamaRMSNorm, dynamo (rsqrt)
    {"square": "pow", "inverse": "one_div", "casts": True},                # LlamaRMSNorm, TorchScript
    {"square": "pow", "inverse": "reciprocal", "swap_operands": True},
    {"square": "pow", "inverse": "reciprocal", "weight_in_float32": True},  # GemmaRMSNorm
])
def test_hugging_face_forms_become_one_rms_norm(dtype, form):
    """Hugging Face's RMSNorm (Pow(x, 2), rsqrt written as Reciprocal or Div(1, .), Casts to float32 even in a
    float32 model, Gemma's weight applied in float32): one op, its weight in x's dtype, the same values."""
    form = dict(form)
    casts = form.pop("casts", False) or dtype != "float32"
    model = norm_graph(dtype, casts=casts, eps=1e-6, **form)
    rewritten, report = rewrite_norms(model)
    assert op_types(rewritten)[0] == "RMSNorm" and report.replaced == {"rms_norm": 1}
    assert op_types(rewritten)[1:] in ([], ["Cast"])  # a float32 -> float32 Cast after Gemma's float32 weight stays
    node = rewritten.graph.node[0]
    weight = next(i for i in rewritten.graph.initializer if i.name == node.input[1])
    assert node.input[0] == "x" and weight.data_type == ONNX[dtype]
    assert node_attributes(node)["epsilon"] == pytest.approx(1e-6, rel=1e-6)
    feeds = feeds_for(model, dtype)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    got = make_reference_session(rewritten).run(None, feeds)[0]
    atol, rtol = load_contract("RMSNorm").tolerance(dtype)
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), atol=atol, rtol=rtol)


@pytest.mark.parametrize("options, reason", [
    ({"axis": 1}, "does not average the last axis"),
    ({"keepdims": 0}, "does not average the last axis"),
    ({"weight_input": True}, "not scaled by a constant weight"),
    ({"extra_output": "mean"}, "not followed by Add"),
    ({"extra_output": "normed"}, "not scaled by a constant weight"),
    ({"dtype": "float16", "casts": False}, "without a Cast to float32"),
    ({"weight_shape": (1,)}, "the weight has shape (1,)"),
    ({"square": "pow", "inverse": "reciprocal", "extra_output": "mean"}, "not followed by Add"),
])
def test_near_misses_are_left_alone(options, reason):
    model = norm_graph(**options)
    rewritten, report = rewrite_norms(model)
    assert "RMSNorm" not in op_types(rewritten) and "ReduceMean" in op_types(rewritten)
    assert report.total == 0 and any(reason in miss for miss in report.near_misses), report.near_misses


def test_hand_built_float32_model_norms_all_replaced():
    """tests/helpers/rewrite_graphs.py writes the Cast-free float32 chain: every norm of every layer and the last."""
    cfg = TinyConfig()
    model = build_tiny_model(cfg)
    rewritten, report = rewrite_norms(model)
    assert report.replaced == {"rms_norm": 2 * cfg.layers + 1}
    assert "ReduceMean" not in op_types(rewritten) and "Sqrt" not in op_types(rewritten)
    feeds = decode_feeds(cfg)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = make_reference_session(rewritten).run(None, feeds)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, atol=1e-4, rtol=1e-4)


def test_opt_layer_norm_is_left_as_is(tmp_path):
    exported = tmp_path / "opt.onnx"
    assert cli.main(["export", "tiny-opt", "--layers", "1", "--max-cache", "16", "--dtype", "float32",
                     "-o", str(exported)]) == 0
    model = onnx.load(str(exported))
    rewritten, report = rewrite_norms(model)
    assert report.total == 0 and not report.near_misses
    assert op_types(rewritten).count("LayerNormalization") == 3  # two per layer and the final one


def test_reference_matches_float64_semantics():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 7, 576)) * 5).astype(np.float16)
    w = rng.standard_normal(576).astype(np.float16)
    x64 = x.astype(np.float64)
    normed = (x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-5)).astype(np.float16)
    want = (normed.astype(np.float64) * w.astype(np.float64)).astype(np.float16)
    got = rms_norm(x, w, epsilon=1e-5)
    assert got.dtype == np.float16 and got.shape == x.shape
    atol, rtol = load_contract("RMSNorm").tolerance("float16")
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=atol, rtol=rtol)
    with pytest.raises(Exception, match="does not match the last axis"):
        rms_norm(x, w[:8], epsilon=1e-5)


def test_contract_and_schema():
    contract = load_contract("RMSNorm")
    assert contract.validate_attributes({"epsilon": 1e-5}) == {"epsilon": 1e-5}
    with pytest.raises(Exception, match="required attribute 'epsilon'"):
        contract.validate_attributes({})
    register_onnx_schemas()
    model = norm_graph("float16")
    rewritten, _ = rewrite_norms(model)
    inferred = onnx.shape_inference.infer_shapes(rewritten)
    (y,) = [o for o in inferred.graph.output if o.name == "y"]
    assert y.type.tensor_type.elem_type == TensorProto.FLOAT16
