"""RoPE of q and k and the two KV-cache writes of a layer -> one fdpp::RopeAppend (runs after the attention pass).

Pattern, from each fdpp::AsyncSoftmaxAttention whose key and value are ScatterND writes into cache inputs, as
`fdpp_rewrite export` writes it (fdpp_rewrite/onnx_builder.py rotate() and attention()):

    key   = ScatterND(key_cache.i,   indices, rotate(k))      value = ScatterND(value_cache.i, indices, v)
    query = rotate(q)
    rotate(x), pairs (j, j + R/2):  Add(Mul(x, cos), Mul(Concat(Neg(x1), x0), sin)), x0, x1 = Split(x, [R/2, R/2])
    rotate(x), pairs (2j, 2j + 1):  Reshape(Concat(Sub(Mul(x0, cos), Mul(x1, sin)), Add(Mul(x1, cos), Mul(x0, sin))))
                                    with x0, x1 = Split(Reshape(x, [.., R/2, 2]), [1, 1])
    partial rotary (R < D):         Concat(rotate(Slice(x, 0, R)), Slice(x, R, D))
    cos / sin = Unsqueeze(Cast?(Cos / Sin(angles))), angles = Concat?(Mul(float(positions), inv_freq))
    ==> query_out, key_cache_out.i, value_cache_out.i = RopeAppend(q, k, v, key_cache.i, value_cache.i, past_len,
                                                                  inv_freq)

inv_freq is read from the graph's own rotary table constant, so any rope scaling the exporter baked in is kept.
The rope-free form (OPT: the two ScatterNDs only) becomes RopeAppend with rope_dim 0. Structure finds the
candidates; evaluating the scatter indices and the cos/sin tables for a few past_len values proves that they
are the contract's positions past_len[b] + s before anything is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from fdpp_rewrite.contracts import DOMAIN, load_contract
from fdpp_rewrite.passes.common import (PAST_LEN_INPUT, NameMaker, PassReport, ancestors, constant_value, is_constant,
                                        is_standard, producer, rank, static_dim)
from fdpp_rewrite.passes.support import dtypes_of, unsupported

OP = "RopeAppend"
LEFT = "RoPE and cache writes of attention"  # what a report line names when a layer's are left as is
SHAPE_ONLY_OPS = ("Shape", "Size")
TABLE_ATOL = 2e-3  # cos/sin tables may be rounded to float16 by the export (half an ulp at 1.0 is 4.9e-4)


@dataclass
class Rotation:
    source: gs.Tensor  # x before RoPE
    cos: gs.Tensor
    sin: gs.Tensor
    rope_dim: int
    interleaved: bool


@dataclass
class RopeMatch:
    attention: gs.Node
    query: gs.Tensor          # q before RoPE
    query_out: gs.Tensor | None  # the rotated q the attention reads (None: rope-free, a new tensor is made)
    k_new: gs.Tensor
    v_new: gs.Tensor
    key_scatter: gs.Node
    value_scatter: gs.Node
    rotation: Rotation | None


def _op(tensor: gs.Tensor, *ops: str) -> gs.Node | None:
    node = producer(tensor)
    return node if node is not None and node.op in ops and is_standard(node) else None


def _ints(tensor: gs.Tensor) -> list | None:
    value = constant_value(tensor)
    return None if value is None else [int(v) for v in value.reshape(-1)]


def _last_axis(node: gs.Node, tensor_rank: int | None) -> bool:
    axis = node.attrs.get("axis", 0)
    return axis == -1 or (tensor_rank is not None and axis == tensor_rank - 1)


def _mul_by(tensor: gs.Tensor, data: gs.Tensor) -> gs.Tensor | None:
    """If tensor = Mul(data, t) or Mul(t, data): t, else None."""
    node = _op(tensor, "Mul")
    if node is None:
        return None
    a, b = node.inputs
    return b if a is data else a if b is data else None


def _split_halves(tensor: gs.Tensor, outputs: int = 2) -> gs.Node | None:
    split = _op(tensor, "Split")
    if split is None or len(split.outputs) != outputs or not _last_axis(split, rank(split.inputs[0])):
        return None
    return split


def _rotate_half(rotated: gs.Tensor):
    """Pairs (j, j + R/2): (x_rot, cos, sin, R) or None."""
    add = _op(rotated, "Add")
    if add is None:
        return None
    for cos_side, sin_side in (add.inputs, add.inputs[::-1]):
        cos_mul, sin_mul = _op(cos_side, "Mul"), _op(sin_side, "Mul")
        if cos_mul is None or sin_mul is None:
            continue
        for turned, sin in (sin_mul.inputs, sin_mul.inputs[::-1]):
            concat = _op(turned, "Concat")
            if concat is None or len(concat.inputs) != 2 or not _last_axis(concat, rank(turned)):
                continue
            neg = _op(concat.inputs[0], "Neg")
            split = None if neg is None else _split_halves(neg.inputs[0])
            if split is None or neg.inputs[0] is not split.outputs[1] or concat.inputs[1] is not split.outputs[0]:
                continue
            x_rot = split.inputs[0]
            cos = _mul_by(cos_side, x_rot)
            sizes = _ints(split.inputs[1]) if len(split.inputs) > 1 else None
            if cos is None or sizes is None or len(sizes) != 2 or sizes[0] != sizes[1]:
                continue
            return x_rot, cos, sin, 2 * sizes[0]
    return None


def _rotate_pairs(rotated: gs.Tensor):
    """Pairs (2j, 2j + 1): (x_rot, cos, sin, R) or None."""
    reshape = _op(rotated, "Reshape")
    concat = None if reshape is None else _op(reshape.inputs[0], "Concat")
    if concat is None or len(concat.inputs) != 2:
        return None
    sub, add = _op(concat.inputs[0], "Sub"), _op(concat.inputs[1], "Add")
    first = None if sub is None else _op(sub.inputs[0], "Mul")
    if add is None or first is None:
        return None
    for x0 in first.inputs:
        split = _split_halves(x0)
        if split is None or x0 is not split.outputs[0]:
            continue
        x1 = split.outputs[1]
        cos, sin = _mul_by(sub.inputs[0], x0), _mul_by(sub.inputs[1], x1)
        if cos is None or sin is None:
            continue
        a, b = add.inputs
        if not any(_mul_by(t1, x1) is cos and _mul_by(t0, x0) is sin for t1, t0 in ((a, b), (b, a))):
            continue
        pairs = _op(split.inputs[0], "Reshape")
        target = None if pairs is None else _ints(pairs.inputs[1])
        if target is None or len(target) != 5 or target[-1] != 2:
            continue
        return pairs.inputs[0], cos, sin, 2 * target[3]
    return None


def match_rotation(tensor: gs.Tensor) -> Rotation | None:
    """The RoPE chain that produces `tensor`, or None."""
    head_dim = static_dim(tensor, -1)
    concat = _op(tensor, "Concat")
    candidates = [(tensor, None)]
    if concat is not None and len(concat.inputs) == 2 and _last_axis(concat, rank(tensor)):
        candidates.insert(0, (concat.inputs[0], concat.inputs[1]))  # partial rotary: (rotated, passed through)
    for rotated, passed in candidates:
        for interleaved, core in ((False, _rotate_half), (True, _rotate_pairs)):
            found = core(rotated)
            if found is None:
                continue
            x_rot, cos, sin, rope_dim = found
            if passed is None:
                if head_dim is not None and rope_dim != head_dim:
                    continue
                return Rotation(x_rot, cos, sin, rope_dim, interleaved)
            rot_slice, pass_slice = _op(x_rot, "Slice"), _op(passed, "Slice")
            if rot_slice is None or pass_slice is None or rot_slice.inputs[0] is not pass_slice.inputs[0]:
                continue
            source = rot_slice.inputs[0]
            bounds = [_ints(t) for t in rot_slice.inputs[1:4] + pass_slice.inputs[1:4]]
            dim = static_dim(source, -1)
            if len(bounds) != 6 or any(b is None for b in bounds) or bounds[:3] != [[0], [rope_dim], [-1]] \
                    or bounds[3] != [rope_dim] or bounds[5] != [-1] or (dim is not None and bounds[4] != [dim]):
                continue
            return Rotation(source, cos, sin, rope_dim, interleaved)
    return None


def inv_freq_of(rotation: Rotation) -> np.ndarray | None:
    """The rotary table constant behind cos: Unsqueeze(Cast?(Cos(Concat?(Mul(positions, inv_freq)))))."""
    tensor = rotation.cos
    while _op(tensor, "Unsqueeze", "Cast") is not None:
        tensor = producer(tensor).inputs[0]
    cos = _op(tensor, "Cos")
    if cos is None:
        return None
    angles = cos.inputs[0]
    concat = _op(angles, "Concat")
    if concat is not None and len(concat.inputs) == 2 and concat.inputs[0] is concat.inputs[1]:
        angles = concat.inputs[0]
    mul = _op(angles, "Mul")
    if mul is None:
        return None
    for operand in mul.inputs:
        if is_constant(operand):
            value = constant_value(operand)
            if value is not None and value.dtype == np.float32 and value.size == rotation.rope_dim // 2:
                return value.reshape(-1).copy()
    return None


# --- proving the positions: evaluate indices and tables for a few past_len values ----------------------------

def _evaluate(graph: gs.Graph, targets: list, past_values: list) -> list | None:
    """[values of targets] for each past_len value in past_values (arrays [B]), or None where the subgraph
    cannot be evaluated from past_len and the shapes of other inputs alone."""
    import onnxruntime as ort

    past = next((t for t in graph.inputs if t.name == PAST_LEN_INPUT), None)
    if past is None:
        return None
    graph_inputs = {t.name for t in graph.inputs}
    shape_fed, value_fed = set(), set()
    for target in targets:
        nodes, sources = ancestors(target, stop_ops=SHAPE_ONLY_OPS)
        value_fed |= {t.name for t in sources if t.name in graph_inputs}
        shape_fed |= {n.inputs[0].name for n in nodes if n.op in SHAPE_ONLY_OPS and not is_constant(n.inputs[0])}
    if not value_fed <= {PAST_LEN_INPUT}:
        return None
    symbols = {"batch": len(past_values[0])}
    sub = graph.copy()
    tensors = sub.tensors()
    feeds = {}
    for name in sorted(shape_fed - {PAST_LEN_INPUT}):
        tensor = tensors[name]
        if tensor.shape is None or tensor.dtype is None:
            return None
        shape = []
        for dim in tensor.shape:
            if isinstance(dim, str):
                symbols.setdefault(dim, 3 + len(symbols))
                shape.append(symbols[dim])
            elif dim is None:
                return None
            else:
                shape.append(int(dim))
        tensor.inputs.clear()
        feeds[name] = np.zeros(shape, dtype=np.dtype(tensor.dtype))
    sub.inputs = [tensors[PAST_LEN_INPUT]] + [tensors[name] for name in sorted(feeds)]
    sub.outputs = [tensors[t.name] for t in targets]
    sub.cleanup()
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4  # a subgraph that cannot be evaluated is an answer here, not an error
        session = ort.InferenceSession(gs.export_onnx(sub, do_type_check=False).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        return [session.run(None, {**feeds, PAST_LEN_INPUT: np.asarray(v, np.int64)}) for v in past_values]
    except Exception:  # noqa: BLE001 - any failure to evaluate means "not proven": the layer is left alone
        return None


def _past_values(graph: gs.Graph) -> list:
    past = next(t for t in graph.inputs if t.name == PAST_LEN_INPUT)
    batch = static_dim(past, 0) or 2
    return [np.arange(batch, dtype=np.int64) * 5 + 1, np.arange(batch, dtype=np.int64)[::-1] * 3]


def _indices_follow_positions(values: np.ndarray, past: np.ndarray, kv_heads: int) -> bool:
    """indices [B, Hkv, S, 3] == (b, h, past[b] + s)."""
    if values.ndim != 4 or values.shape[:2] != (len(past), kv_heads) or values.shape[3] != 3:
        return False
    batch, _, seq, _ = values.shape
    b, h, s = np.meshgrid(np.arange(batch), np.arange(kv_heads), np.arange(seq), indexing="ij")
    return bool(np.array_equal(values, np.stack([b, h, past[:, None, None] + s], axis=-1)))


def _tables_follow_positions(cos: np.ndarray, sin: np.ndarray, past: np.ndarray, inv_freq: np.ndarray,
                             interleaved: bool) -> bool:
    """cos/sin broadcast over heads: [B, 1, S, R] (halves repeated) or [B, 1, S, R/2, 1] (interleaved)."""
    cos, sin = np.asarray(cos, np.float32), np.asarray(sin, np.float32)
    if cos.shape != sin.shape or cos.ndim != (5 if interleaved else 4) or cos.shape[0] != len(past):
        return False
    seq = cos.shape[2]
    angles = (past[:, None] + np.arange(seq)[None, :]).astype(np.float32)[:, :, None] * inv_freq  # [B, S, R/2]
    if interleaved:
        want_cos, want_sin = np.cos(angles)[:, None, :, :, None], np.sin(angles)[:, None, :, :, None]
    else:
        want_cos = np.concatenate([np.cos(angles)] * 2, axis=-1)[:, None]
        want_sin = np.concatenate([np.sin(angles)] * 2, axis=-1)[:, None]
    return cos.shape == want_cos.shape and bool(np.allclose(cos, want_cos, atol=TABLE_ATOL, rtol=0)
                                                 and np.allclose(sin, want_sin, atol=TABLE_ATOL, rtol=0))


# --- matching a layer ------------------------------------------------------------------------------------------

def match_layer(graph: gs.Graph, attention: gs.Node) -> RopeMatch | str | None:
    """The RoPE + cache writes feeding this attention node; None when its key/value are not cache writes."""
    query, key, value = attention.inputs[:3]
    key_scatter, value_scatter = _op(key, "ScatterND"), _op(value, "ScatterND")
    if key_scatter is None and value_scatter is None:
        return None
    if key_scatter is None or value_scatter is None:
        return "only one of key and value is a ScatterND cache write"
    graph_inputs = set(id(t) for t in graph.inputs)
    for scatter in (key_scatter, value_scatter):
        if id(scatter.inputs[0]) not in graph_inputs or rank(scatter.inputs[0]) != 4:
            return f"ScatterND '{scatter.name}' does not write into a [B, Hkv, C, D] cache input"
        if scatter.attrs.get("reduction", "none") != "none":
            return f"ScatterND '{scatter.name}' has reduction {scatter.attrs['reduction']!r}"
    if key_scatter.inputs[1] is not value_scatter.inputs[1]:
        return "the key and value cache writes use different indices"
    k_side, v_new = key_scatter.inputs[2], value_scatter.inputs[2]
    k_rotation, q_rotation = match_rotation(k_side), match_rotation(query)
    if (k_rotation is None) != (q_rotation is None):
        return "only one of q and k goes through the rotary embedding"
    if k_rotation is not None:
        if (k_rotation.cos is not q_rotation.cos or k_rotation.sin is not q_rotation.sin
                or (k_rotation.rope_dim, k_rotation.interleaved) != (q_rotation.rope_dim, q_rotation.interleaved)):
            return "q and k are rotated with different tables"
        return RopeMatch(attention, q_rotation.source, query, k_rotation.source, v_new, key_scatter, value_scatter,
                         k_rotation)
    return RopeMatch(attention, query, None, k_side, v_new, key_scatter, value_scatter, None)


def _proven(graph: gs.Graph, match: RopeMatch, inv_freq, cache: dict) -> str | None:
    """None when the indices (and tables) follow past_len + s; else why not."""
    indices = match.key_scatter.inputs[1]
    rotation = match.rotation
    key = (indices.name,) + ((rotation.cos.name, rotation.sin.name) if rotation else ())
    if key not in cache:
        past_values = _past_values(graph)
        targets = [indices] + ([rotation.cos, rotation.sin] if rotation else [])
        results = _evaluate(graph, targets, past_values)
        kv_heads = match.attention.attrs["num_kv_heads"]
        if results is None:
            cache[key] = "the scatter indices or rotary tables cannot be evaluated from past_len"
        elif not all(_indices_follow_positions(r[0], p, kv_heads) for r, p in zip(results, past_values)):
            cache[key] = "the scatter indices are not (b, h, past_len[b] + s)"
        elif rotation and not all(_tables_follow_positions(r[1], r[2], p, inv_freq, rotation.interleaved)
                                  for r, p in zip(results, past_values)):
            cache[key] = "the cos/sin tables are not cos/sin((past_len[b] + s) * inv_freq)"
        else:
            cache[key] = None
    return cache[key]


def run(graph: gs.Graph) -> PassReport:
    """Replace the RoPE and cache writes of every attention layer that has them."""
    report = PassReport("rope_append")
    contract = load_contract(OP)
    names = NameMaker(graph, "fdpp_rope_append")
    past_len = next((t for t in graph.inputs if t.name == PAST_LEN_INPUT), None)
    graph.toposort()
    matches = []
    for node in graph.nodes:
        if node.domain != DOMAIN or node.op != "AsyncSoftmaxAttention":
            continue
        found = match_layer(graph, node)
        if isinstance(found, str):
            report.leave(LEFT, node.name, found)
        elif found is not None:
            matches.append(found)
    if matches and past_len is None:
        report.warnings.append(f"the graph has no '{PAST_LEN_INPUT}' input; RoPE and cache writes left as is")
        return report
    proofs, tables = {}, {}
    for match in matches:
        rotation = match.rotation
        inv_freq = np.zeros(0, np.float32)
        if rotation is not None:
            inv_freq = inv_freq_of(rotation)
            if inv_freq is None:
                report.leave(LEFT, match.attention.name, "the rotary angles are not Mul(positions, a float32 "
                                                         "inv_freq constant)")
                continue
        why_not = _proven(graph, match, inv_freq, proofs)
        if why_not:
            report.leave(LEFT, match.attention.name, why_not)
            continue
        attrs = {name: match.attention.attrs[name] for name in ("num_heads", "num_kv_heads", "head_dim")}
        attrs.update(rope_dim=rotation.rope_dim if rotation else 0, interleaved=int(bool(rotation and
                                                                                        rotation.interleaved)))
        why_not = unsupported(OP, attrs, dtypes_of(query=match.query))
        if why_not:
            report.leave(LEFT, match.attention.name, why_not)
            continue
        attrs = contract.validate_attributes(attrs, where=f"attention '{match.attention.name}'")
        table_key = inv_freq.tobytes()
        if table_key not in tables:
            tables[table_key] = gs.Constant(names("inv_freq"), inv_freq)
        _replace(graph, match, attrs, past_len, tables[table_key], names)
        report.replaced["rope" if rotation else "append_only"] += 1
    graph.cleanup().toposort()
    return report


def _replace(graph, match: RopeMatch, attrs, past_len, inv_freq, names: NameMaker) -> None:
    query_out = match.query_out
    if query_out is None:  # rope-free: the attention reads the op's copy of q
        query_out = gs.Variable(names("query_out"), dtype=match.query.dtype, shape=match.query.shape)
        match.attention.inputs[0] = query_out
    outputs = [query_out, match.key_scatter.outputs[0], match.value_scatter.outputs[0]]
    for tensor in outputs:
        tensor.inputs.clear()  # disconnects the rotation and the ScatterNDs; cleanup() removes them
    inputs = [match.query, match.k_new, match.v_new, match.key_scatter.inputs[0], match.value_scatter.inputs[0],
              past_len, inv_freq]
    graph.nodes.append(gs.Node(OP, name=names("rope_append"), domain=DOMAIN, attrs=attrs, inputs=inputs,
                               outputs=outputs))
