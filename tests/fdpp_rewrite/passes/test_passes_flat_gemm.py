"""The flat gemm pass: weight matmuls (+ bias, + silu_mul or residual epilogue) -> fdpp::FlatGemm, with the
weight stored [N, K] and the profile's thresholds on every node."""

import json

import numpy as np
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from fdpp_rewrite.contracts import node_attributes
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.passes import common, flat_gemm, projection_fusion
from fdpp_rewrite.ref_session import make_reference_session
from fdpp_rewrite.schemas import PROFILE_SCHEMA

K, N = 8, 6


def run_pass(model, profile=None, tmp_path=None, fuse=False):
    graph = gs.import_onnx(model)
    common.sanitize(graph)
    if fuse:
        projection_fusion.run(graph)
    default = (tmp_path / "no-profile.json") if tmp_path else None
    report = flat_gemm.run(graph, profile, **({"default_profile": default} if default else {}))
    return gs.export_onnx(graph), report


def gemm_nodes(model):
    return [n for n in model.graph.node if n.domain == "fdpp" and n.op_type == "FlatGemm"]


def make_model(nodes, inputs, outputs, weights):
    inits = [numpy_helper.from_array(value, name) for name, value in weights.items()]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def vinfo(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def check_same(original, rewritten, feeds, atol=1e-5):
    expected = ort.InferenceSession(original.SerializeToString()).run(None, feeds)
    got = make_reference_session(rewritten).run(None, feeds)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, atol=atol, rtol=atol)


def linear_residual_model(bias=True, residual_shape=("batch", "seq", N)):
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((K, N)).astype(np.float32), "b": rng.standard_normal(N).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"])]
    last = "xw"
    if bias:
        nodes.append(helper.make_node("Add", ["b", "xw"], ["xwb"]))
        last = "xwb"
    nodes.append(helper.make_node("Add", ["r", last], ["y"]))
    return make_model(nodes, [vinfo("x", ["batch", "seq", K]), vinfo("r", list(residual_shape))],
                      [vinfo("y", ["batch", "seq", N])], weights), weights


def test_bias_and_residual_fold_into_one_node(tmp_path):
    model, weights = linear_residual_model()
    rewritten, report = run_pass(model, tmp_path=tmp_path)
    (node,) = gemm_nodes(rewritten)
    attrs = node_attributes(node)
    assert attrs["epilogue"] == "residual" and attrs["has_bias"] == 1 and list(node.input)[0] == "x"
    assert list(node.input)[3] == "r" and report.replaced == {"residual": 1}
    stored = numpy_helper.to_array(next(i for i in rewritten.graph.initializer if i.name == node.input[1]))
    np.testing.assert_array_equal(stored, weights["w"].T)  # [N, K]
    assert [n.op_type for n in rewritten.graph.node] == ["FlatGemm"]
    rng = np.random.default_rng(1)
    check_same(model, rewritten, {"x": rng.standard_normal((2, 3, K)).astype(np.float32),
                                  "r": rng.standard_normal((2, 3, N)).astype(np.float32)})


def test_parallel_residual_add_is_claimed_once(tmp_path):
    """GPT-NeoX / Falcon: Add(mlp_out, attn_out), both GEMM outputs. One GEMM owns the Add as its residual epilogue
    and reads the other's plain output; a second claim would detach the first FlatGemm and leave a MatMul behind."""
    rng = np.random.default_rng(4)
    weights = {"w_attn": rng.standard_normal((K, N)).astype(np.float32), "b_attn": rng.standard_normal(N).astype(
        np.float32), "w_mlp": rng.standard_normal((N, N)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w_attn"], ["xa"]), helper.make_node("Add", ["xa", "b_attn"], ["attn"]),
             helper.make_node("MatMul", ["h", "w_mlp"], ["mlp"]), helper.make_node("Add", ["mlp", "attn"], ["y"])]
    model = make_model(nodes, [vinfo("x", ["batch", "seq", K]), vinfo("h", ["batch", "seq", N])],
                       [vinfo("y", ["batch", "seq", N])], weights)
    rewritten, report = run_pass(model, tmp_path=tmp_path)
    assert report.replaced == {"residual": 1, "none": 1}
    assert [n.op_type for n in rewritten.graph.node] == ["FlatGemm", "FlatGemm"]  # no MatMul, no Add left
    check_same(model, rewritten, {"x": rng.standard_normal((2, 3, K)).astype(np.float32),
                                  "h": rng.standard_normal((2, 3, N)).astype(np.float32)})


def test_broadcasting_add_is_not_a_residual(tmp_path):
    model, _ = linear_residual_model(bias=False, residual_shape=(1, 1, N))
    rewritten, report = run_pass(model, tmp_path=tmp_path)
    (node,) = gemm_nodes(rewritten)
    assert node_attributes(node)["epilogue"] == "none" and report.replaced == {"none": 1}
    assert [n.op_type for n in rewritten.graph.node] == ["FlatGemm", "Add"]
    rng = np.random.default_rng(2)
    check_same(model, rewritten, {"x": rng.standard_normal((2, 3, K)).astype(np.float32),
                                  "r": rng.standard_normal((1, 1, N)).astype(np.float32)})


@pytest.mark.parametrize("gate_first", [True, False])
def test_silu_mul_epilogue_after_fusion(tmp_path, gate_first):
    """gate/up fused by the projection pass, then one FlatGemm with epilogue silu_mul, gate rows first (also
    when the Split's second half is the gate)."""
    rng = np.random.default_rng(3)
    weights = {"wgu": rng.standard_normal((K, 2 * N)).astype(np.float32), "split": np.array([N, N], np.int64)}
    gate, up = ("h0", "h1") if gate_first else ("h1", "h0")
    nodes = [helper.make_node("MatMul", ["x", "wgu"], ["h"]),
             helper.make_node("Split", ["h", "split"], ["h0", "h1"], axis=-1),
             helper.make_node("Sigmoid", [gate], ["s"]), helper.make_node("Mul", [gate, "s"], ["silu"]),
             helper.make_node("Mul", ["silu", up], ["y"])]
    model = make_model(nodes, [vinfo("x", ["batch", K])], [vinfo("y", ["batch", N])], weights)
    rewritten, report = run_pass(model, tmp_path=tmp_path)
    (node,) = gemm_nodes(rewritten)
    assert node_attributes(node)["epilogue"] == "silu_mul" and report.replaced == {"silu_mul": 1}
    stored = numpy_helper.to_array(next(i for i in rewritten.graph.initializer if i.name == node.input[1]))
    gate_cols = slice(0, N) if gate_first else slice(N, 2 * N)
    np.testing.assert_array_equal(stored[:N], weights["wgu"][:, gate_cols].T)
    check_same(model, rewritten, {"x": rng.standard_normal((5, K)).astype(np.float32)})


def test_a_silu_mul_node_takes_its_shapes_one_launch_decode_plan(tmp_path):
    """The same [N, K] with the silu_mul epilogue and without: the silu_mul node keeps M <= 16 on ImplB (no
    SiLU-mul pass after an ImplC GEMM): the silu_mul plan its profile entry stores, computed by the profiler
    (fdpp_rewrite.profile_plan.complete_entry) when it wrote the entry; the plain one the entry's own plan."""
    from fdpp_rewrite.profile_plan import complete_entry

    rng = np.random.default_rng(5)
    weights = {"wgu": rng.standard_normal((K, 2 * N)).astype(np.float32), "split": np.array([N, N], np.int64),
               "w": rng.standard_normal((K, 2 * N)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "wgu"], ["h"]),
             helper.make_node("Split", ["h", "split"], ["h0", "h1"], axis=-1),
             helper.make_node("Sigmoid", ["h0"], ["s"]), helper.make_node("Mul", ["h0", "s"], ["silu"]),
             helper.make_node("Mul", ["silu", "h1"], ["y"]), helper.make_node("MatMul", ["x", "w"], ["z"])]
    model = make_model(nodes, [vinfo("x", ["batch", K])], [vinfo("y", ["batch", N]), vinfo("z", ["batch", 2 * N])],
                       weights)
    tiles = {"n_tile": 16, "k_tile": 1024, "stages": 2, "split_k": 1}
    profile = tmp_path / "gpu.json"
    profile.write_text(json.dumps({"schema": PROFILE_SCHEMA, "gpu": "Test GPU", "shapes": [complete_entry(
        {"n": 2 * N, "k": K, "dtype": "float32", "m1": 0, "m2": 8, "implc": "cublaslt",
         "implb": dict(tiles, loader="rows"),
         "implb_search": {"m": [1, 2, 4, 8, 16], "top": [{"config": dict(tiles, loader="pair"),
                                                          "us": [10.0, 10.0, 10.0, 10.5, 12.0]}]},
         "curves": {"m": [1, 2, 4, 8, 16], "implb_us": [10.0, 10.0, 10.0, 10.0, 14.0],
                    "cublaslt_us": [11.0, 11.0, 11.0, 11.0, 11.5]}})]}))
    rewritten, report = run_pass(model, profile=profile)
    plans = {node_attributes(n)["epilogue"]: node_attributes(n) for n in gemm_nodes(rewritten)}
    assert (plans["silu_mul"]["m2"], plans["silu_mul"]["implb_loader"]) == (16, "pair")
    assert (plans["none"]["m2"], plans["none"]["implb_loader"]) == (8, "rows")
    assert any("silu_mul x1: m1=0 m2=16" in note for note in report.notes), report.notes


def test_gemm_node_with_trans_b(tmp_path):
    rng = np.random.default_rng(4)
    weights = {"w_nk": rng.standard_normal((N, K)).astype(np.float32), "c": rng.standard_normal(N).astype(np.float32)}
    model = make_model([helper.make_node("Gemm", ["x", "w_nk", "c"], ["y"], transB=1)],
                       [vinfo("x", ["batch", K])], [vinfo("y", ["batch", N])], weights)
    rewritten, _ = run_pass(model, tmp_path=tmp_path)
    (node,) = gemm_nodes(rewritten)
    assert node_attributes(node)["has_bias"] == 1
    check_same(model, rewritten, {"x": rng.standard_normal((3, K)).astype(np.float32)})


def test_matmul_of_two_activations_is_left_alone(tmp_path):
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [vinfo("a", [2, 3, K]), vinfo("b", [2, K, N])],
                       [vinfo("y", [2, 3, N])], {})
    rewritten, report = run_pass(model, tmp_path=tmp_path)
    assert report.total == 0 and [n.op_type for n in rewritten.graph.node] == ["MatMul"]


def test_batched_constant_is_not_a_weight(tmp_path):
    weights = {"w3": np.ones((2, K, N), np.float32)}
    model = make_model([helper.make_node("MatMul", ["a", "w3"], ["y"])], [vinfo("a", [2, 3, K])],
                       [vinfo("y", [2, 3, N])], weights)
    _, report = run_pass(model, tmp_path=tmp_path)
    assert report.total == 0


def test_float16_weights_stay_float16(tmp_path):
    rng = np.random.default_rng(5)
    weights = {"w": rng.standard_normal((K, N)).astype(np.float16)}
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vinfo("x", ["batch", K], TensorProto.FLOAT16)],
                       [vinfo("y", ["batch", N], TensorProto.FLOAT16)], weights)
    rewritten, report = run_pass(model, tmp_path=tmp_path)
    (node,) = gemm_nodes(rewritten)
    stored = next(i for i in rewritten.graph.initializer if i.name == node.input[1])
    assert stored.data_type == TensorProto.FLOAT16 and list(stored.dims) == [N, K]
    assert any(f"[N={N}, K={K}] float16" in note for note in report.notes)
    check_same(model, rewritten, {"x": rng.standard_normal((4, K)).astype(np.float16)}, atol=1e-2)


def test_profile_attributes_reach_the_node(tmp_path):
    model, _ = linear_residual_model()
    profile = tmp_path / "gpu.json"
    profile.write_text(json.dumps({"schema": PROFILE_SCHEMA, "gpu": "Test GPU", "shapes": [
        {"n": N, "k": K, "dtype": "float32", "m1": 3, "m2": 40, "implc": "cublaslt",
         "implb": {"n_tile": 32, "k_tile": 256, "stages": 3, "split_k": 2}, "silu_mul": None}]}))
    rewritten, report = run_pass(model, profile=profile)
    attrs = node_attributes(gemm_nodes(rewritten)[0])
    assert (attrs["m1"], attrs["m2"], attrs["implb_n_tile"], attrs["implb_k_tile"], attrs["implb_stages"],
            attrs["implb_split_k"], attrs["implc"]) == (3, 40, 32, 256, 3, 2, "cublaslt")
    assert attrs["profile"] == "gpu.json (Test GPU)" and not report.near_misses


def test_profile_for_another_model(tmp_path):
    model, _ = linear_residual_model()
    profile = tmp_path / "gpu.json"
    profile.write_text(json.dumps({"schema": PROFILE_SCHEMA, "gpu": "Test GPU", "shapes": [
        {"n": 4096, "k": 4096, "dtype": "float16", "m1": 3, "m2": 40,
         "implb": {"n_tile": 32, "k_tile": 256, "stages": 3, "split_k": 2}, "silu_mul": None}]}))
    with pytest.raises(FdppError, match=rf"no entry for \[{N}, {K}\] float32 \(a profile for another model\?\)"):
        run_pass(model, profile=profile)


def test_unprofiled_default_is_labelled(tmp_path):
    model, _ = linear_residual_model()
    rewritten, report = run_pass(model, tmp_path=tmp_path)
    assert node_attributes(gemm_nodes(rewritten)[0])["profile"] == "unprofiled-default"
    assert any(f"[{N}, {K}] float32" in m and "unprofiled default" in m for m in report.near_misses)


def tied_embedding_model(transposed_input="table"):
    """logits = MatMul(h, Transpose(E)) where E [N, K] is also the embedding table that Gather reads (a tied
    lm_head, as the dynamo exporter leaves it when E lives in an external data file)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["h"]),
             helper.make_node("Transpose", [transposed_input], ["table_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "table_t"], ["logits"])]
    inputs = [vinfo("ids", ["batch"], TensorProto.INT64)]
    if transposed_input != "table":
        inputs.append(vinfo(transposed_input, [N, K]))
    return make_model(nodes, inputs, [vinfo("logits", ["batch", N])],
                      {"table": rng.standard_normal((N, K)).astype(np.float32)})


def test_matmul_against_a_transposed_constant_is_a_weight_matmul():
    model = tied_embedding_model()
    graph = gs.import_onnx(model)  # no sanitize: the Transpose stays, as it does for weights in a data file
    assert flat_gemm.remaining_weight_matmuls(graph) == [graph.nodes[2].name]
    report = flat_gemm.run(graph)
    rewritten = gs.export_onnx(graph)
    (node,) = gemm_nodes(rewritten)
    weight = next(numpy_helper.to_array(i) for i in rewritten.graph.initializer if i.name == node.input[1])
    np.testing.assert_array_equal(weight, numpy_helper.to_array(model.graph.initializer[0]))  # E is already [N, K]
    assert report.total == 1 and not flat_gemm.remaining_weight_matmuls(graph)
    check_same(model, rewritten, {"ids": np.array([0, 3, 5], np.int64)})


def test_matmul_against_a_transposed_activation_is_not_a_weight_matmul():
    graph = gs.import_onnx(tied_embedding_model(transposed_input="other"))
    assert flat_gemm.run(graph).total == 0 and not flat_gemm.remaining_weight_matmuls(graph)
    assert [n.op for n in graph.nodes if n.op == "MatMul"] == ["MatMul"]
