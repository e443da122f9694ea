"""The attention pass on the forms today's exporters write, built by hand (should-match and should-not-match):
the dynamo exporter's NaN guard after the softmax, sqrt(scale) on q and on k^T, its Reshape -> Transpose -> Reshape
k^T and GQA's Unsqueeze/Expand/Reshape repeat; TorchScript's single Transpose [0, 2, 3, 1] of the [B, L, H, D] keys.
Every match is also run: the rewritten graph (CPU reference ops) against the original (onnxruntime)."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from fdpp_rewrite.contracts import node_attributes
from fdpp_rewrite.passes import attention, attention_match, common
from fdpp_rewrite.ref_session import make_reference_session

BATCH, SEQ, KV_LEN, D = 2, 5, 7, 64


def build(heads=4, kv_heads=2, key_form="dynamo", q_scale=None, k_scale=None, score_scale=None, guard="nan",
          softcap=None):
    """query [B, Hq, S, D], key/value [B, Hkv, L, D] (or [B, L, Hkv, D] for key_form "torchscript"), mask
    [B, 1, S, L] -> attention output [B, Hq, S, D]. softcap (cap, cap2): Gemma 2's Mul(Tanh(Div(s, cap)), cap2)
    after the scale (a soft cap when cap == cap2)."""
    nodes, inits = [], []

    def const(value, dtype=np.float32):
        name = f"c{len(inits)}"
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(op_type, inputs, **attrs):
        out = f"t{len(nodes)}_{op_type.lower()}"
        nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{len(nodes)}", **attrs))
        return out

    groups = heads // kv_heads
    layout = [BATCH, KV_LEN, kv_heads, D] if key_form == "torchscript" else [BATCH, kv_heads, KV_LEN, D]
    inputs = [helper.make_tensor_value_info("query", TensorProto.FLOAT, [BATCH, heads, SEQ, D]),
              helper.make_tensor_value_info("key", TensorProto.FLOAT, layout),
              helper.make_tensor_value_info("value", TensorProto.FLOAT, layout),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, [BATCH, 1, SEQ, KV_LEN])]
    key, value = "key", "value"
    if key_form == "torchscript":  # v: the usual [0, 2, 1, 3]; k^T straight from the [B, L, H, D] view
        value = op("Transpose", [value], perm=[0, 2, 1, 3])
        key_t = op("Transpose", [key], perm=[0, 2, 3, 1])
    else:
        if groups > 1:  # GQA: repeat the KV heads, the target shape computed in-graph as transformers does
            def repeat(x):
                shape = op("Shape", [x])
                target = op("Concat", [op("Slice", [shape, const([0], np.int64), const([2], np.int64)]),
                                       const([groups], np.int64),
                                       op("Slice", [shape, const([2], np.int64), const([4], np.int64)])], axis=0)
                return op("Reshape", [op("Expand", [op("Unsqueeze", [x, const([2], np.int64)]), target]),
                                      const([BATCH, heads, KV_LEN, D], np.int64)])
            key, value = repeat(key), repeat(value)
        if key_form == "transpose":
            key_t = op("Transpose", [key], perm=[0, 1, 3, 2])
        elif key_form == "dynamo":  # merge the leading axes, swap the last two, split the leading axis back
            merged = op("Reshape", [key, const([-1, KV_LEN, D], np.int64)])
            key_t = op("Reshape", [op("Transpose", [merged], perm=[0, 2, 1]), const([BATCH, heads, D, KV_LEN],
                                                                                      np.int64)])
        elif key_form == "reinterpret":  # reads [L, D] memory as [D, L] (a Reshape, not a transpose): not k^T
            merged = op("Reshape", [key, const([-1, D, KV_LEN], np.int64)])
            key_t = op("Reshape", [op("Transpose", [merged], perm=[0, 2, 1]), const([BATCH, heads, KV_LEN, D],
                                                                                      np.int64)])
            key_t = op("Reshape", [key_t, const([BATCH, heads, D, KV_LEN], np.int64)])
        elif key_form == "transpose-leading":  # the 3-D Transpose swaps the merged axis, not the last two
            merged = op("Reshape", [key, const([-1, KV_LEN, D], np.int64)])
            swapped = op("Transpose", [merged], perm=[1, 0, 2])
            key_t = op("Reshape", [swapped, const([BATCH, heads, D, KV_LEN], np.int64)])
        else:
            raise ValueError(key_form)
    query = "query"
    if q_scale is not None:
        query = op("Mul", [query, const(q_scale)])
    if k_scale is not None:
        key_t = op("Mul", [const(k_scale), key_t])
    scores = op("MatMul", [query, key_t])
    if score_scale is not None:
        scores = op("Div", [scores, const(1.0 / score_scale)])
    if softcap is not None:
        scores = op("Mul", [op("Tanh", [op("Div", [scores, const(softcap[0])])]), const(softcap[1])])
    probs = op("Softmax", [op("Add", [scores, "mask"])], axis=-1)
    if guard is not None:
        isnan = op("IsNaN", [probs])
        probs = op("Where", [isnan, const(0.0 if guard == "nan" else 1.0), probs])
    op("MatMul", [probs, value])  # the output, renamed "out" below
    nodes[-1].output[0] = "out"
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [BATCH, heads, SEQ, D])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds(model, padded_row=False):
    rng = np.random.default_rng(0)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    data = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items() if name != "mask"}
    visible = np.arange(KV_LEN)[None, :] <= np.arange(SEQ)[:, None] + (KV_LEN - SEQ)
    mask = np.where(np.broadcast_to(visible, (BATCH, 1, SEQ, KV_LEN)), 0.0, np.finfo(np.float32).min)
    if padded_row:  # one fully masked query row: Softmax gives NaN with -inf, the guard and the op give 0
        mask = mask.copy()
        mask[1, 0, 0, :] = -np.inf
    data["mask"] = mask.astype(np.float32)
    return data


def rewrite(model):
    graph = gs.import_onnx(model)
    common.sanitize(graph)
    report = attention.run(graph)
    return gs.export_onnx(graph), report


def attention_attrs(model):
    return [node_attributes(n) for n in model.graph.node if n.op_type == "AsyncSoftmaxAttention"]


def assert_same_outputs(original, rewritten, data):
    expected = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, data)
    got = make_reference_session(rewritten).run(None, data)
    np.testing.assert_allclose(got[0], expected[0], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("key_form, heads, kv_heads", [
    ("dynamo", 4, 2), ("dynamo", 4, 4), ("dynamo", 4, 1), ("transpose", 4, 2), ("torchscript", 2, 2),
])
def test_exporter_forms_match(key_form, heads, kv_heads):
    root = D ** -0.25  # torch's SDPA: sqrt(1/sqrt(D)) on q and on k^T
    model = build(heads, kv_heads, key_form, q_scale=root, k_scale=root)
    rewritten, report = rewrite(model)
    (attrs,) = attention_attrs(rewritten)
    assert (attrs["num_heads"], attrs["num_kv_heads"], attrs["head_dim"]) == (heads, kv_heads, D)
    assert attrs["scale"] == pytest.approx(float(np.float32(root)) ** 2, rel=1e-6)  # both halves folded
    assert attrs["mask_mode"] == "bias" and report.replaced == {"4d/bias": 1}
    ops = [n.op_type for n in rewritten.graph.node]
    assert not {"Softmax", "IsNaN", "Where", "MatMul", "Expand"} & set(ops)  # chain, guard and repeat_kv absorbed
    assert ops.count("Transpose") == (2 if key_form == "torchscript" else 0)  # v's, and the k the op reads
    assert_same_outputs(model, rewritten, feeds(model, padded_row=True))


@pytest.mark.parametrize("q_scale, k_scale, score_scale", [(0.125, None, None), (None, 0.5, 0.25), (2.0, 0.5, 0.125)])
def test_any_scalar_factors_fold_into_one_scale(q_scale, k_scale, score_scale):
    model = build(4, 2, "dynamo", q_scale=q_scale, k_scale=k_scale, score_scale=score_scale)
    rewritten, _ = rewrite(model)
    (attrs,) = attention_attrs(rewritten)
    expected = np.prod([s for s in (q_scale, k_scale, score_scale) if s is not None])
    assert attrs["scale"] == pytest.approx(expected, rel=1e-6)
    assert_same_outputs(model, rewritten, feeds(model))


def test_chain_without_a_nan_guard_matches_too():
    model = build(4, 2, "dynamo", guard=None)
    rewritten, report = rewrite(model)
    assert report.total == 1
    assert_same_outputs(model, rewritten, feeds(model))


@pytest.mark.parametrize("options, reason", [
    ({"key_form": "reinterpret"}, "provably swaps their last two axes"),
    ({"key_form": "transpose-leading", "heads": 2, "kv_heads": 2}, "provably swaps their last two axes"),
    ({"guard": "one"}, "the probabilities feed 2 node(s)"),  # Where(IsNaN(p), 1, p) is not the NaN guard
])
def test_should_not_match(options, reason):
    model = build(**options)
    rewritten, report = rewrite(model)
    assert report.total == 0 and not attention_attrs(rewritten)
    assert len(report.near_misses) == 1 and reason in report.near_misses[0]
    assert "Softmax" in [n.op_type for n in rewritten.graph.node]
    graph = gs.import_onnx(rewritten)
    assert attention.remaining_attention(graph)  # and the rewrite's final check still sees it as attention


def test_nan_guard_is_recognised_only_with_zero_and_the_probabilities():
    model = build(guard="nan")
    graph = gs.import_onnx(model)
    common.sanitize(graph)
    where = next(n for n in graph.nodes if n.op == "Where")
    probs = next(n for n in graph.nodes if n.op == "Softmax").outputs[0]
    assert attention_match.is_nan_guard(graph, where, probs)
    other = gs.Variable("other", dtype=np.float32)
    assert not attention_match.is_nan_guard(graph, where, other)  # guards a different tensor


def test_the_dynamo_chain_is_proven_from_shapes_not_assumed():
    """The same nodes, but the shapes no longer say what the second Reshape gives back: no proof, no match."""
    model = build(4, 2, "dynamo")
    graph = gs.import_onnx(model)
    common.sanitize(graph)
    scores = next(n for n in graph.nodes if n.op == "MatMul")
    _, key_t = attention_match.strip_scalar_factors(graph, scores.inputs[1])
    assert attention_match.untransposed_key(graph, key_t) is not None
    key_t.shape = None
    assert attention_match.untransposed_key(graph, key_t) is None


def test_contract_says_a_fully_masked_row_is_exactly_zero():
    from fdpp_rewrite.contracts import load_contract

    text = " ".join(load_contract("AsyncSoftmaxAttention").raw["semantics"])
    assert "exactly 0" in text and "NaN guard" in text
    onnx.checker.check_model(build())


def test_soft_capped_attention_is_found_and_left_with_its_reason(monkeypatch):
    """Gemma 2's cap * tanh(s / cap) between the scale and the mask, with a contract that has no soft cap (as before
    version 4): the chain is left as is, and said so (the summary counts it as attention left, not as none
    found)."""
    from fdpp_rewrite.contracts import load_contract

    monkeypatch.delitem(load_contract("AsyncSoftmaxAttention").attributes, "softcap")
    model = build(softcap=(50.0, 50.0), score_scale=0.125)
    (softmax,) = [n.name for n in model.graph.node if n.op_type == "Softmax"]
    rewritten, report = rewrite(model)
    assert report.total == 0 and not attention_attrs(rewritten)
    assert report.near_misses == [f"1 left as is (logit soft-capping: not supported by the kernels yet): Softmax "
                                  f"'{softmax}'"]
    assert attention.remaining_attention(gs.import_onnx(rewritten)) == [softmax]


def test_unequal_caps_are_no_soft_cap():
    model = build(softcap=(50.0, 30.0))
    rewritten, report = rewrite(model)
    assert report.total == 0 and "neither side of the Add" in report.near_misses[0]
    assert attention.remaining_attention(gs.import_onnx(rewritten))  # still attention for the summary


def test_soft_capped_attention_gets_the_cap():
    """The contract has `softcap` (version 4): the chain is replaced, the op carries the cap, and the rewritten graph
    (the reference op applies the cap) gives the original's outputs."""
    model = build(softcap=(50.0, 50.0), score_scale=0.125)
    rewritten, report = rewrite(model)
    (attrs,) = attention_attrs(rewritten)
    assert report.total == 1 and attrs["softcap"] == pytest.approx(50.0) and attrs["scale"] == pytest.approx(0.125)
    assert "Tanh" not in [n.op_type for n in rewritten.graph.node]
    # scores within [-50, 50]: phi 0 and guard_hi 50 keep every row on the fast path, uncalibrated
    assert (attrs["phi"], attrs["guard_lo"], attrs["guard_hi"]) == (0.0, -60.0, 50.0)
    data = {name: value if name == "mask" else 4.0 * value for name, value in feeds(model).items()}
    assert_same_outputs(model, rewritten, data)  # scores of order 10-40: the cap changes them by up to a few
