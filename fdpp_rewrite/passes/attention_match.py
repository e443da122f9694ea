"""The attention pattern of pass 1 (passes/attention.py): from a Softmax, by structure only, an AttentionMatch
(q, k, v, mask, scale, head counts, layout) or a one-line reason why the chain is not one. Cast/Identity/Dropout
nodes anywhere on the chain are absorbed; the op computes in float32 whatever the casts did.

    scores = MatMul(q, k^T) -> Mul|Div(scalar)? -> soft cap? -> Add(mask)? -> Softmax(last axis) -> NaN guard?
    out    = MatMul(probs, v)

where
  * k^T is a Transpose of k (any perm: the op reads k = Transpose(source, the perm with its last two entries
    swapped), e.g. TorchScript's [0, 2, 3, 1] on the [B, L, H, D] view), or the dynamo exporter's
    Reshape([X, L, D]) -> Transpose(last two) -> Reshape(k's leading dims + [D, L]), proven from the shapes;
  * q and k^T may each be multiplied (or divided) by a scalar first (torch's SDPA applies sqrt(scale) to both):
    every such factor is folded into the op's scale;
  * the NaN guard is Where(IsNaN(p), 0, p) on the probabilities (a fully masked row; the op gives 0 there too);
  * the soft cap is Gemma 2's cap * Tanh(s / cap): matched so the pass can say why it leaves the chain (or set
    the op's `softcap` once the contract has it).

in two layouts:
  * grouped 5-D (our exporter): q5 = Reshape(q [B,Hq,S,D]) -> [B,Hkv,G,S,D], k5/v5 = Unsqueeze(cache, 2),
    out = Reshape(MatMul(...)) -> [B,Hq,S,D];
  * 4-D (Hugging Face): q [B,Hq,S,D], k/v [B,H,L,D], where a repeat_kv (Unsqueeze -> Expand -> Reshape) of k/v
    is absorbed so the op reads the Hkv heads directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from fdpp_rewrite.passes.common import (constant_value, is_constant, is_standard, producer, producer_op, rank,
                                        scalar_value, skip_backward, skip_forward, sole_consumer, static_dim)

NOT_FROM_MATMUL = "the scores do not come from a MatMul read only by this softmax chain"


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
    softcap: float | None = None  # scores = softcap * tanh(scale * q.k / softcap) before the mask (Gemma 2)



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


def soft_cap(graph: gs.Graph, tensor: gs.Tensor) -> tuple[float, gs.Tensor] | None:
    """(cap, x) when `tensor` = cap * Tanh(x / cap) (Gemma 2's logit soft-capping: Mul(Tanh(Div(x, cap)), cap),
    the division possibly a Mul by 1/cap), every intermediate read only by the chain; else None."""
    tensor, _ = skip_backward(graph, tensor)
    outer = _scalar_factor(producer(tensor))
    if outer is None or sole_consumer(graph, tensor) is None:
        return None
    cap, capped = outer
    tanh = producer_op(capped, "Tanh")
    if tanh is None or sole_consumer(graph, capped) is None or sole_consumer(graph, tanh.inputs[0]) is None:
        return None
    inner = _scalar_factor(producer(tanh.inputs[0]))
    if inner is None or cap <= 0 or not np.isclose(inner[0] * cap, 1.0, rtol=1e-5):
        return None
    return cap, inner[1]


def _scores_matmul(graph: gs.Graph, tensor: gs.Tensor):
    """From a tensor above the softmax, walk up through an optional soft cap and an optional scale to
    MatMul(q, k^T). Returns (scale, matmul, cap or None) or a reason string."""
    capped = soft_cap(graph, tensor)
    cap = None
    if capped is not None:
        cap, tensor = capped
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
    return scale, node, cap


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
    scale, qk, cap = found

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
        found = _match_grouped(graph, softmax, qk, pv, query_side, key_side, value_side, mask, scale)
    elif scores_rank == 4:
        found = _match_4d(softmax, pv, query_side, key_side, key_perm, value_side, mask, scale)
    else:
        return f"the scores have rank {scores_rank}, expected 4 (Hugging Face layout) or 5 (grouped layout)"
    if isinstance(found, AttentionMatch):
        found.softcap = cap
    return found


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
    key_shape = permuted_shape(key, key_perm)
    kv_heads = _first_known(_dim(key_shape, 1))
    heads = _first_known(static_dim(query, 1), _dim(permuted_shape(key_side, key_perm), 1),
                         kv_heads * groups if kv_heads and groups else None)
    if repeated_k is None and kv_heads is None:
        kv_heads = heads
    head_dim = _first_known(static_dim(query, 3), _dim(key_shape, 3))
    return _finish(softmax, pv.outputs[0], query, key, value, mask, False, scale, heads, kv_heads, head_dim, "4d",
                   key_perm)


def permuted_shape(tensor: gs.Tensor, perm: list | None):
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

