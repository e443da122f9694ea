"""Pass 2: horizontal fusion of the projections that read one input, so each layer has the paper's four
GEMM shapes (qkv, o, gate_up, down) instead of six.

  * q/k/v: three MatMuls against constant 2-D weights reading the same tensor, each feeding an
    fdpp::AsyncSoftmaxAttention (run the attention pass first) ->
        MatMul(x, [Wq | Wk | Wv]) (+ Add([bq | bk | bv])) -> Split([Nq, Nk, Nv], last axis)
  * gate/up: two such MatMuls whose outputs g, u feed Mul(Mul(g, Sigmoid(g)), u) ->
        MatMul(x, [Wg | Wu]) (+ Add([bg | bu])) -> Split([I, I]) -> the same SiLU-mul nodes,
    which the flat_gemm pass folds into a FlatGemm with epilogue "silu_mul" (weight rows: gate, then up).

The result is still a standard-ops graph (it runs in onnxruntime). Weights keep their dtype; a missing bias
in a group where others have one is filled with zeros.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fdpp_rewrite.contracts import DOMAIN
from fdpp_rewrite.passes.weights import concat_constant
from fdpp_rewrite.passes.common import (NameMaker, PassReport, constant_dtype, constant_shape, constant_value,
                                        is_constant,
                                        is_standard, reaches, sole_consumer, weight_tensor)


def weight_matmuls(graph: gs.Graph) -> list[gs.Node]:
    """MatMul(activation, constant 2-D weight) nodes."""
    return [node for node in graph.nodes
            if node.op == "MatMul" and is_standard(node) and len(node.inputs) == 2
            and not is_constant(node.inputs[0]) and weight_tensor(node.inputs[1])]


def bias_of(graph: gs.Graph, matmul: gs.Node, n: int | None = None):
    """(Add node, bias constant) when the MatMul's only reader adds a constant [N] vector, else (None, None).
    N is the weight's second dim unless given."""
    add = sole_consumer(graph, matmul.outputs[0])
    if add is None or add.op != "Add" or not is_standard(add):
        return None, None
    n = constant_shape(matmul.inputs[1])[1] if n is None else n
    other = add.inputs[1] if add.inputs[0] is matmul.outputs[0] else add.inputs[0]
    shape = constant_shape(other)
    if shape is None or int(np.prod(shape)) != n or (len(shape) and shape[-1] != n):
        return None, None
    return add, other


def silu_mul_of(graph: gs.Graph, gate: gs.Tensor, up: gs.Tensor) -> gs.Node | None:
    """The outer Mul of Mul(Mul(gate, Sigmoid(gate)), up) (either operand order), with every intermediate read
    only inside the pattern; None if the tensors are not wired that way."""
    readers = gate.outputs
    if gate in graph.outputs or len(readers) != 2:
        return None
    sigmoid = next((n for n in readers if n.op == "Sigmoid"), None)
    inner = next((n for n in readers if n.op == "Mul"), None)
    if sigmoid is None or inner is None or sole_consumer(graph, sigmoid.outputs[0]) is not inner:
        return None
    if {id(t) for t in inner.inputs} != {id(gate), id(sigmoid.outputs[0])}:
        return None
    outer = sole_consumer(graph, inner.outputs[0])
    if outer is None or outer.op != "Mul" or sole_consumer(graph, up) is not outer:
        return None
    if {id(t) for t in outer.inputs} != {id(inner.outputs[0]), id(up)}:
        return None
    return outer


def _projection_output(graph, matmul):
    """The tensor a projection hands on: the bias Add's output if it has one, else the MatMul's."""
    add, _ = bias_of(graph, matmul)
    return add.outputs[0] if add is not None else matmul.outputs[0]


def _is_attention_node(node: gs.Node) -> bool:
    """The fdpp attention op, or a MatMul(probs, v) of a standard attention chain (its first input comes from a
    Softmax through casts and a NaN guard): the fusion does not depend on the attention pass having replaced it."""
    if node.domain == DOMAIN:
        return node.op == "AsyncSoftmaxAttention"
    if node.op != "MatMul" or not is_standard(node):
        return False
    tensor = node.inputs[0]
    for _ in range(4):
        producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
        if producer is None:
            return False
        if producer.op == "Softmax":
            return True
        if producer.op not in ("Cast", "Identity", "Where"):
            return False
        tensor = producer.inputs[-1]  # Where(IsNaN(p), 0, p): p is its last input
    return False


def _feeds_attention(graph, tensor) -> bool:
    # q/k/v reach the attention through reshapes, RoPE and the cache write: a few dozen nodes at most
    return reaches(graph, tensor, _is_attention_node, max_nodes=256) is not None


def _fuse(graph: gs.Graph, x: gs.Tensor, matmuls: list, names: NameMaker, kind: str) -> None:
    weights = [m.inputs[1] for m in matmuls]
    dtype = np.dtype(weights[0].dtype)
    widths = [constant_shape(w)[1] for w in weights]
    # lazy: the weights are read and joined only when the flat gemm pass writes the transposed result
    fused_weight = concat_constant(names(f"{kind}_weight"), weights, axis=1)
    outputs = [_projection_output(graph, m) for m in matmuls]
    biases = [bias_of(graph, m)[1] for m in matmuls]
    total = sum(widths)
    fused = gs.Variable(names(f"{kind}_matmul"), dtype=outputs[0].dtype, shape=_with_last(outputs[0].shape, total))
    for out in outputs:
        out.inputs.clear()  # disconnect the old projections; cleanup() removes them
    graph.nodes.append(gs.Node("MatMul", name=names(f"{kind}_matmul"), inputs=[x, fused_weight], outputs=[fused]))
    if any(b is not None for b in biases):
        parts = [np.ravel(constant_value(b)).astype(dtype) if b is not None else np.zeros(w, dtype)
                 for b, w in zip(biases, widths)]
        with_bias = gs.Variable(names(f"{kind}_biased"), dtype=fused.dtype, shape=fused.shape)
        graph.nodes.append(gs.Node("Add", name=names(f"{kind}_bias_add"),
                                   inputs=[fused, gs.Constant(names(f"{kind}_bias"), np.concatenate(parts))],
                                   outputs=[with_bias]))
        fused = with_bias
    sizes = gs.Constant(names(f"{kind}_split_sizes"), np.array(widths, dtype=np.int64))
    graph.nodes.append(gs.Node("Split", name=names(f"{kind}_split"), attrs={"axis": -1},
                               inputs=[fused, sizes], outputs=outputs))


def _with_last(shape, size):
    return None if shape is None else list(shape[:-1]) + [size]


def run(graph: gs.Graph) -> PassReport:
    """Fuse every q/k/v and gate/up group (the fused weights stay lazy, see passes/weights.py)."""
    report = PassReport("projection fusion")
    names = NameMaker(graph, "fdpp_fusion")
    groups = {}
    for node in weight_matmuls(graph):
        groups.setdefault(id(node.inputs[0]), (node.inputs[0], []))[1].append(node)
    for x, matmuls in groups.values():
        if len(matmuls) < 2:
            continue
        shapes = {(constant_shape(m.inputs[1])[0], constant_dtype(m.inputs[1])) for m in matmuls}
        if len(shapes) != 1:
            report.leave("input", x.name, f"{len(matmuls)} MatMuls read it with different K or dtype")
            continue
        outputs = [_projection_output(graph, m) for m in matmuls]
        if len(matmuls) == 3:
            if all(_feeds_attention(graph, out) for out in outputs):
                _fuse(graph, x, matmuls, names, "qkv")
                report.replaced["qkv"] += 1
            else:
                report.leave("input", x.name, "3 MatMuls read it but not all feed an attention op")
        elif len(matmuls) == 2:
            pair = None
            for gate_index in (0, 1):
                if silu_mul_of(graph, outputs[gate_index], outputs[1 - gate_index]) is not None:
                    pair = [matmuls[gate_index], matmuls[1 - gate_index]]
            if pair is not None:
                _fuse(graph, x, pair, names, "gate_up")
                report.replaced["gate_up"] += 1
            else:
                report.leave("input", x.name, "2 MatMuls read it but are not gate/up of a SiLU-gated MLP "
                                              "(Mul(Mul(g, Sigmoid(g)), u))")
        else:
            report.leave("input", x.name, f"{len(matmuls)} MatMuls read it; only q/k/v (3) and gate/up (2) are fused")
    graph.cleanup().toposort()
    return report
