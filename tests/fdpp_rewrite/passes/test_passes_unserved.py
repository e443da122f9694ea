"""A match the kernels cannot serve (a head size, a dtype the contract lacks) is left as is with one warning line per
reason, everything else is rewritten, and the summary and --require name what was left and why. What the kernels
serve is read from the op contracts, so the rewriter follows when they grow."""

import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from rewrite_graphs import TinyConfig, build_tiny_model, decode_feeds

from fdpp_rewrite.compare import compare_models
from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.passes.common import PassReport
from fdpp_rewrite.passes.support import supports_attribute, unsupported
from fdpp_rewrite.ref_session import make_reference_session
from fdpp_rewrite.rewrite import rewrite_model

ATTENTION = "AsyncSoftmaxAttention"
SMALL = TinyConfig(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=48)  # a head size no kernel has


def head_sizes() -> str:
    return ", ".join(map(str, load_contract(ATTENTION).attributes["head_dim"]["choices"]))


@pytest.fixture(scope="module")
def small_model():
    return build_tiny_model(SMALL)


def rewrite(model, **options):
    log = io.StringIO()
    result = rewrite_model(model, stream=log, **options)
    return result, log.getvalue()


def ops(model):
    return [n.op_type for n in model.graph.node]


def test_unsupported_reads_the_contract():
    assert unsupported(ATTENTION, {"head_dim": 16, "num_heads": 4}, {"query": "float32"}) == \
        f"head_dim 16: the kernels are built for {head_sizes()}"
    assert unsupported(ATTENTION, {"head_dim": 64, "num_heads": 2000}, {}) == \
        "num_heads 2000: the kernels take 1 to 1024"
    assert unsupported("FlatGemm", {}, {"x": "float64", "weight": "float64"}) == \
        "float64 x: the kernels take float16, bfloat16, float32"
    assert unsupported(ATTENTION, {"head_dim": 64, "scale": 0.125}, {"query": "float16", "key": "bfloat16"}) is None
    assert unsupported(ATTENTION, {"not_an_attribute": 3}, {"not_an_input": "int8"}) is None
    assert not supports_attribute(ATTENTION, "no_such_attribute") and supports_attribute(ATTENTION, "head_dim")


def test_report_has_one_line_per_reason():
    report = PassReport("attention")
    for layer in range(5):
        report.leave("Softmax", f"s{layer}", "head_dim 16: the kernels are built for 64, 128")
    report.leave("Softmax", "s5", "softmax over axis 2, not the last axis")
    report.warnings.append("something else")
    assert report.near_misses == [
        "5 left as is (head_dim 16: the kernels are built for 64, 128): Softmax 's0', Softmax 's1', Softmax 's2' ...",
        "1 left as is (softmax over axis 2, not the last axis): Softmax 's5'",
        "something else"]
    assert report.reasons()["s3"].startswith("head_dim 16") and report.reasons()["s5"].startswith("softmax over")


def test_a_head_size_no_kernel_has_leaves_attention_and_rewrites_the_rest(small_model, tmp_path):
    result, log = rewrite(small_model)
    reason = f"head_dim 16: the kernels are built for {head_sizes()}"
    first, second = [node.name for node in small_model.graph.node if node.op_type == "Softmax"]
    assert [line for line in log.splitlines() if "head_dim 16" in line] == [
        f"  warning: 2 left as is ({reason}): Softmax '{first}', Softmax '{second}'",
        f"warning: attention: 0 replaced, 2 left ({reason})"]
    assert "gemm: 9 replaced, 0 left" in log and "norm: replaced 5" in log
    found = ops(result.model)
    assert found.count("Softmax") == 2 and found.count("FlatGemm") == 9 and found.count("RMSNorm") == 5
    assert "AsyncSoftmaxAttention" not in found and "RopeAppend" not in found  # RoPE stays with its attention
    original, rewritten = tmp_path / "small.onnx", tmp_path / "small.fdpp.onnx"
    onnx.save(small_model, str(original))
    onnx.save(result.model, str(rewritten))
    assert compare_models(original, rewritten).passed

    with pytest.raises(FdppError, match=rf"--require attention: 0 replaced, 2 left \({reason}: {first}, {second}\)"):
        rewrite_model(small_model, stream=io.StringIO(), require=("attention",))
    rewrite_model(small_model, stream=io.StringIO(), require=("gemm",))  # the GEMMs are all there


def test_the_rewriter_follows_the_contract(small_model, monkeypatch):
    """The day the kernels are built for head size 16, the contract says so and the same graph is fully rewritten."""
    spec = load_contract(ATTENTION).attributes["head_dim"]
    monkeypatch.setitem(spec, "choices", sorted(spec["choices"] + [SMALL.head_dim]))
    result, log = rewrite(small_model, require=("attention", "gemm"))
    assert "attention: 2 replaced, 0 left" in log and ops(result.model).count("AsyncSoftmaxAttention") == 2
    feeds = decode_feeds(SMALL)
    expected = make_reference_session(small_model).run(None, feeds)
    got = make_reference_session(result.model).run(None, feeds)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, atol=1e-4, rtol=1e-4)


def test_a_dtype_no_kernel_takes_is_left_as_is():
    """A float64 projection beside a float32 one: the float64 MatMul stays (with its reason), the other is replaced."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w32"),
               numpy_helper.from_array(rng.standard_normal((8, 6)), "w64")]
    nodes = [helper.make_node("MatMul", ["x", "w32"], ["y32"], name="float32_proj"),
             helper.make_node("Cast", ["x"], ["x64"], to=TensorProto.DOUBLE),
             helper.make_node("MatMul", ["x64", "w64"], ["y64"], name="float64_proj")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
                              [helper.make_tensor_value_info("y32", TensorProto.FLOAT, ["b", 6]),
                               helper.make_tensor_value_info("y64", TensorProto.DOUBLE, ["b", 6])],
                              initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result, log = rewrite(model)
    reason = "float64 x: the kernels take float16, bfloat16, float32"
    assert f"  warning: 1 left as is ({reason}): MatMul 'float64_proj'" in log
    assert f"warning: gemm: 1 replaced, 1 left ({reason})" in log
    assert ops(result.model).count("FlatGemm") == 1 and ops(result.model).count("MatMul") == 1

    for node in model.graph.node:  # unnamed nodes get a name, so the summary still tells them apart
        node.name = ""
    _, log = rewrite(model)
    assert f"  warning: 1 left as is ({reason}): MatMul 'fdpp_left/MatMul_0'" in log
    assert f"warning: gemm: 1 replaced, 1 left ({reason})" in log

    only64 = helper.make_model(helper.make_graph(nodes[1:], "g", graph.input, graph.output[1:],
                                                 initializer=weights[1:]),
                               opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FdppError, match=rf"nothing rewritten: every attention chain and weight matmul was left as "
                                        rf"is \(gemm: {reason}\)"):
        rewrite(only64)
