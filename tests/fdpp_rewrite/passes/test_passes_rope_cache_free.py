"""The rope_append pass on a cache-free attention layer as torch.onnx.export writes a transformers prefill: rotate_half
by two Slices (end INT64_MAX, axis 3), cos/sin from the graph's own Range over the sequence and an inv_freq constant,
scaled by transformers' attention_scaling 1.0. The rotation becomes RopeAppend with past_len 0 whose caches are k and v
themselves; positions read from an input's values, or a strided Slice, are not that pattern."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper, numpy_helper

from fdpp_rewrite.compare import compare_models
from fdpp_rewrite.contracts import node_attributes
from fdpp_rewrite.passes import attention, common, rope_append
from fdpp_rewrite.passes.rope_match import last_axis_slice

HEADS, HEAD_DIM = 2, 64
INV_FREQ = (10000.0 ** -(np.arange(HEAD_DIM // 2) / (HEAD_DIM // 2))).astype(np.float32)
INT64_MAX = np.iinfo(np.int64).max


def build_prefill(positions_input=False, step=1) -> onnx.ModelProto:
    """query/key/value [batch, 2, seq, 64] -> one attention layer with HF's RoPE on q and k."""
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(kind, inputs, out, **attrs):
        nodes.append(helper.make_node(kind, inputs, [out], name=out, **attrs))
        return out

    half = HEAD_DIM // 2
    if positions_input:  # position_ids [batch, seq] as an input: values, not shapes
        positions = op("Unsqueeze", ["position_ids", const("ax2", np.array([2], np.int64))], "pos3")
    else:
        seq = op("Gather", [op("Shape", ["query"], "qshape"), const("two", np.array(2, np.int64))], "seq", axis=0)
        steps = op("Range", [const("zero", np.array(0, np.int64)), seq, const("one", np.array(1, np.int64))], "steps")
        positions = op("Unsqueeze", [steps, const("ax02", np.array([0, 2], np.int64))], "pos3")
    freqs = op("Mul", [op("Cast", [positions], "posf", to=TensorProto.FLOAT), const("inv_freq", INV_FREQ)], "freqs")
    angles = op("Concat", [freqs, freqs], "angles", axis=-1)
    tables = {}
    for kind in ("Cos", "Sin"):
        scaled = op("Mul", [op(kind, [angles], kind.lower()), const(f"scaling_{kind}", np.array(1.0, np.float32))],
                    f"{kind.lower()}_scaled")
        tables[kind] = op("Unsqueeze", [scaled, const(f"ax1_{kind}", np.array([1], np.int64))], f"{kind.lower()}4")
    rotated = {}
    for name in ("query", "key"):
        low = op("Slice", [name, const(f"{name}_s0", np.array([0])), const(f"{name}_e0", np.array([half * step])),
                           const(f"{name}_a0", np.array([3])), const(f"{name}_p0", np.array([step]))], f"{name}_low")
        high = op("Slice", [name, const(f"{name}_s1", np.array([half])), const(f"{name}_e1", np.array([INT64_MAX])),
                            const(f"{name}_a1", np.array([3]))], f"{name}_high")
        turned = op("Concat", [op("Neg", [high], f"{name}_neg"), low], f"{name}_turned", axis=-1)
        rotated[name] = op("Add", [op("Mul", [name, tables["Cos"]], f"{name}_cos"),
                                   op("Mul", [turned, tables["Sin"]], f"{name}_sin")], f"{name}_rot")
    key_t = op("Transpose", [rotated["key"]], "key_t", perm=[0, 1, 3, 2])
    scores = op("Mul", [op("MatMul", [rotated["query"], key_t], "qk"),
                        const("scale", np.array(HEAD_DIM ** -0.5, np.float32))], "scores")
    probs = op("Softmax", [scores], "probs", axis=-1)
    nodes.append(helper.make_node("MatMul", [probs, "value"], ["out"], name="pv"))
    shape = ["batch", HEADS, "seq", HEAD_DIM]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("query", "key", "value")]
    if positions_input:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]))
    output = helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)
    graph = helper.make_graph(nodes, "prefill", inputs, [output], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def rewrite(model):
    graph = gs.import_onnx(model)
    common.sanitize(graph)
    assert attention.run(graph).total == 1
    report = rope_append.run(graph)
    return gs.export_onnx(graph, do_type_check=False), report


def test_transformers_rotate_half_becomes_rope_append_at_past_len_zero():
    model = build_prefill()
    rewritten, report = rewrite(model)
    assert report.replaced == {"rope_prefill": 1} and not report.near_misses
    ops = [n.op_type for n in rewritten.graph.node]
    assert not {"Sin", "Cos", "Neg", "Slice", "Concat"} & set(ops), ops
    (node,) = [n for n in rewritten.graph.node if n.op_type == "RopeAppend"]
    assert (node.input[1], node.input[2]) == (node.input[3], node.input[4]) == ("key", "value")  # k, v are the caches
    attrs = node_attributes(node)
    assert (attrs["rope_dim"], attrs["interleaved"], attrs["head_dim"]) == (HEAD_DIM, 0, HEAD_DIM)
    (table,) = [i for i in rewritten.graph.initializer if i.name == node.input[6]]
    np.testing.assert_array_equal(numpy_helper.to_array(table), INV_FREQ)
    (attn,) = [n for n in rewritten.graph.node if n.op_type == "AsyncSoftmaxAttention"]
    assert list(attn.input)[:3] == list(node.output)
    report = compare_models(model, rewritten)
    assert report.passed, [(r.output, r.max_abs) for r in report.rows]


def test_positions_from_an_input_are_left_with_the_reason():
    _, report = rewrite(build_prefill(positions_input=True))
    assert report.total == 0
    assert any("cannot be evaluated from the input shapes alone" in miss for miss in report.near_misses), \
        report.near_misses


def test_a_strided_slice_is_not_half_a_head():
    model = build_prefill(step=2)  # x[..., 0:64:2]: as many channels as the low half, not the low half
    graph = gs.import_onnx(model)
    assert last_axis_slice(next(t for name, t in graph.tensors().items() if name == "query_low")) is None
    rewritten, report = rewrite(model)  # neither q nor k is rotated as the op rotates: no candidate, no report
    assert report.total == 0 and not report.near_misses
    assert [n.op_type for n in rewritten.graph.node].count("Neg") == 2
