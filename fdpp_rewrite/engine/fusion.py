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
