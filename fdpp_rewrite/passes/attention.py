"""Pass 1: softmax attention chains -> fdpp::AsyncSoftmaxAttention.

Pattern (matched from each Softmax, by structure only; Cast/Identity/Dropout nodes anywhere on the chain are
absorbed, the op computes in float32 whatever the casts did):

    scores = MatMul(q, k^T) -> Mul|Div(scalar)? -> Add(mask)? -> Softmax(last axis) -> NaN guard?
    out    = MatMul(probs, v)

where
  * k^T is a Transpose of k (any perm: the op reads k = Transpose(source, the perm with its last two entries
    swapped), e.g. TorchScript's [0, 2, 3, 1] on the [B, L, H, D] view), or the dynamo exporter's
    Reshape([X, L, D]) -> Transpose(last two) -> Reshape(k's leading dims + [D, L]), proven from the shapes;
  * q and k^T may each be multiplied (or divided) by a scalar first (torch's SDPA applies sqrt(scale) to both):
    every such factor is folded into the op's scale;
  * the NaN guard is Where(IsNaN(p), 0, p) on the probabilities (a fully masked row; the op gives 0 there too).

in two layouts:
  * grouped 5-D (our exporter): q5 = Reshape(q [B,Hq,S,D]) -> [B,Hkv,G,S,D], k5/v5 = Unsqueeze(cache, 2),
    out = Reshape(MatMul(...)) -> [B,Hq,S,D];
  * 4-D (Hugging Face): q [B,Hq,S,D], k/v [B,H,L,D], where a repeat_kv (Unsqueeze -> Expand -> Reshape) of k/v
    is absorbed so the op reads the Hkv heads directly.

The mask becomes mask_mode "past_len" (4th input: the graph input past_len) when its values come from
past_len alone and evaluating it agrees with the contract's causal rule; otherwise "bias" (4th input: the mask
itself), or "none" without a mask. Hugging Face graphs build their mask in-graph from the 2-D attention_mask
(padding) and the causal rule, and add it as Where(mask, 0, finfo.min): that is a "bias" (padding is not a
past_len rule), and a fully padded query row, which the original averages over nothing, gives 0 in the op.
phi and the guard per layer come from a calibration file, else the defaults below.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fdpp_rewrite.contracts import DOMAIN, attention_guard, load_contract
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.passes.common import (NameMaker, PassReport, ancestors, collect_matches, constant_value, dtype_name,
                                        is_constant, is_standard, producer, producer_op, rank, scalar_value,
                                        skip_backward, skip_forward, sole_consumer, static_dim)
from fdpp_rewrite.schemas import CALIBRATION_SCHEMA

OP = "AsyncSoftmaxAttention"
# the exported graph's input name (the export contract, fdpp_rewrite/onnx_builder.py), not an exporter-made node name
PAST_LEN_INPUT = "past_len"
SHAPE_ONLY_OPS = ("Shape", "Size")  # their output depends on the input's shape, never on its values
NOT_FROM_MATMUL = "the scores do not come from a MatMul read only by this softmax chain"

# Defaults when no calibration is given: the contract's attribute defaults, phi = 0 with the guard [-60, 10].
# They are safe for any score range:
#  - a visible s - phi above 10 sends the row to the exact fallback, so every exponent the fast path takes is
#    at most e^10 = 22026: it fits float16 (max 65504) if a kernel keeps P in half precision, and a float32
#    sum over 2^20 keys stays below 2.4e10 (x |v| <= 65504: 1.5e15, far under float32's 3.4e38);
#  - a visible s - phi below -60 also falls back, so every kept exponent is >= e^-60 = 8.8e-27, a normal
#    float32 (smallest normal 1.2e-38): no row can underflow to a zero denominator.
# Calibration narrows this to where real scores live (paper: Llama2-7B scores in [-16.8, 6.5]) so that
# the fallback is rare; without it, rows whose max score exceeds 10 simply take the exact path.
_GUARD = attention_guard()
DEFAULT_PHI, DEFAULT_GUARD_LO, DEFAULT_GUARD_HI = _GUARD.phi, _GUARD.lo, _GUARD.hi


@dataclass(frozen=True)
class SoftmaxSettings:
    phi: float
    guard_lo: float
    guard_hi: float
    softmax: str = "unified"  # "synchronized": calibrate found no phi that covers this layer's scores


SOFTMAX_CHOICES = tuple(load_contract(OP).attributes["softmax"]["choices"])
DEFAULT_SETTINGS = SoftmaxSettings(DEFAULT_PHI, DEFAULT_GUARD_LO, DEFAULT_GUARD_HI)


def load_calibration(path) -> list[SoftmaxSettings]:
    """Per-layer phi and guards from a `fdpp_rewrite calibrate` file, in graph order."""
    path = Path(path)
    if not path.is_file():
        raise FdppError(f"no calibration file at {path}; run `python -m fdpp_rewrite calibrate` or omit --calibration")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FdppError(f"calibration {path} is not valid JSON ({exc}); re-run calibrate") from exc
    if (not isinstance(data, dict) or data.get("schema") != CALIBRATION_SCHEMA
            or not isinstance(data.get("layers"), list)):
        raise FdppError(f"calibration {path} is not a '{CALIBRATION_SCHEMA}' file with a 'layers' list; "
                        "re-run `python -m fdpp_rewrite calibrate`")
    layers = sorted(data["layers"], key=lambda entry: entry.get("layer", -1) if isinstance(entry, dict) else -1)
    settings = []
    for position, entry in enumerate(layers):
        try:
            if entry["layer"] != position:
                raise ValueError(f"layer numbers must be 0..{len(layers) - 1}, found {entry['layer']}")
            values = SoftmaxSettings(float(entry["phi"]), float(entry["guard_lo"]), float(entry["guard_hi"]),
                                     entry.get("softmax", "unified"))
            if values.softmax not in SOFTMAX_CHOICES:
                raise ValueError(f"softmax must be one of {', '.join(SOFTMAX_CHOICES)}, found {values.softmax!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise FdppError(f"calibration {path}: layer entry {position} is invalid ({exc}); re-run calibrate") from exc
        if not all(math.isfinite(v) for v in (values.phi, values.guard_lo, values.guard_hi)):
            raise FdppError(f"calibration {path}: layer {position} has a non-finite value; re-run calibrate")
        settings.append(values)
    return settings


@dataclass
class AttentionMatch:
    softmax: gs.Node
    output: gs.Tensor      # the tensor the op will produce ([B, Hq, S, D])
    query: gs.Tensor       # [B, Hq, S, D]
    key: gs.Tensor         # [B, Hkv, L, D]
    value: gs.Tensor
    mask: gs.Tensor | None
    mask_rank5: bool       # the mask was written for the grouped 5-D scores
    scale: float
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layout: str            # "grouped-5d" | "4d"
    key_perm: list | None = None  # the op's key is Transpose(key, key_perm) (made by the pass), or key itself


# --- matching -----------------------------------------------------------------------------------------------

def _unsqueeze_axes(node: gs.Node) -> list[int] | None:
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if len(node.inputs) > 1:
        value = constant_value(node.inputs[1])
        return None if value is None else [int(a) for a in np.ravel(value)]
    return None


def _is_unsqueeze_at(node: gs.Node | None, axis: int, out_rank: int) -> bool:
    axes = None if node is None else _unsqueeze_axes(node)
    return axes is not None and len(axes) == 1 and axes[0] % out_rank == axis


def _scalar_factor(node: gs.Node | None) -> tuple[float, gs.Tensor] | None:
    """(factor, x) when `node` is Mul(x, c), Mul(c, x) or Div(x, c) with a scalar constant c != 0."""
    if node is None or node.op not in ("Mul", "Div") or not is_standard(node):
        return None
    constants = [scalar_value(t) for t in node.inputs]
    if node.op == "Mul" and constants[1] is not None and not is_constant(node.inputs[0]):
        return constants[1], node.inputs[0]
    if node.op == "Mul" and constants[0] is not None and not is_constant(node.inputs[1]):
        return constants[0], node.inputs[1]
    if node.op == "Div" and constants[1] not in (None, 0.0) and not is_constant(node.inputs[0]):
        return 1.0 / constants[1], node.inputs[0]
    return None


def strip_scalar_factors(graph: gs.Graph, tensor: gs.Tensor) -> tuple[float, gs.Tensor]:
    """Walk up through Mul/Div-by-scalar nodes (and casts) whose output only the chain reads; returns the product
    of their factors and the tensor above them, e.g. (sqrt(1/sqrt(D)), q) for Mul(q, D^-1/4)."""
    factor = 1.0
    while True:
        above, _ = skip_backward(graph, tensor)
        found = _scalar_factor(producer(above))
        if found is None or sole_consumer(graph, above) is None:
            return factor, tensor
        factor *= found[0]
        tensor = found[1]


def _scores_matmul(graph: gs.Graph, tensor: gs.Tensor):
    """From a tensor above the softmax, walk up through an optional scale to MatMul(q, k^T).
    Returns (scale, matmul) or a reason string."""
    tensor, _ = skip_backward(graph, tensor)
    scale = 1.0
    node = producer(tensor)
    if node is not None and node.op in ("Mul", "Div") and sole_consumer(graph, tensor) is not None:
        found = _scalar_factor(node)
        if found is None:
            return f"the scores are scaled by a {node.op} that is not by a scalar constant"
        scale, tensor = found
        tensor, _ = skip_backward(graph, tensor)
        node = producer(tensor)
    if node is None or node.op != "MatMul" or sole_consumer(graph, tensor) is None:
        return NOT_FROM_MATMUL
    if any(is_constant(t) for t in node.inputs):
        return "the scores MatMul multiplies by a constant (not queries x keys)"
    return scale, node


def _canonical_symbol(dim: str) -> str:
    """'seq + past' and 'past + seq' name one size (shape inference writes sums in either order)."""
    terms = [term.strip() for term in dim.split("+")]
    return " + ".join(sorted(terms)) if all(term.isidentifier() for term in terms) else dim


def _same_dim(a, b) -> bool:
    """Two dims known to be equal: the same int, or the same symbol (never an inference placeholder)."""
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        return int(a) == int(b) and a >= 0
    return (isinstance(a, str) and isinstance(b, str) and not a.startswith("unk__")
            and _canonical_symbol(a) == _canonical_symbol(b))


def _same_dims(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(_same_dim(x, y) for x, y in zip(a, b))


def _composed_transpose(graph: gs.Graph, tensor: gs.Tensor):
    """(source, perm) when `tensor` = Transpose(...Transpose(source)) through single-reader Transposes, the perms
    composed into one; None if `tensor` is not a Transpose output."""
    node = producer_op(tensor, "Transpose")
    if node is None or "perm" not in node.attrs:
        return None
    perm = list(node.attrs["perm"])
    source = node.inputs[0]
    inner = producer_op(source, "Transpose")
    while inner is not None and "perm" in inner.attrs and sole_consumer(graph, source) is not None:
        inner_perm = list(inner.attrs["perm"])
        perm = [inner_perm[axis] for axis in perm]  # out[i] = source[perm[i]], source[j] = above[inner_perm[j]]
        source = inner.inputs[0]
        inner = producer_op(source, "Transpose")
    return source, perm


def _swap_last_two(perm: list) -> list:
    return perm[:-2] + [perm[-1], perm[-2]]


def untransposed_key(graph: gs.Graph, tensor: gs.Tensor):
    """What k^T (the scores MatMul's second input) is the transpose of: (k, None) for a tensor k of the graph, or
    (source, perm) when k = Transpose(source, perm) must be made; None when the chain is not provably k^T."""
    transposed = _composed_transpose(graph, tensor)
    if transposed is not None:
        source, perm = transposed
        if len(perm) < 2:
            return None
        wanted = _swap_last_two(perm)  # Transpose(source, perm) == swap_last_two(Transpose(source, wanted))
        return (source, None) if wanted == list(range(len(perm))) else (source, wanted)
    return _key_through_reshapes(graph, tensor)


def _key_through_reshapes(graph: gs.Graph, tensor: gs.Tensor):
    """The dynamo exporter's k^T: Reshape(k [*lead, L, D] -> [X, L, D]) -> Transpose(last two) ->
    Reshape(-> [*lead, D, L]). The first Reshape only merges leading axes (it keeps the last two), the Transpose
    swaps the last two, the second only splits the leading axis back into k's: together, k with its last two
    axes swapped. Every dim must be known for that proof."""
    split = producer_op(tensor, "Reshape")
    if split is None or sole_consumer(graph, split.inputs[0]) is None:
        return None
    transposed = _composed_transpose(graph, split.inputs[0])
    if transposed is None:
        return None
    merged, perm = transposed
    merge = producer_op(merged, "Reshape")
    if merge is None or sole_consumer(graph, merged) is None or len(perm) < 2:
        return None
    if perm != _swap_last_two(list(range(len(perm)))):
        return None
    key = merge.inputs[0]
    k_shape, merged_shape, out_shape = key.shape, merged.shape, tensor.shape
    if k_shape is None or merged_shape is None or out_shape is None or len(k_shape) < 2 or len(merged_shape) < 2:
        return None
    if not _same_dims(list(merged_shape[-2:]), list(k_shape[-2:])):
        return None  # the first Reshape changes the last two axes: not a merge of the leading ones
    if not _same_dims(list(out_shape), list(k_shape[:-2]) + [k_shape[-1], k_shape[-2]]):
        return None  # the second Reshape does not give k's leading axes back
    return key, None


def _repeat_kv_source(tensor: gs.Tensor):
    """Hugging Face's repeat_kv: Reshape(Expand(Unsqueeze(x, 2), [B, Hkv, G, L, D]), [B, Hkv*G, L, D]).
    Returns (x, G or None) or None when `tensor` is not built that way."""
    reshape = producer_op(tensor, "Reshape")
    expand = None if reshape is None else producer_op(reshape.inputs[0], "Expand")
    if expand is None:
        return None
    unsqueeze = producer_op(expand.inputs[0], "Unsqueeze")
    if not _is_unsqueeze_at(unsqueeze, 2, 5):
        return None
    target = constant_value(expand.inputs[1])
    groups = int(target[2]) if target is not None and target.size == 5 and target[2] > 0 else None
    return unsqueeze.inputs[0], groups


def _first_known(*values):
    for value in values:
        if value is not None and value > 0:
            return int(value)
    return None


def match_attention(graph: gs.Graph, softmax: gs.Node):
    """An AttentionMatch for the chain around `softmax`, or a one-line reason why it is not one."""
    data = softmax.inputs[0]
    axis, data_rank = softmax.attrs.get("axis", -1), rank(data)
    if axis != -1 and (data_rank is None or axis != data_rank - 1):
        return f"softmax over axis {axis}, not the last axis"

    # upward: [Add(mask)] <- [Mul|Div(scale)] <- MatMul(q, k^T)
    top, _ = skip_backward(graph, data)
    mask = None
    add = producer(top)
    if add is not None and add.op == "Add" and sole_consumer(graph, top) is not None:
        found, reasons = None, []
        for side in (0, 1):
            attempt = _scores_matmul(graph, add.inputs[side])
            if not isinstance(attempt, str):
                found, mask = attempt, add.inputs[1 - side]
                break
            reasons.append(attempt)
        if found is None:
            specific = [r for r in reasons if r != NOT_FROM_MATMUL]
            return specific[0] if specific else ("neither side of the Add before the softmax comes from a MatMul of "
                                                 "queries and keys read only by this chain")
    else:
        found = _scores_matmul(graph, top)
        if isinstance(found, str):
            return found
    scale, qk = found

    # downward: probs -> [NaN guard] -> MatMul(probs, v)
    probs = _through_nan_guard(graph, skip_forward(graph, softmax.outputs[0])[0])
    probs, _ = skip_forward(graph, probs)
    pv = sole_consumer(graph, probs)
    if pv is None or pv.op != "MatMul" or pv.inputs[0] is not probs:
        readers = len(probs.outputs)
        return f"the probabilities feed {readers} node(s), not one MatMul(probs, v) (attention weights used elsewhere?)"

    # sqrt(scale) on q and on k^T (torch's SDPA), or any scalar factor on either side, joins the op's scale
    q_factor, query_side = strip_scalar_factors(graph, qk.inputs[0])
    k_factor, key_transposed = strip_scalar_factors(graph, qk.inputs[1])
    untransposed = untransposed_key(graph, key_transposed)
    if untransposed is None:
        return ("the keys enter the scores MatMul neither through a Transpose nor through a Reshape -> Transpose -> "
                "Reshape chain that provably swaps their last two axes")
    key_side, key_perm = untransposed
    if key_perm is None:  # a factor applied to k before its transpose
        inner_factor, key_side = strip_scalar_factors(graph, key_side)
        k_factor *= inner_factor
    scale = scale * q_factor * k_factor
    if not scale > 0:
        return f"the scores are scaled by {scale}, not a positive number"
    value_side = pv.inputs[1]
    scores_rank = rank(qk.outputs[0]) or rank(key_side) or rank(query_side)

    if scores_rank == 5:
        if key_perm is not None:
            return "grouped 5-D scores whose keys are a transposed view, not Unsqueeze(axis 2) of the caches"
        return _match_grouped(graph, softmax, qk, pv, query_side, key_side, value_side, mask, scale)
    if scores_rank == 4:
        return _match_4d(softmax, pv, query_side, key_side, key_perm, value_side, mask, scale)
    return f"the scores have rank {scores_rank}, expected 4 (Hugging Face layout) or 5 (grouped layout)"


def is_nan_guard(graph: gs.Graph, where: gs.Node, probs: gs.Tensor) -> bool:
    """Where(IsNaN(probs), 0, probs): what the dynamo exporter puts after SDPA's softmax for fully masked rows."""
    if where.op != "Where" or not is_standard(where) or len(where.inputs) != 3 or where.inputs[2] is not probs:
        return False
    isnan = producer_op(where.inputs[0], "IsNaN")
    zero = constant_value(where.inputs[1])
    return (isnan is not None and isnan.inputs[0] is probs and sole_consumer(graph, where.inputs[0]) is where
            and zero is not None and zero.size == 1 and float(zero.reshape(())) == 0.0)


def _through_nan_guard(graph: gs.Graph, probs: gs.Tensor) -> gs.Tensor:
    """The guard's output when `probs` is read by exactly a NaN guard (IsNaN + Where), else `probs`."""
    readers = list(probs.outputs)
    if probs in graph.outputs or len(readers) != 2:
        return probs
    where = next((n for n in readers if n.op == "Where"), None)
    if where is None or not is_nan_guard(graph, where, probs):
        return probs
    return where.outputs[0]


def _match_grouped(graph, softmax, qk, pv, query_side, key_side, value_side, mask, scale):
    q_reshape = producer_op(query_side, "Reshape")
    k_unsq, v_unsq = producer_op(key_side, "Unsqueeze"), producer_op(value_side, "Unsqueeze")
    out_reshape = sole_consumer(graph, pv.outputs[0])
    if q_reshape is None or not _is_unsqueeze_at(k_unsq, 2, 5) or not _is_unsqueeze_at(v_unsq, 2, 5):
        return "grouped 5-D scores whose q is not a Reshape or whose k/v are not Unsqueeze(axis 2) of the caches"
    if out_reshape is None or out_reshape.op != "Reshape":
        return "grouped 5-D attention whose output is not reshaped back to [B, Hq, S, D]"
    query, key, value = q_reshape.inputs[0], k_unsq.inputs[0], v_unsq.inputs[0]
    target = constant_value(q_reshape.inputs[1])
    target = target if target is not None and target.size == 5 else np.zeros(5, np.int64)
    kv_heads = _first_known(static_dim(key, 1), static_dim(query_side, 1), target[1])
    groups = _first_known(static_dim(query_side, 2), target[2])
    head_dim = _first_known(static_dim(key, 3), static_dim(query, 3), static_dim(query_side, 4), target[4])
    heads = _first_known(static_dim(query, 1), kv_heads * groups if kv_heads and groups else None)
    return _finish(softmax, out_reshape.outputs[0], query, key, value, mask, True, scale, heads, kv_heads,
                   head_dim, "grouped-5d")


def _match_4d(softmax, pv, query, key_side, key_perm, value_side, mask, scale):
    key, value, groups = key_side, value_side, None
    repeated_k, repeated_v = (None if key_perm else _repeat_kv_source(key_side)), _repeat_kv_source(value_side)
    if (repeated_k is None) != (repeated_v is None):
        return "only one of k and v goes through repeat_kv"
    if repeated_k is not None:
        (key, groups), (value, _) = repeated_k, repeated_v
    key_shape = _permuted_shape(key, key_perm)
    kv_heads = _first_known(_dim(key_shape, 1))
    heads = _first_known(static_dim(query, 1), _dim(_permuted_shape(key_side, key_perm), 1),
                         kv_heads * groups if kv_heads and groups else None)
    if repeated_k is None and kv_heads is None:
        kv_heads = heads
    head_dim = _first_known(static_dim(query, 3), _dim(key_shape, 3))
    return _finish(softmax, pv.outputs[0], query, key, value, mask, False, scale, heads, kv_heads, head_dim, "4d",
                   key_perm)


def _permuted_shape(tensor: gs.Tensor, perm: list | None):
    if tensor.shape is None or perm is None:
        return tensor.shape
    return [tensor.shape[axis] for axis in perm] if len(perm) == len(tensor.shape) else None


def _dim(shape, axis: int) -> int | None:
    if shape is None or not -len(shape) <= axis < len(shape):
        return None
    dim = shape[axis]
    return int(dim) if isinstance(dim, (int, np.integer)) and dim >= 0 else None


def _finish(softmax, output, query, key, value, mask, mask_rank5, scale, heads, kv_heads, head_dim, layout,
            key_perm=None):
    if not (heads and kv_heads and head_dim):
        return (f"could not determine the head counts / head_dim ({heads}, {kv_heads}, {head_dim}) from shapes; "
                "export with static head dimensions")
    if heads % kv_heads:
        return f"{heads} query heads are not a multiple of {kv_heads} KV heads"
    for tensor, expected in ((query, 4), (key, 4), (value, 4)):
        if rank(tensor) not in (None, expected):
            return f"'{tensor.name}' has rank {rank(tensor)}, expected {expected}"
    return AttentionMatch(softmax=softmax, output=output, query=query, key=key, value=value, mask=mask,
                          mask_rank5=mask_rank5, scale=float(scale), num_heads=heads, num_kv_heads=kv_heads,
                          head_dim=head_dim, layout=layout, key_perm=key_perm)


# --- the mask: past_len or bias -----------------------------------------------------------------------------

def _symbol_values(graph: gs.Graph) -> dict:
    """Concrete sizes for symbolic dims when evaluating a mask: distinct, with later ones larger, so a cache
    length named after the sequence length comes out longer (2, 3, 11, 13, ...)."""
    values, pool = {}, [2, 3, 11, 13, 17, 19, 23, 29]
    tensors = list(graph.inputs) + list(graph.tensors().values())
    for tensor in tensors:
        for dim in tensor.shape or ():
            if isinstance(dim, str) and dim not in values:
                values[dim] = pool[len(values)] if len(values) < len(pool) else 31 + len(values)
    return values


def _mask_follows_past_len(graph: gs.Graph, mask: gs.Tensor, past_len: gs.Tensor) -> bool:
    """Evaluate the mask's subgraph for a few past_len values and check the contract's causal rule:
    0 where key j <= past_len[b] + i, at or below the masked threshold elsewhere."""
    import onnxruntime as ort

    threshold = load_contract(OP).raw["bias_mask_threshold"]
    nodes, _ = ancestors(mask, stop_ops=SHAPE_ONLY_OPS)
    shape_fed = {n.inputs[0].name for n in nodes if n.op in SHAPE_ONLY_OPS and not is_constant(n.inputs[0])}
    symbols = _symbol_values(graph)
    sub = graph.copy()
    tensors = sub.tensors()
    feeds = {}
    for name in sorted(shape_fed):
        tensor = tensors[name]
        if tensor.shape is None or tensor.dtype is None or any(d is None for d in tensor.shape):
            return False
        shape = [symbols[d] if isinstance(d, str) else int(d) for d in tensor.shape]
        tensor.inputs.clear()
        feeds[name] = np.zeros(shape, dtype=np.dtype(tensor.dtype))
    sub_past = tensors[past_len.name]
    sub.inputs = [sub_past] + [tensors[name] for name in sorted(shape_fed) if name != past_len.name]
    sub.outputs = [tensors[mask.name]]
    sub.cleanup()
    batch_dim = (past_len.shape or [None])[0]
    batch = symbols.get(batch_dim, batch_dim) if batch_dim is not None else 2
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4  # a mask that cannot be evaluated is an answer here, not an error to log
        session = ort.InferenceSession(gs.export_onnx(sub, do_type_check=False).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        probe = session.run(None, {**feeds, past_len.name: np.zeros(batch, np.int64)})[0]
        seq, kv_len = probe.shape[-2], probe.shape[-1]
        if seq < 2 or kv_len <= seq:
            return False  # the evaluation would not exercise the causal structure
        most = kv_len - seq
        for past in (np.linspace(most, 0, batch).astype(np.int64), np.linspace(0, most, batch).astype(np.int64)):
            values = session.run(None, {**feeds, past_len.name: past})[0].astype(np.float64)
            values = values.reshape(values.shape[0], -1, seq, kv_len)
            if values.shape[1] != 1 or values.shape[0] not in (1, batch):
                return False
            visible = np.arange(kv_len)[None, None, :] <= (past[:, None] + np.arange(seq)[None, :])[:, :, None]
            values = np.broadcast_to(values[:, 0], visible.shape)
            if not (np.all(values[visible] == 0.0) and np.all(values[~visible] <= threshold)):
                return False
    except Exception:  # noqa: BLE001 - any failure to evaluate means "not proven": the bias form is used
        return False
    return True


def _mask_mode(graph: gs.Graph, mask: gs.Tensor | None, cache: dict, report: PassReport) -> str:
    if mask is None:
        return "none"
    if mask.name in cache:
        return cache[mask.name]
    _, sources = ancestors(mask, stop_ops=SHAPE_ONLY_OPS)
    graph_inputs = {t.name for t in graph.inputs}
    value_inputs = {t.name for t in sources if t.name in graph_inputs}
    past_len = next((t for t in graph.inputs if t.name == PAST_LEN_INPUT), None)
    mode = "bias"
    if value_inputs == {PAST_LEN_INPUT}:
        if _mask_follows_past_len(graph, mask, past_len):
            mode = "past_len"
        else:
            report.near_misses.append(f"mask '{mask.name}' is computed from past_len but does not follow the causal "
                                      "rule j <= past_len + i (a sliding window?); passed to the op as a bias")
    cache[mask.name] = mode
    return mode


def _bias_input(graph: gs.Graph, match: AttentionMatch, names: NameMaker, cache: dict):
    """The mask as the op's bias input: [.., S, L] broadcastable to [B, 1, S, L], in the query dtype."""
    key = (match.mask.name, match.mask_rank5)
    if key in cache:
        return cache[key]
    bias = match.mask
    mask_rank = rank(bias)
    if match.mask_rank5 and mask_rank == 5:
        if static_dim(bias, 1) != 1 or static_dim(bias, 2) != 1:
            return "the 5-D mask varies per head; the op takes one bias per sequence [B, 1, S, L]"
        squeezed = gs.Variable(names("bias"), dtype=bias.dtype,
                               shape=[bias.shape[0], 1, bias.shape[3], bias.shape[4]])
        axes = gs.Constant(names("squeeze_axes"), np.array([2], np.int64))
        graph.nodes.append(gs.Node("Squeeze", name=names("squeeze"), inputs=[bias, axes], outputs=[squeezed]))
        bias = squeezed
    elif mask_rank is None or mask_rank > 4 or (mask_rank == 4 and static_dim(bias, 1) != 1):
        return f"the mask has shape {bias.shape}; the op takes a bias broadcastable to [B, 1, S, L]"
    if _dtypes_differ(bias, match.query):
        cast = gs.Variable(names("bias_cast"), dtype=match.query.dtype, shape=bias.shape)
        to = _onnx_dtype(match.query)
        graph.nodes.append(gs.Node("Cast", name=names("cast"), attrs={"to": to}, inputs=[bias], outputs=[cast]))
        bias = cast
    cache[key] = bias
    return bias


# --- the pass -----------------------------------------------------------------------------------------------

def run(graph: gs.Graph, calibration: list[SoftmaxSettings] | None = None) -> PassReport:
    """Replace every attention chain it can prove; the chains it cannot are near misses in the report (the
    rewrite decides whether that is an error)."""
    report = PassReport("attention")
    contract = load_contract(OP)
    matches = collect_matches(graph, "Softmax", match_attention, report)
    if not matches and calibration is None:
        return report
    if calibration is not None and len(calibration) != len(matches):
        raise FdppError(f"the calibration has {len(calibration)} layers but the graph has {len(matches)} attention "
                        "layers; calibrate this model (`python -m fdpp_rewrite calibrate`)")

    names = NameMaker(graph, "fdpp_attention")
    mode_cache, bias_cache = {}, {}
    past_len = next((t for t in graph.inputs if t.name == PAST_LEN_INPUT), None)
    for layer, match in enumerate(matches):
        settings = calibration[layer] if calibration is not None else DEFAULT_SETTINGS
        mode = _mask_mode(graph, match.mask, mode_cache, report)
        fourth = []
        if mode == "past_len":
            fourth = [past_len]
        elif mode == "bias":
            bias = _bias_input(graph, match, names, bias_cache)
            if isinstance(bias, str):
                report.near_misses.append(f"Softmax '{match.softmax.name}' left as is: {bias}")
                continue
            fourth = [bias]
        attrs = contract.validate_attributes(
            {"scale": match.scale, "phi": settings.phi, "guard_lo": settings.guard_lo, "guard_hi": settings.guard_hi,
             "mask_mode": mode, "num_heads": match.num_heads, "num_kv_heads": match.num_kv_heads,
             "head_dim": match.head_dim, "softmax": settings.softmax}, where=f"layer {layer}")
        if attrs["softmax"] == "unified":
            del attrs["softmax"]  # the default: unified nodes stay as before (readers without the attribute agree)
        else:
            report.notes.append(f"layer {layer}: softmax={attrs['softmax']} (the calibration's verdict)")
        _replace(graph, match, attrs, fourth, names)
        report.replaced[f"{match.layout}/{mode}"] += 1
    if calibration is None:
        report.notes.append(f"phi={DEFAULT_PHI}, guard [{DEFAULT_GUARD_LO}, {DEFAULT_GUARD_HI}] (defaults; "
                            "--calibration sets them per layer)")
    graph.cleanup().toposort()
    return report


def _dtypes_differ(a: gs.Tensor, b: gs.Tensor) -> bool:
    return a.dtype is not None and b.dtype is not None and dtype_name(a) != dtype_name(b)


def _onnx_dtype(tensor: gs.Tensor) -> int:
    name = dtype_name(tensor)
    return onnx.TensorProto.BFLOAT16 if name == "bfloat16" else onnx.helper.np_dtype_to_tensor_dtype(np.dtype(name))


def _replace(graph, match: AttentionMatch, attrs: dict, fourth: list, names: NameMaker) -> None:
    output = match.output
    output.inputs.clear()  # disconnects the old chain; cleanup() removes it
    op_output = output
    if _dtypes_differ(match.query, output):  # e.g. a chain that ended in a Cast: the op answers in q's dtype
        op_output = gs.Variable(names("output"), dtype=match.query.dtype, shape=output.shape)
        to = _onnx_dtype(output)
        graph.nodes.append(gs.Node("Cast", name=names("cast"), attrs={"to": to}, inputs=[op_output], outputs=[output]))
    key = match.key
    if match.key_perm is not None:  # k^T was one Transpose of another layout: the op reads k in [B, Hkv, L, D]
        key = gs.Variable(names("key"), dtype=match.key.dtype, shape=_permuted_shape(match.key, match.key_perm))
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
    for _ in range(6):  # Cast / Add(mask) / Mul|Div(scale) / Where between the scores and the softmax
        next_frontier = []
        for tensor in frontier:
            node = producer(tensor)
            if node is None:
                continue
            if node.op == "MatMul" and not any(is_constant(t) for t in node.inputs):
                return True
            if node.op in ("Cast", "Add", "Mul", "Div", "Where", "Identity", "Dropout"):
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


def describe(match: AttentionMatch) -> str:
    return (f"{match.layout}: Hq={match.num_heads} Hkv={match.num_kv_heads} D={match.head_dim} scale={match.scale:.6g}"
            f" dtype={dtype_name(match.query)}")
