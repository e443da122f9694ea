"""RoPE of q and k and the two KV-cache writes of a layer -> one fdpp::RopeAppend (runs after the attention pass).

Two forms, from each fdpp::AsyncSoftmaxAttention, with rotate() the rotary chains of passes/rope_match.py:

  * with caches, as `fdpp_rewrite export` writes it (fdpp_rewrite/onnx_builder.py rotate() and attention()):
        key = ScatterND(key_cache.i, indices, rotate(k)), value = ScatterND(value_cache.i, indices, v),
        query = rotate(q)
    ==> query_out, key_cache_out.i, value_cache_out.i = RopeAppend(q, k, v, key_cache.i, value_cache.i, past_len,
                                                                  inv_freq)
    The rope-free form (OPT: the two ScatterNDs only) becomes RopeAppend with rope_dim 0.
  * without caches, as torch.onnx.export writes a transformers prefill (use_cache=False; positions 0..S-1 from the
    graph's own cache_position Range):
        key = rotate(k), value = v, query = rotate(q)
    ==> query_out, key, value_out = RopeAppend(q, k, v, k, v, past_len = 0, inv_freq): the "caches" are k and v
    themselves, every row of which the op writes, so its outputs are rotate(q), rotate(k) and v.

inv_freq is read from the graph's own rotary table constant, so any rope scaling the exporter baked in is kept.
Structure finds the candidates; evaluating the scatter indices and the cos/sin tables (for a few past_len values,
or from the input shapes alone without caches) proves that they are the contract's positions past_len[b] + s before
anything is replaced. A transformers decode-with-cache graph (key = Concat(past_key_values.i.key, rotate(k))) is
left as is with the reason (HF_CACHE_CONCAT).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from fdpp_rewrite.contracts import DOMAIN, load_contract
from fdpp_rewrite.onnx_graph import widen_bfloat16, widened_dtype
from fdpp_rewrite.passes.common import (PAST_LEN_INPUT, NameMaker, PassReport, ancestors, is_constant, producer_op,
                                        rank, static_dim)
from fdpp_rewrite.passes.rope_match import Rotation, inv_freq_of, match_rotation, same_rotation
from fdpp_rewrite.passes.support import dtypes_of, unsupported

OP = "RopeAppend"
LEFT = "RoPE and cache writes of attention"  # what a report line names when a layer's are left as is
SHAPE_ONLY_OPS = ("Shape", "Size")
TABLE_ATOL = 2e-3  # cos/sin tables may be rounded to float16 by the export (half an ulp at 1.0 is 4.9e-4)
PREFILL_BATCH = 2  # the batch the tables of a cache-free graph are evaluated at
HF_CACHE_CONCAT = ("the cache is Concat(past, rotated k): its rows are past + s in every sequence, while the rotary "
                   "positions come from the graph's own inputs (position_ids), per sequence; RopeAppend writes "
                   "each token at its position past_len[b] + s, so it cannot express both")


@dataclass
class RopeMatch:
    attention: gs.Node
    query: gs.Tensor          # q before RoPE
    query_out: gs.Tensor | None  # the rotated q the attention reads (None: rope-free, a new tensor is made)
    k_new: gs.Tensor
    v_new: gs.Tensor
    key_scatter: gs.Node | None    # None: no caches (the op writes k and v themselves)
    value_scatter: gs.Node | None
    rotation: Rotation | None

    @property
    def cached(self) -> bool:
        return self.key_scatter is not None


# --- proving the positions: evaluate indices and tables for a few past_len values ----------------------------

def evaluate(graph: gs.Graph, targets: list, values: list[dict], symbols: dict | None = None) -> list | None:
    """[values of targets] for each {input name: array} in `values`, or None where the subgraph cannot be evaluated
    from those inputs' values and the shapes of the others alone (symbolic dims: batch = the first array's length,
    then `symbols`, then 3, 4, ...)."""
    import onnxruntime as ort

    fed = set(values[0])
    if not fed <= {t.name for t in graph.inputs}:
        return None
    graph_inputs = {t.name for t in graph.inputs}
    shape_fed, value_fed = set(), set()
    for target in targets:
        nodes, sources = ancestors(target, stop_ops=SHAPE_ONLY_OPS)
        value_fed |= {t.name for t in sources if t.name in graph_inputs}
        shape_fed |= {n.inputs[0].name for n in nodes if n.op in SHAPE_ONLY_OPS and not is_constant(n.inputs[0])}
    if not value_fed <= fed:
        return None
    first = next(iter(values[0].values()), np.zeros(PREFILL_BATCH))
    symbols = {"batch": len(first), **(symbols or {})}
    sub = graph.copy()
    tensors = sub.tensors()
    feeds = {}
    for name in sorted(shape_fed - fed):
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
        feeds[name] = np.zeros(shape, dtype=widened_dtype(tensor.dtype))
    sub.inputs = [tensors[name] for name in sorted(fed)] + [tensors[name] for name in sorted(feeds)]
    sub.outputs = [tensors[t.name] for t in targets]
    sub.cleanup()
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4  # a subgraph that cannot be evaluated is an answer here, not an error
        sub_model = widen_bfloat16(gs.export_onnx(sub, do_type_check=False))  # onnxruntime's CPU lacks bfloat16
        session = ort.InferenceSession(sub_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return [session.run(None, {**feeds, **value}) for value in values]
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
    """cos/sin broadcast over heads: [B, 1, S, R] (halves repeated) or [B, 1, S, R/2, 1] (interleaved); a batch of 1
    (broadcast over the batch) where every sequence has the same past_len."""
    cos, sin = np.asarray(cos, np.float32), np.asarray(sin, np.float32)
    if cos.shape != sin.shape or cos.ndim != (5 if interleaved else 4):
        return False
    if cos.shape[0] == 1 and len(past) > 1 and np.all(past == past[0]):
        past = past[:1]
    if cos.shape[0] != len(past):
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

def _rotations(query: gs.Tensor, k_side: gs.Tensor) -> tuple[Rotation | None, Rotation | None] | str:
    k_rotation, q_rotation = match_rotation(k_side), match_rotation(query)
    if (k_rotation is None) != (q_rotation is None):
        return "only one of q and k goes through the rotary embedding"
    if k_rotation is not None and not same_rotation(k_rotation, q_rotation):
        return "q and k are rotated with different tables"
    return q_rotation, k_rotation


def _cache_free(graph: gs.Graph, attention: gs.Node) -> RopeMatch | str | None:
    """The cache-free form (a transformers prefill): the attention reads rotate(q) and rotate(k) themselves."""
    query, key, value = attention.inputs[:3]
    concat = producer_op(key, "Concat")
    if concat is not None and len(concat.inputs) == 2 and match_rotation(concat.inputs[1]) is not None:
        return HF_CACHE_CONCAT
    if rank(key) != 4 or rank(value) != 4 or match_rotation(key) is None:  # k from elsewhere (a cache?) or rope-free
        return None
    found = _rotations(query, key)
    if isinstance(found, str):
        return found
    q_rotation, k_rotation = found
    return RopeMatch(attention, q_rotation.source, query, k_rotation.source, value, None, None, k_rotation)


def match_layer(graph: gs.Graph, attention: gs.Node) -> RopeMatch | str | None:
    """The RoPE (+ cache writes) feeding this attention node; None when there is nothing the op would fuse."""
    query, key, value = attention.inputs[:3]
    key_scatter, value_scatter = producer_op(key, "ScatterND"), producer_op(value, "ScatterND")
    if key_scatter is None and value_scatter is None:
        return _cache_free(graph, attention)
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
    found = _rotations(query, k_side)
    if isinstance(found, str):
        return found
    q_rotation, k_rotation = found
    if k_rotation is not None:
        return RopeMatch(attention, q_rotation.source, query, k_rotation.source, v_new, key_scatter, value_scatter,
                         k_rotation)
    return RopeMatch(attention, query, None, k_side, v_new, key_scatter, value_scatter, None)


def _proven_cache_free(graph: gs.Graph, rotation: Rotation, inv_freq) -> str | None:
    """None when the tables, evaluated from the input shapes alone, are cos/sin(s * inv_freq); else why not."""
    results = evaluate(graph, [rotation.cos, rotation.sin], [{}])
    if results is None:
        return "the rotary tables cannot be evaluated from the input shapes alone (positions from an input's values)"
    cos, sin = (np.asarray(table) for table in results[0])
    if cos.ndim < 3 or cos.shape[2] < 2 or not _tables_follow_positions(
            cos, sin, np.zeros(PREFILL_BATCH, np.int64), inv_freq, rotation.interleaved):
        return "the cos/sin tables are not cos/sin(s * inv_freq) over the sequence"
    return None


def _proven(graph: gs.Graph, match: RopeMatch, inv_freq, cache: dict) -> str | None:
    """None when the indices (and tables) follow past_len + s (without caches: the tables follow s); else why
    not."""
    rotation = match.rotation
    if not match.cached:
        key = (rotation.cos.name, rotation.sin.name)
        if key not in cache:
            cache[key] = _proven_cache_free(graph, rotation, inv_freq)
        return cache[key]
    indices = match.key_scatter.inputs[1]
    key = (indices.name,) + ((rotation.cos.name, rotation.sin.name) if rotation else ())
    if key not in cache:
        past_values = _past_values(graph)
        targets = [indices] + ([rotation.cos, rotation.sin] if rotation else [])
        results = evaluate(graph, targets, [{PAST_LEN_INPUT: np.asarray(v, np.int64)} for v in past_values])
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
    if any(m.cached for m in matches) and past_len is None:
        report.warnings.append(f"the graph has no '{PAST_LEN_INPUT}' input; RoPE and cache writes left as is")
        matches = [m for m in matches if not m.cached]
    proofs, tables, zeros = {}, {}, {}
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
        if match.cached:
            _replace(graph, match, attrs, past_len, tables[table_key], names)
            report.replaced["rope" if rotation else "append_only"] += 1
        else:
            _replace_cache_free(graph, match, attrs, _zero_past(graph, match.query, zeros, names), tables[table_key],
                                names)
            report.replaced["rope_prefill"] += 1
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


def _zero_past(graph, like: gs.Tensor, cache: dict, names: NameMaker) -> gs.Tensor:
    """past_len = 0 for every sequence: [B] zeros, B read from `like` [B, ...] (one per graph)."""
    if "past" not in cache:
        shape, batch, past = (gs.Variable(names(n), dtype=np.int64) for n in ("shape", "batch", "past_len"))
        past.shape = [like.shape[0] if like.shape else None]
        graph.nodes += [
            gs.Node("Shape", name=names("shape"), inputs=[like], outputs=[shape]),
            gs.Node("Gather", name=names("batch"), attrs={"axis": 0},
                    inputs=[shape, gs.Constant(names("batch_axis"), np.array([0], np.int64))], outputs=[batch]),
            gs.Node("Expand", name=names("zeros"), inputs=[gs.Constant(names("zero"), np.zeros(1, np.int64)), batch],
                    outputs=[past])]
        cache["past"] = past
    return cache["past"]


def _replace_cache_free(graph, match: RopeMatch, attrs, past_len, inv_freq, names: NameMaker) -> None:
    """The op writes every row of k and v (positions 0..S-1): its cache outputs are rotate(k) and v."""
    key_out = match.attention.inputs[1]
    value_out = gs.Variable(names("value_out"), dtype=match.v_new.dtype, shape=match.v_new.shape)
    match.attention.inputs[2] = value_out
    outputs = [match.query_out, key_out, value_out]
    for tensor in outputs:
        tensor.inputs.clear()  # disconnects the rotation; cleanup() removes it
    inputs = [match.query, match.k_new, match.v_new, match.k_new, match.v_new, past_len, inv_freq]
    graph.nodes.append(gs.Node(OP, name=names("rope_append"), domain=DOMAIN, attrs=attrs, inputs=inputs,
                               outputs=outputs))
