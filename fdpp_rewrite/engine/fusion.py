"""Glue fusions the build applies to the plan's node list (so a decode step launches fewer kernels).

fuse_rms_norm: the exporter's RMSNorm chain

    [Cast(x, float)] -> Mul(x32, x32) -> ReduceMean(-1) -> Add(eps) -> Sqrt -> Div(x32, .) -> [Cast(dtype)]
    -> Mul(., weight)

becomes one fdpp::RMSNorm(x, weight; epsilon) node (the op another part adds to the rewriter; when the rewriter
already emitted it there is nothing to match). A chain whose inner values feed anything outside it is left as
it is. Example: tiny-llama has 5 chains (2 per layer and the final norm), all fused.
"""

from __future__ import annotations

import numpy as np


def _index(nodes):
    producer, consumers = {}, {}
    for node in nodes:
        for name in node["outputs"]:
            producer[name] = node
        for name in node["inputs"]:
            consumers.setdefault(name, []).append(node)
    return producer, consumers


def _sole(consumers, name, op):
    users = consumers.get(name, [])
    return users[0] if len(users) == 1 and users[0]["op"] == op and not users[0]["domain"] else None


def _scalar(arrays, name):
    a = arrays.get(name)
    return float(np.asarray(a).reshape(-1)[0]) if a is not None and np.asarray(a).size == 1 else None


def _axes(node, arrays):
    if "axes" in node["attrs"]:
        return list(node["attrs"]["axes"])
    if len(node["inputs"]) > 1 and node["inputs"][1] in arrays:
        return [int(v) for v in np.asarray(arrays[node["inputs"][1]]).reshape(-1)]
    return None


def _match(reduce, producer, consumers, arrays, outputs):
    """The chain around one ReduceMean: (nodes to remove, x, weight, epsilon, output) or None."""
    square = producer.get(reduce["inputs"][0])
    if square is None or square["op"] != "Mul" or square["inputs"][0] != square["inputs"][1]:
        return None
    if _axes(reduce, arrays) != [-1] or reduce["attrs"].get("keepdims", 1) != 1:
        return None
    x32 = square["inputs"][0]
    add = _sole(consumers, reduce["outputs"][0], "Add")
    if add is None:
        return None
    eps = _scalar(arrays, add["inputs"][1] if add["inputs"][0] == reduce["outputs"][0] else add["inputs"][0])
    sqrt = _sole(consumers, add["outputs"][0], "Sqrt")
    div = sqrt and _sole(consumers, sqrt["outputs"][0], "Div")
    if eps is None or div is None or div["inputs"] != [x32, sqrt["outputs"][0]]:
        return None
    chain = [square, reduce, add, sqrt, div]
    last = div
    cast_out = _sole(consumers, div["outputs"][0], "Cast")
    if cast_out is not None:
        chain.append(cast_out)
        last = cast_out
    scale = _sole(consumers, last["outputs"][0], "Mul")
    if scale is None:
        return None
    weight = next((n for n in scale["inputs"] if n != last["outputs"][0]), None)
    if weight not in arrays or np.asarray(arrays[weight]).ndim != 1:
        return None
    chain.append(scale)
    x = x32
    cast_in = producer.get(x32)
    if cast_in is not None and cast_in["op"] == "Cast" and not cast_in["domain"]:
        if {id(n) for n in consumers.get(x32, [])} <= {id(square), id(div)}:
            chain.append(cast_in)
            x = cast_in["inputs"][0]
    elif cast_out is not None:
        return None  # a Cast back without a Cast in: not the exporter's chain
    inner = [name for node in chain if node is not scale for name in node["outputs"]]
    if any(name in outputs for name in inner):
        return None
    chain_ids = {id(n) for n in chain}
    if any(id(user) not in chain_ids for name in inner for user in consumers.get(name, [])):
        return None
    return chain, x, weight, eps, scale["outputs"][0]


def fuse_rms_norm(plan: dict, arrays: dict) -> int:
    """Replace every RMSNorm chain of plan["nodes"] with fdpp::RMSNorm; returns how many were fused."""
    nodes = plan["nodes"]
    producer, consumers = _index(nodes)
    outputs = set(plan["outputs"])
    removed, replacement = set(), {}
    count = 0
    for node in nodes:
        if node["op"] != "ReduceMean" or node["domain"] or id(node) in removed:
            continue
        found = _match(node, producer, consumers, arrays, outputs)
        if found is None:
            continue
        chain, x, weight, eps, out = found
        removed.update(id(n) for n in chain)
        scale = next(n for n in chain if n["outputs"][0] == out)  # the chain's last node: the fused op goes there
        replacement[id(scale)] = {"name": f"engine_fusion/rms_norm_{count}", "op": "RMSNorm", "domain": "fdpp",
                                  "inputs": [x, weight], "outputs": [out], "attrs": {"epsilon": eps}}
        count += 1
    plan["nodes"] = [replacement.get(id(n), n) for n in nodes if id(n) in replacement or id(n) not in removed]
    return count


# ---- RoPE + cache append ------------------------------------------------------------------------------------

def _through(producer, name, ops):
    """Walk up from `name` through single-input nodes of the given op types; the first node of another type."""
    node = producer.get(name)
    while node is not None and node["op"] in ops and not node["domain"]:
        node = producer.get(node["inputs"][0])
    return node


def _match_rotate(name, producer):
    """The exporter's full-width, half-split RoPE of x ending in `name`:
    Add(Mul(x, cos), Mul(Concat(Neg(x1), x0), sin)) with x0, x1 = Split(x, [D/2, D/2], axis -1).
    Returns (x, cos, sin, nodes) or None."""
    add = producer.get(name)
    if add is None or add["op"] != "Add" or add["domain"]:
        return None
    mul_cos, mul_sin = (producer.get(n) for n in add["inputs"])
    if not (mul_cos and mul_sin and mul_cos["op"] == "Mul" and mul_sin["op"] == "Mul"):
        return None
    x, cos = mul_cos["inputs"]
    concat = producer.get(mul_sin["inputs"][0])
    sin = mul_sin["inputs"][1]
    if concat is None or concat["op"] != "Concat" or concat["attrs"].get("axis") != -1 or len(concat["inputs"]) != 2:
        return None
    neg = producer.get(concat["inputs"][0])
    split = producer.get(concat["inputs"][1])
    if neg is None or neg["op"] != "Neg" or split is None or split["op"] != "Split" or split["inputs"][0] != x:
        return None
    if split["attrs"].get("axis") != -1 or split["outputs"] != [concat["inputs"][1], neg["inputs"][0]]:
        return None
    return x, cos, sin, [add, mul_cos, mul_sin, concat, neg, split]


def _inv_freq(producer, cos, arrays):
    """The inverse frequencies behind a cos table: Unsqueeze([Cast](Cos(Concat(a, a)))), a = Mul(pos, inv_freq)."""
    node = _through(producer, cos, ("Unsqueeze", "Cast"))
    if node is None or node["op"] != "Cos":
        return None
    concat = producer.get(node["inputs"][0])
    if concat is None or concat["op"] != "Concat" or len(set(concat["inputs"])) != 1 or len(concat["inputs"]) != 2:
        return None
    angles = producer.get(concat["inputs"][0])
    if angles is None or angles["op"] != "Mul":
        return None
    return next((n for n in angles["inputs"] if n in arrays and np.asarray(arrays[n]).ndim == 1), None)


def rope_theta_of(inv_freq) -> float:
    """theta when inv_freq[j] = theta^(-2j / R) (plain RoPE), else 0 (a scaled variant). Example: R = 64,
    theta = 10000 -> inv_freq[1] = 10000^(-1/32)."""
    inv = np.asarray(inv_freq, dtype=np.float64)
    if inv.size < 2 or inv[0] != 1.0 or not 0 < inv[1] < 1:
        return 0.0
    rope_dim = 2 * inv.size
    theta = float(f"{inv[1] ** (-rope_dim / 2):.6g}")  # float32 tables: 10000.003 is 10000
    expected = theta ** (-np.arange(0, rope_dim, 2) / rope_dim)
    return theta if np.allclose(inv, expected, rtol=1e-5) else 0.0


def fuse_rope_append(plan: dict, arrays: dict) -> int:
    """Replace, per attention, RoPE on q and k plus the two ScatterND cache writes with one fdpp::RopeAppend
    (query, k_new, v_new, key_cache, value_cache, past_len, inv_freq) -> (query_out, key_cache_out,
    value_cache_out), the caches written in place. Only the exporter's full-width half-split RoPE is matched
    (interleaved or partial RoPE keeps its standard ops). Run prune() after it: the tables and scatter
    indices it leaves unused go. Returns how many attentions were fused."""
    nodes = plan["nodes"]
    producer, consumers = _index(nodes)
    graph_inputs = set(plan["inputs"])
    removed, before = set(), {}
    count = 0
    for attention in nodes:
        if attention["domain"] != "fdpp" or attention["op"] != "AsyncSoftmaxAttention":
            continue
        if attention["attrs"].get("mask_mode") != "past_len" or len(attention["inputs"]) < 4:
            continue
        q_rot, k_all, v_all, past_len = attention["inputs"][:4]
        scatter_k, scatter_v = producer.get(k_all), producer.get(v_all)
        if not all(s is not None and s["op"] == "ScatterND" and s["inputs"][0] in graph_inputs
                   for s in (scatter_k, scatter_v)):
            continue
        if scatter_k["inputs"][1] != scatter_v["inputs"][1] or past_len not in graph_inputs:
            continue
        rotate_q, rotate_k = _match_rotate(q_rot, producer), _match_rotate(scatter_k["inputs"][2], producer)
        if rotate_q is None or rotate_k is None or rotate_q[1:3] != rotate_k[1:3]:
            continue
        inv_freq = _inv_freq(producer, rotate_q[1], arrays)
        if inv_freq is None or 2 * np.asarray(arrays[inv_freq]).size != attention["attrs"].get("head_dim"):
            continue
        chain = rotate_q[3] + rotate_k[3] + [scatter_k, scatter_v]
        # the pre-RoPE q may be rotated in place: nothing outside the chain may read it or the chain's values
        inner = [n for node in chain for n in node["outputs"] if n not in (q_rot, k_all, v_all)] + [rotate_q[0]]
        chain_ids = {id(n) for n in chain}
        if any(id(user) not in chain_ids for name in inner for user in consumers.get(name, [])):
            continue
        removed.update(chain_ids)
        a = attention["attrs"]
        before[id(attention)] = {
            "name": f"engine_fusion/rope_append_{count}", "op": "RopeAppend", "domain": "fdpp",
            "inputs": [rotate_q[0], rotate_k[0], scatter_v["inputs"][2], scatter_k["inputs"][0],
                       scatter_v["inputs"][0], past_len, inv_freq],
            "outputs": [q_rot, k_all, v_all],
            "attrs": {"rope_dim": int(a["head_dim"]), "interleaved": 0, "num_heads": int(a["num_heads"]),
                      "num_kv_heads": int(a["num_kv_heads"]), "head_dim": int(a["head_dim"]),
                      "rope_theta": rope_theta_of(arrays[inv_freq])}}
        count += 1
    fused = []
    for node in nodes:
        if id(node) in before:
            fused.append(before[id(node)])
        if id(node) not in removed:
            fused.append(node)
    plan["nodes"] = fused
    return count
