"""RMSNorm subgraphs -> fdpp::RMSNorm (one op instead of eight).

Pattern (matched from each ReduceMean, by structure only), as `fdpp_rewrite export` and Hugging Face's
LlamaRMSNorm / GemmaRMSNorm (torch.onnx.export, TorchScript or dynamo) write it:

    x32  = Cast(x, float32)                      (absent, or a float32 -> float32 Cast, in a float32 graph)
    ms   = Add(ReduceMean(Mul(x32, x32) | Pow(x32, 2), axes=[-1], keepdims=1), eps)
    n    = Div(x32, Sqrt(ms))  |  Mul(x32, Reciprocal(Sqrt(ms)) | Div(1, Sqrt(ms)))     (rsqrt written out)
    y    = Mul(Cast?(n), weight [H])  |  Cast(Mul(n, weight [H]))                        (Gemma: weight in float32)
    ==> y = RMSNorm(x, weight in x's dtype, epsilon=eps)

Mul and Add may have their operands in either order. A float32 weight of a float16 / bfloat16 model (Gemma's
`1 + weight` in float32, folded to a constant by sanitize) is stored in the model's dtype: the op multiplies in
float32 after rounding normed to x's dtype, a rounding the original skips (well inside the contract's tolerance).
LayerNormalization (OPT) is one ONNX op already: left as is. A chain that differs anywhere (another axis, a reader
of an intermediate, a weight that is not a constant of shape [H]) stays and is listed as a near-miss. Other readers
of x (the residual Add) or of its float32 Cast keep what they read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from fdpp_rewrite.contracts import DOMAIN, load_contract
from fdpp_rewrite.passes.common import (NameMaker, PassReport, collect_matches, constant_dtype, constant_shape,
                                        constant_value, dtype_name, is_constant, is_standard, np_dtype, producer,
                                        rank, scalar_value, sole_consumer, static_dim)
from fdpp_rewrite.passes.support import dtypes_of, unsupported

OP = "RMSNorm"


@dataclass
class NormMatch:
    x: gs.Tensor        # the op's input (before the float32 Cast)
    weight: gs.Tensor   # [H] constant
    output: gs.Tensor   # the weight Mul's output (or its Cast's): the op writes it
    epsilon: float
    reduce_mean: gs.Node


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


def _squared(node: gs.Node | None) -> gs.Tensor | None:
    """a when `node` is Mul(a, a) or Pow(a, 2)."""
    if node is None or not is_standard(node):
        return None
    if node.op == "Mul" and node.inputs[0] is node.inputs[1]:
        return node.inputs[0]
    if node.op == "Pow" and scalar_value(node.inputs[1]) == 2.0:
        return node.inputs[0]
    return None


def _normalized(graph: gs.Graph, rms: gs.Tensor, x32: gs.Tensor) -> gs.Tensor | None:
    """x32 / rms, written as Div(x32, rms) or as Mul(x32, 1 / rms) with Reciprocal(rms) or Div(1, rms)."""
    div = _single_reader(graph, rms, "Div")
    if div is not None and div.inputs[1] is rms:
        if div.inputs[0] is x32:
            return div.outputs[0]
        if scalar_value(div.inputs[0]) != 1.0:
            return None
        inverse = div.outputs[0]
    else:
        reciprocal = _single_reader(graph, rms, "Reciprocal")
        if reciprocal is None:
            return None
        inverse = reciprocal.outputs[0]
    mul = _single_reader(graph, inverse, "Mul")
    return None if mul is None or _other_input(mul, inverse) is not x32 else mul.outputs[0]


def _through_cast(graph: gs.Graph, tensor: gs.Tensor) -> gs.Tensor:
    cast = _single_reader(graph, tensor, "Cast")
    return tensor if cast is None else cast.outputs[0]


def match_norm(graph: gs.Graph, reduce_mean: gs.Node) -> NormMatch | str:
    """The RMSNorm around this ReduceMean, or why it is not one."""
    if not _reduces_last_axis(reduce_mean):
        return "it does not average the last axis with keepdims=1"
    square = producer(reduce_mean.inputs[0])
    x32 = _squared(square)
    if x32 is None:
        return "its input is not Mul(x, x) or Pow(x, 2)"
    add = _single_reader(graph, reduce_mean.outputs[0], "Add")
    eps_tensor = None if add is None else _other_input(add, reduce_mean.outputs[0])
    epsilon = scalar_value(eps_tensor) if eps_tensor is not None and is_constant(eps_tensor) else None
    if epsilon is None:
        return "the mean square is not followed by Add(a scalar constant epsilon)"
    sqrt = _single_reader(graph, add.outputs[0], "Sqrt")
    normed = None if sqrt is None else _normalized(graph, sqrt.outputs[0], x32)
    if normed is None:
        return ("the root mean square does not divide the squared input (Sqrt -> Div(x, rms), or Mul(x, 1 / rms) "
                "with Reciprocal or Div(1, rms))")
    if sole_consumer(graph, square.outputs[0]) is not reduce_mean:
        return "the squares have readers besides the ReduceMean"

    cast_in = producer(x32)
    if cast_in is not None and cast_in.op == "Cast" and is_standard(cast_in):
        x = cast_in.inputs[0]
        if dtype_name(x32) != "float32":
            return f"the input is cast to {dtype_name(x32)}, not float32"
    else:
        x = x32
        if x.dtype is not None and dtype_name(x) != "float32":
            return f"a {dtype_name(x)} input is squared without a Cast to float32 first"
    before = _through_cast(graph, normed)
    scale = _single_reader(graph, before, "Mul")
    weight = None if scale is None else _other_input(scale, before)
    if weight is None or not is_constant(weight):
        return "the normalized values are not scaled by a constant weight (Mul(normed, weight))"
    output = scale.outputs[0]
    if before is normed and x.dtype is not None and output.dtype is not None and dtype_name(output) != dtype_name(x):
        output = _through_cast(graph, output)  # the weight multiplied in float32, then the Cast back (Gemma)
    if x.dtype is not None and output.dtype is not None and dtype_name(output) != dtype_name(x):
        return f"the normalized values are {dtype_name(output)} but the input is {dtype_name(x)}"
    hidden = static_dim(x, -1)
    if constant_shape(weight) is None or len(constant_shape(weight)) != 1 or \
            (hidden is not None and constant_shape(weight)[0] != hidden):
        return f"the weight has shape {constant_shape(weight)}, expected [{hidden or 'H'}]"
    return NormMatch(x=x, weight=weight, output=output, epsilon=float(epsilon), reduce_mean=reduce_mean)


def _weight_in_dtype(match: NormMatch, names: NameMaker) -> gs.Tensor | str:
    """The weight in x's dtype (the op takes both in one dtype), or why it cannot be."""
    want, have = dtype_name(match.x), constant_dtype(match.weight)
    if match.x.dtype is None or have == want:
        return match.weight
    target = np_dtype(match.x)
    if target is None or have == "bfloat16" or not np.issubdtype(target, np.floating):
        return f"the weight is {have} but the input is {want}"
    return gs.Constant(names("weight"), np.asarray(constant_value(match.weight), dtype=target))


def run(graph: gs.Graph) -> PassReport:
    """Replace every RMSNorm chain (none is fine: OPT's norms are LayerNormalization)."""
    report = PassReport("norm")
    contract = load_contract(OP)
    names = NameMaker(graph, "fdpp_norm")
    matches = collect_matches(graph, "ReduceMean", match_norm, report)
    for match in matches:
        weight = _weight_in_dtype(match, names)
        why_not = weight if isinstance(weight, str) else unsupported(OP, {"epsilon": match.epsilon},
                                                                     dtypes_of(x=match.x))
        if why_not:
            report.leave("ReduceMean", match.reduce_mean.name, why_not)
            continue
        attrs = contract.validate_attributes({"epsilon": match.epsilon}, where=f"norm of '{match.x.name}'")
        match.output.inputs.clear()  # disconnects the old chain; cleanup() removes it
        graph.nodes.append(gs.Node(OP, name=names("rms_norm"), domain=DOMAIN, attrs=attrs,
                                   inputs=[match.x, weight], outputs=[match.output]))
        report.replaced["rms_norm"] += 1
    graph.cleanup().toposort()
    return report
