"""RMSNorm subgraphs -> fdpp::RMSNorm (one op instead of eight).

Pattern (matched from each ReduceMean, by structure only), as `fdpp_rewrite export` writes it:

    x32 = Cast(x, float32)                     (absent in a float32 export: x32 = x)
    rms = Sqrt(Add(ReduceMean(Mul(x32, x32), axes=[-1], keepdims=1), eps))
    y   = Mul(Cast(Div(x32, rms), x.dtype), weight [H])      (no Cast in a float32 export)
    ==> y = RMSNorm(x, weight, epsilon=eps)

Mul and Add may have their operands in either order. LayerNormalization (OPT) is one ONNX op already: left as is.
A chain that differs anywhere (another axis, a reader of an intermediate, a weight that is not a constant of
shape [H]) stays and is listed as a near-miss. Other readers of x (the residual Add) or of its float32 Cast keep
what they read.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from fdpp_rewrite.contracts import DOMAIN, load_contract
from fdpp_rewrite.passes.common import (NameMaker, PassReport, collect_matches, constant_dtype, constant_shape,
                                        constant_value, dtype_name, is_constant, is_standard, producer, rank,
                                        scalar_value, sole_consumer, static_dim)

OP = "RMSNorm"


@dataclass
class NormMatch:
    x: gs.Tensor        # the op's input (before the float32 Cast)
    weight: gs.Tensor   # [H] constant
    output: gs.Tensor   # the weight Mul's output: the op writes it
    epsilon: float


def _other_input(node: gs.Node, tensor: gs.Tensor) -> gs.Tensor | None:
    """The operand of a binary node that is not `tensor` (None if neither or both are)."""
    a, b = node.inputs[0], node.inputs[1]
    if a is tensor and b is not tensor:
        return b
    if b is tensor and a is not tensor:
        return a
    return None


def _reduces_last_axis(node: gs.Node) -> bool:
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1:  # opset 18: the axes are an input
        value = constant_value(node.inputs[1])
        axes = None if value is None else value.reshape(-1).tolist()
    if axes is None or len(axes) != 1 or node.attrs.get("keepdims", 1) != 1:
        return False
    axis = int(axes[0])
    last = rank(node.inputs[0])
    return axis == -1 or (last is not None and axis == last - 1)


def _single_reader(graph: gs.Graph, tensor: gs.Tensor, op: str) -> gs.Node | None:
    node = sole_consumer(graph, tensor)
    return node if node is not None and node.op == op and is_standard(node) else None


def match_norm(graph: gs.Graph, reduce_mean: gs.Node) -> NormMatch | str:
    """The RMSNorm around this ReduceMean, or why it is not one."""
    if not _reduces_last_axis(reduce_mean):
        return "it does not average the last axis with keepdims=1"
    square = producer(reduce_mean.inputs[0])
    if square is None or square.op != "Mul" or square.inputs[0] is not square.inputs[1]:
        return "its input is not Mul(x, x)"
    x32 = square.inputs[0]
    add = _single_reader(graph, reduce_mean.outputs[0], "Add")
    eps_tensor = None if add is None else _other_input(add, reduce_mean.outputs[0])
    epsilon = scalar_value(eps_tensor) if eps_tensor is not None and is_constant(eps_tensor) else None
    if epsilon is None:
        return "the mean square is not followed by Add(a scalar constant epsilon)"
    sqrt = _single_reader(graph, add.outputs[0], "Sqrt")
    div = None if sqrt is None else _single_reader(graph, sqrt.outputs[0], "Div")
    if div is None or div.inputs[0] is not x32 or div.inputs[1] is not sqrt.outputs[0]:
        return "the root mean square does not divide the squared input (Sqrt -> Div(x, rms))"
    if sole_consumer(graph, square.outputs[0]) is not reduce_mean:
        return "the squares have readers besides the ReduceMean"

    cast_in = producer(x32)
    if cast_in is not None and cast_in.op == "Cast" and is_standard(cast_in):
        x = cast_in.inputs[0]
        if dtype_name(x32) != "float32":
            return f"the input is cast to {dtype_name(x32)}, not float32"
    else:
        x, cast_in = x32, None
        if x.dtype is not None and dtype_name(x) != "float32":
            return f"a {dtype_name(x)} input is squared without a Cast to float32 first"
    normed = div.outputs[0]
    cast_out = _single_reader(graph, normed, "Cast")
    if cast_out is not None:
        normed = cast_out.outputs[0]
    if x.dtype is not None and normed.dtype is not None and dtype_name(normed) != dtype_name(x):
        return f"the normalized values are {dtype_name(normed)} but the input is {dtype_name(x)}"
    scale = _single_reader(graph, normed, "Mul")
    weight = None if scale is None else _other_input(scale, normed)
    if weight is None or not is_constant(weight):
        return "the normalized values are not scaled by a constant weight (Mul(normed, weight))"
    hidden = static_dim(x, -1)
    if constant_shape(weight) is None or len(constant_shape(weight)) != 1 or \
            (hidden is not None and constant_shape(weight)[0] != hidden):
        return f"the weight has shape {constant_shape(weight)}, expected [{hidden or 'H'}]"
    if x.dtype is not None and constant_dtype(weight) != dtype_name(x):
        return f"the weight is {constant_dtype(weight)} but the input is {dtype_name(x)}"
    return NormMatch(x=x, weight=weight, output=scale.outputs[0], epsilon=float(epsilon))


def run(graph: gs.Graph) -> PassReport:
    """Replace every RMSNorm chain (none is fine: OPT's norms are LayerNormalization)."""
    report = PassReport("norm")
    contract = load_contract(OP)
    names = NameMaker(graph, "fdpp_norm")
    matches = collect_matches(graph, "ReduceMean", match_norm, report)
    for match in matches:
        attrs = contract.validate_attributes({"epsilon": match.epsilon}, where=f"norm of '{match.x.name}'")
        match.output.inputs.clear()  # disconnects the old chain; cleanup() removes it
        graph.nodes.append(gs.Node(OP, name=names("rms_norm"), domain=DOMAIN, attrs=attrs,
                                   inputs=[match.x, match.weight], outputs=[match.output]))
        report.replaced["rms_norm"] += 1
    graph.cleanup().toposort()
    return report
