"""Pass 1: softmax attention chains -> fdpp::AsyncSoftmaxAttention.

The chain is matched by structure (passes/attention_match.py: the pattern and its two layouts), its mask becomes the
op's mask_mode and 4th input (passes/attention_mask.py), and the node takes phi, the guard and the softmax verdict
per layer from a calibration file (fdpp_rewrite/calibration/settings.py, layers numbered by graph order), else the
contract's defaults. A chain the pass cannot express, or one the kernels cannot serve (a head size, a dtype or a
soft cap the contract lacks: passes/support.py), is left as is with the reason in the report; the rewrite's summary
(remaining_attention) counts what is left and `--require attention` refuses it.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fdpp_rewrite.calibration.settings import (DEFAULT_SETTINGS, OP, SoftmaxSettings, attention_nodes,
                                               node_attributes_with)
from fdpp_rewrite.contracts import DOMAIN, load_contract
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.passes.attention_mask import bias_input, dtypes_differ, mask_mode, onnx_dtype
from fdpp_rewrite.passes.attention_match import AttentionMatch, match_attention, permuted_shape
from fdpp_rewrite.passes.common import (PAST_LEN_INPUT, NameMaker, PassReport, collect_matches, is_constant,
                                        producer)
from fdpp_rewrite.passes.support import dtypes_of, supports_attribute, unsupported

__all__ = ["run", "remaining_attention", "looks_like_attention", "SUPPORTED", "DEFAULT_PHI",
           "DEFAULT_GUARD_LO", "DEFAULT_GUARD_HI"]  # what rewrite.py reads from the pass

DEFAULT_PHI, DEFAULT_GUARD_LO, DEFAULT_GUARD_HI = DEFAULT_SETTINGS.phi, DEFAULT_SETTINGS.guard_lo, \
    DEFAULT_SETTINGS.guard_hi
SOFTCAP = "softcap"  # the contract attribute a soft-capped chain needs
WINDOW = "window"  # the contract attribute of a sliding-window mask (attention_mask.mask_mode)
SOFTCAP_MISSING = "logit soft-capping: not supported by the kernels yet"


def _model_attributes(match: AttentionMatch) -> dict:
    """The op's attributes that come from the model (the rest are the mask mode and the calibration's)."""
    attrs = {"scale": match.scale, "num_heads": match.num_heads, "num_kv_heads": match.num_kv_heads,
             "head_dim": match.head_dim}
    if match.softcap is not None:
        attrs[SOFTCAP] = match.softcap
    return attrs


def _uncalibrated_settings(softcap: float | None) -> SoftmaxSettings:
    """A layer's phi and guard without a calibration: the defaults, except for a soft-capped layer, whose scores all
    lie in [-cap, cap]: phi 0 with guard_hi = cap (up to the contract's bound) never sends its rows to the fallback
    (docs/notes-attention.md, "Soft-capping and the unified max"). Example: cap 50 -> phi 0, guard [-60, 50]."""
    if not softcap:
        return DEFAULT_SETTINGS
    hi_max = float(load_contract(OP).attributes["guard_hi"]["range"][1])
    return SoftmaxSettings(0.0, DEFAULT_GUARD_LO, max(DEFAULT_GUARD_HI, min(float(softcap), hi_max)))


def _why_not_served(match: AttentionMatch) -> str | None:
    if match.softcap is not None and not supports_attribute(OP, SOFTCAP):
        return SOFTCAP_MISSING
    return unsupported(OP, _model_attributes(match), dtypes_of(query=match.query, key=match.key, value=match.value))


def run(graph: gs.Graph, calibration: list[SoftmaxSettings] | None = None) -> PassReport:
    """Replace every attention chain it can prove and the kernels can serve; the others are left as is, with the
    reason in the report (the rewrite decides whether that is an error)."""
    report = PassReport("attention")
    contract = load_contract(OP)
    matches = []
    for match in collect_matches(graph, "Softmax", match_attention, report):
        why_not = _why_not_served(match)
        if why_not:
            report.leave("Softmax", match.softmax.name, why_not)
        else:
            matches.append(match)
    if not matches and calibration is None:
        return report
    if calibration is not None and len(calibration) != len(matches):
        raise FdppError(f"the calibration has {len(calibration)} layers but the graph has {len(matches)} attention "
                        "layers the kernels serve; calibrate this model (`python -m fdpp_rewrite calibrate`)")

    names = NameMaker(graph, "fdpp_attention")
    mode_cache, bias_cache = {}, {}
    past_len = next((t for t in graph.inputs if t.name == PAST_LEN_INPUT), None)
    for match in matches:
        mode, window = mask_mode(graph, match.mask, mode_cache, report)
        fourth = []
        if mode == "past_len":
            fourth = [past_len]
        elif mode == "bias":
            bias = bias_input(graph, match, names, bias_cache)
            if isinstance(bias, str):
                report.leave("Softmax", match.softmax.name, bias)
                continue
            fourth = [bias]
        attrs = dict(_model_attributes(match), mask_mode=mode)
        if window:
            attrs[WINDOW] = window
        attrs = contract.validate_attributes(attrs, where=f"Softmax '{match.softmax.name}'")
        _replace(graph, match, node_attributes_with(attrs, _uncalibrated_settings(match.softcap)), fourth, names)
        report.replaced[f"{match.layout}/{mode}" + ("+window" if window else "")] += 1
    graph.cleanup().toposort()
    if calibration is None:
        report.notes.append(f"phi={DEFAULT_PHI}, guard [{DEFAULT_GUARD_LO}, {DEFAULT_GUARD_HI}] (defaults; "
                            "--calibration sets them per layer; a soft-capped layer's guard_hi is its cap)")
    else:
        _set_layers(attention_nodes(graph.nodes), calibration, report)
    return report


def _set_layers(nodes: list, calibration: list[SoftmaxSettings], report: PassReport) -> None:
    """Layer k's settings on the k-th attention node, as `calibrate --apply` writes them."""
    if len(nodes) != len(calibration):  # a chain was left as is (its mask): the summary says so
        report.warnings.append(f"calibration not applied: {len(nodes)} of {len(calibration)} attention layers "
                               "were replaced")
        return
    for layer, (node, settings) in enumerate(zip(nodes, calibration)):
        node.attrs = node_attributes_with(node.attrs, settings, where=f"layer {layer}")
        if "softmax" in node.attrs:
            report.notes.append(f"layer {layer}: softmax={node.attrs['softmax']} (the calibration's verdict)")


def _replace(graph, match: AttentionMatch, attrs: dict, fourth: list, names: NameMaker) -> None:
    output = match.output
    output.inputs.clear()  # disconnects the old chain; cleanup() removes it
    op_output = output
    if dtypes_differ(match.query, output):  # e.g. a chain that ended in a Cast: the op answers in q's dtype
        op_output = gs.Variable(names("output"), dtype=match.query.dtype, shape=output.shape)
        to = onnx_dtype(output)
        graph.nodes.append(gs.Node("Cast", name=names("cast"), attrs={"to": to}, inputs=[op_output], outputs=[output]))
    key = match.key
    if match.key_perm is not None:  # k^T was one Transpose of another layout: the op reads k in [B, Hkv, L, D]
        key = gs.Variable(names("key"), dtype=match.key.dtype, shape=permuted_shape(match.key, match.key_perm))
        graph.nodes.append(gs.Node("Transpose", name=names("key_transpose"), attrs={"perm": match.key_perm},
                                   inputs=[match.key], outputs=[key]))
    graph.nodes.append(gs.Node(OP, name=names("attention"), domain=DOMAIN, attrs=attrs,
                               inputs=[match.query, key, match.value] + fourth, outputs=[op_output]))


def looks_like_attention(graph: gs.Graph, softmax: gs.Node) -> bool:
    """Loosely: a Softmax between a MatMul of two activations and a MatMul reading the probabilities, whatever
    else the chain holds. The final check uses this, so a chain the pass could not express fails the rewrite
    instead of staying behind as a near-miss."""
    if not _reaches_probs_matmul(softmax.outputs[0]):
        return False
    frontier = [softmax.inputs[0]]
    for _ in range(8):  # Cast / Add(mask) / Mul|Div(scale) / soft cap / Where between the scores and the softmax
        next_frontier = []
        for tensor in frontier:
            node = producer(tensor)
            if node is None:
                continue
            if node.op == "MatMul" and not any(is_constant(t) for t in node.inputs):
                return True
            if node.op in ("Cast", "Add", "Mul", "Div", "Tanh", "Where", "Identity", "Dropout"):
                next_frontier.extend(t for t in node.inputs if not is_constant(t))
        frontier = next_frontier
    return False


def _reaches_probs_matmul(tensor: gs.Tensor, hops: int = 4) -> bool:
    """A MatMul reads `tensor` (as its first input) directly or through Cast/Where/IsNaN-like elementwise steps."""
    for node in tensor.outputs:
        if node.op == "MatMul" and node.inputs[0] is tensor:
            return True
        if hops and node.op in ("Cast", "Where", "Identity", "Dropout") and \
                any(_reaches_probs_matmul(out, hops - 1) for out in node.outputs):
            return True
    return False


def remaining_attention(graph: gs.Graph) -> list[str]:
    """Names of Softmax nodes that still look like attention (for the final check)."""
    return [node.name for node in graph.nodes if node.op == "Softmax" and looks_like_attention(graph, node)]


# what the pass reads, for the one line of a refusal
SUPPORTED = ("MatMul(q, k^T) -> Mul|Div(scalar)? -> Add(mask)? -> Softmax -> Where(IsNaN)? -> MatMul(probs, v), "
             "k^T a Transpose or Reshape -> Transpose -> Reshape of k, q and k^T optionally scaled, in the 4-D "
             "(Hugging Face) or grouped 5-D (fdpp export) layout")
