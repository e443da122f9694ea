"""Pass 3: every MatMul (or Gemm) against a constant 2-D weight -> fdpp::FlatGemm.

    MatMul(x, W [K, N]) (+ Add(bias [N]))  then one of   (W may also be Transpose(E [N, K]): a tied embedding
                                                           whose Transpose reads external data and is not folded)
        -> Split([I, I]) -> Mul(Mul(g, Sigmoid(g)), u)   epilogue "silu_mul" (from the projection fusion pass)
        -> Add(residual) of the same shape              epilogue "residual"
        -> anything else                                epilogue "none"
    ==> FlatGemm(x, W^T [N, K], bias?, residual?)

The weight is stored transposed ([N, K]: the layout the kernels read, rows = output features). Every node gets a
complete plan, M1/M2 and the ImplB tiles, from the profile per (N, K, dtype) (fdpp_rewrite.profiles.resolve_choices);
a silu_mul node gets the silu_mul plan its profile entry stores (its decode batches in one launch). The build reads
these attributes back (fdpp_rewrite.gemm_plans).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from tqdm import tqdm

from fdpp_rewrite.contracts import DOMAIN, load_contract
from fdpp_rewrite.passes.common import (NameMaker, PassReport, constant_dtype, constant_shape, constant_value,
                                        is_constant, is_standard, named, sole_consumer, weight_tensor)
from fdpp_rewrite.passes.projection_fusion import bias_of, silu_mul_of, weight_matmuls
from fdpp_rewrite.passes.support import dtypes_of, unsupported
from fdpp_rewrite.passes.weights import WeightStore
from fdpp_rewrite.profiles import DEFAULT_PROFILE, resolve_choices

OP = "FlatGemm"
# what the pass reads, for the one line of a refusal
SUPPORTED = "weight matmuls: MatMul(x, W) or Gemm(x, W) against a constant 2-D W, optionally + bias"


class GemmMatch:
    """One weight matmul and what folds into it."""

    def __init__(self, node: gs.Node, x: gs.Tensor, weight: gs.Tensor, transposed: bool, bias: gs.Tensor | None):
        self.node, self.x, self.weight = node, x, weight
        self.transposed = transposed  # weight already stored [N, K] (Gemm with transB=1)
        self.bias = bias
        k, n = constant_shape(weight)[::-1] if transposed else constant_shape(weight)
        self.n, self.k, self.dtype = int(n), int(k), constant_dtype(weight)
        self.epilogue, self.residual, self.swap_halves = "none", None, False
        self.output = None  # the tensor the FlatGemm will produce

    @property
    def shape_key(self):
        return self.n, self.k, self.dtype


def _gemm_as_weight_matmul(node: gs.Node):
    """A Gemm that is a linear layer: Y = A B (+ C) with constant 2-D B, alpha = beta = 1, transA = 0."""
    attrs = node.attrs
    if (node.op != "Gemm" or not is_standard(node) or is_constant(node.inputs[0]) or not weight_tensor(node.inputs[1])
            or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
        return None
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    n = constant_shape(node.inputs[1])[0 if attrs.get("transB", 0) else 1]
    if bias is not None and (constant_shape(bias) is None or int(np.prod(constant_shape(bias))) != n):
        return None  # a C that is not a per-feature bias
    return GemmMatch(node, node.inputs[0], node.inputs[1], bool(attrs.get("transB", 0)), bias)


def weight_gemms(graph: gs.Graph) -> list[gs.Node]:
    return [node for node in graph.nodes if node.op == "Gemm" and _gemm_as_weight_matmul(node) is not None]


def _equal_halves_split(graph: gs.Graph, split: gs.Node, n: int) -> bool:
    if split.op != "Split" or not is_standard(split) or len(split.outputs) != 2 or n % 2:
        return False
    axis = split.attrs.get("axis", 0)
    data_rank = None if split.inputs[0].shape is None else len(split.inputs[0].shape)
    if axis != -1 and (data_rank is None or axis != data_rank - 1):
        return False
    sizes = constant_value(split.inputs[1]) if len(split.inputs) > 1 else split.attrs.get("split")
    return sizes is None or [int(s) for s in np.ravel(sizes)] == [n // 2, n // 2]


def _find_epilogue(graph: gs.Graph, match: GemmMatch, y: gs.Tensor, claimed: set) -> None:
    """The epilogue that folds into `match`, whose result is `y`. `claimed`: ids of the residual Adds earlier
    matches fold in; a parallel-residual block (GPT-NeoX, Falcon) adds two GEMM outputs, and only one of the two
    may own that Add (the other keeps its plain output, which the first reads as its residual)."""
    reader = sole_consumer(graph, y)
    match.output = y
    if reader is None:
        return
    if _equal_halves_split(graph, reader, match.n):
        first, second = reader.outputs
        for gate, up, swap in ((first, second, False), (second, first, True)):
            outer = silu_mul_of(graph, gate, up)
            if outer is not None:
                match.epilogue, match.swap_halves, match.output = "silu_mul", swap, outer.outputs[0]
                return
        return
    if reader.op == "Add" and is_standard(reader):
        other = reader.inputs[1] if reader.inputs[0] is y else reader.inputs[0]
        same_shape = (other.shape is not None and y.shape is not None and list(other.shape) == list(y.shape)
                      and all(d is not None for d in y.shape))
        if (not is_constant(other) and other is not y and same_shape and other.dtype == y.dtype
                and id(reader) not in claimed):
            claimed.add(id(reader))
            match.epilogue, match.residual, match.output = "residual", other, reader.outputs[0]


def _transposed_weight(tensor: gs.Tensor) -> gs.Tensor | None:
    """E when `tensor` = Transpose(E, perm [1, 0]) of a constant 2-D E (E is then already [N, K])."""
    node = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if node is None or node.op != "Transpose" or not is_standard(node) or not weight_tensor(node.inputs[0]):
        return None
    return node.inputs[0] if list(node.attrs.get("perm", [1, 0])) == [1, 0] else None


def transposed_weight_matmuls(graph: gs.Graph) -> list[gs.Node]:
    """MatMul(activation, Transpose(constant [N, K]))."""
    return [node for node in graph.nodes
            if node.op == "MatMul" and is_standard(node) and len(node.inputs) == 2
            and not is_constant(node.inputs[0]) and _transposed_weight(node.inputs[1]) is not None]


def find_matches(graph: gs.Graph, report: PassReport) -> list[GemmMatch]:
    """Every weight matmul the kernels serve, with what folds into it; the others are left as is in `report`."""
    found, claimed = [], set()
    for node in weight_matmuls(graph):
        add, bias = bias_of(graph, node)
        found.append((GemmMatch(node, node.inputs[0], node.inputs[1], False, bias),
                      add.outputs[0] if add is not None else node.outputs[0]))
    for node in transposed_weight_matmuls(graph):
        weight = _transposed_weight(node.inputs[1])
        add, bias = bias_of(graph, node, n=constant_shape(weight)[0])
        found.append((GemmMatch(node, node.inputs[0], weight, True, bias),
                      add.outputs[0] if add is not None else node.outputs[0]))
    found += [(match, match.node.outputs[0]) for match in map(_gemm_as_weight_matmul, weight_gemms(graph))]
    matches = []
    for match, y in found:
        why_not = unsupported(OP, {}, dict(dtypes_of(x=match.x), weight=match.dtype))
        if why_not:
            report.leave(match.node.op, named(graph, match.node), why_not)
            continue
        _find_epilogue(graph, match, y, claimed)
        matches.append(match)
    return matches


def run(graph: gs.Graph, profile_path=None, default_profile=DEFAULT_PROFILE, store: WeightStore | None = None
        ) -> PassReport:
    """Replace every weight matmul; the transposed weights are made by `store` (in memory by default)."""
    store = store or WeightStore()
    report = PassReport("flat gemm")
    contract = load_contract(OP)
    matches = find_matches(graph, report)
    choices, source, warnings = resolve_choices([m.shape_key for m in matches], profile_path, default_profile)
    report.warnings.extend(warnings)
    report.notes.append(f"thresholds from {source}")
    for key in sorted({(m.shape_key, m.epilogue == "silu_mul") for m in matches}):
        (n, k, dtype), silu = key
        choice = choices[(n, k, dtype)].for_epilogue("silu_mul" if silu else "none")
        count = sum((m.shape_key, m.epilogue == "silu_mul") == key for m in matches)
        report.notes.append(f"[N={n}, K={k}] {dtype}{' silu_mul' if silu else ''} x{count}: m1={choice.m1} "
                            f"m2={choice.m2} ImplB n_tile={choice.implb_n_tile} k_tile={choice.implb_k_tile} "
                            f"stages={choice.implb_stages} split_k={choice.implb_split_k}"
                            + (f" loader={choice.implb_loader}" if choice.implb_k_tile >= 1024 else "")
                            + (f" m3={choice.m3} wgmma stages={choice.implb_wgmma_stages} "
                               f"split_k={choice.implb_wgmma_split_k}" if choice.has_wgmma_range else ""))
    names = NameMaker(graph, "fdpp_gemm")
    # each weight is read, transposed and written once: minutes for a 7B model, hence the bar
    for match in tqdm(matches, desc="flat gemm", unit="weight", leave=False, disable=None):
        attrs = dict(choices[match.shape_key].for_epilogue(match.epilogue).attributes(), epilogue=match.epilogue,
                     has_bias=int(match.bias is not None))
        attrs = contract.validate_attributes(attrs, where=f"[{match.n}, {match.k}] {match.dtype}")
        _replace(graph, match, attrs, names, store)
        report.replaced[match.epilogue] += 1
    graph.cleanup().toposort()
    return report


def _replace(graph: gs.Graph, match: GemmMatch, attrs: dict, names: NameMaker, store: WeightStore) -> None:
    weight = constant_value(match.weight)
    weight_nk = np.ascontiguousarray(weight if match.transposed else weight.T)
    if match.swap_halves:  # the kernel reads gate rows first
        half = match.n // 2
        weight_nk = np.ascontiguousarray(np.concatenate([weight_nk[half:], weight_nk[:half]]))
    inputs = [match.x, store.constant(names("weight"), weight_nk)]
    del weight, weight_nk  # the store holds it now (on disk when streaming)
    if match.bias is not None:
        bias = np.ravel(constant_value(match.bias)).astype(inputs[1].dtype)
        if match.swap_halves:
            bias = np.concatenate([bias[match.n // 2:], bias[: match.n // 2]])
        inputs.append(store.constant(names("bias"), bias))
    if match.residual is not None:
        inputs.append(match.residual)
    output = match.output
    output.inputs.clear()  # disconnects the MatMul and what folded into it; cleanup() removes them
    graph.nodes.append(gs.Node(OP, name=names("flat_gemm"), domain=DOMAIN, attrs=attrs, inputs=inputs,
                               outputs=[output]))


def remaining_weight_matmuls(graph: gs.Graph) -> list[str]:
    return [node.name for node in weight_matmuls(graph) + transposed_weight_matmuls(graph) + weight_gemms(graph)]
