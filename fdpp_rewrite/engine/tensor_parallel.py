"""Tensor parallelism at build time: shard a lowered plan over N ranks (the ranks run together: tp_group.py).

Sharding (Megatron-style, per layer): the qkv GEMM is split by output rows (each rank computes H/N query heads and
its KV heads: Hkv/N of them when N divides Hkv, else the one KV head its query heads read, replicated), the o GEMM
by input columns (the same heads); the MLP's up (or gate_up) GEMM by output rows, the down GEMM by input columns.
o and down then hold a partial sum on every rank: they get the attribute all_reduce=1 (the backend sums the ranks'
outputs after the GEMM), and only rank 0 keeps their bias and residual, so the sum adds each once. Embedding,
norms and the LM head are replicated. The head-count shapes inside the attention block (the qkv Split sizes, the
Reshape targets, the attention and RopeAppend attributes, the KV cache) are rewritten for the rank's heads.
The engine folder holds rank_0 ... rank_{N-1} (rank_folder_name).
"""

from __future__ import annotations

import numpy as np

from fdpp_rewrite.calibration.settings import attention_nodes
from fdpp_rewrite.errors import FdppError

TP_SIZES = (1, 2, 4, 8)


def rank_folder_name(rank: int) -> str:
    return f"rank_{rank}"


def _gemms(plan: dict) -> list:
    return [node for node in plan["nodes"] if node["domain"] == "fdpp" and node["op"] == "FlatGemm"]


def _layer_gemms(plan: dict) -> list:
    """[(attention node, qkv, o, up, down)] per layer: each attention's GEMMs in node order are qkv before it and
    o, up, down after it."""
    order = {id(node): index for index, node in enumerate(plan["nodes"])}
    gemms = _gemms(plan)
    layers = []
    for node in attention_nodes(plan["nodes"]):
        before = [g for g in gemms if order[id(g)] < order[id(node)]]
        after = [g for g in gemms if order[id(g)] > order[id(node)]]
        if not before or len(after) < 3:
            raise FdppError(f"cannot shard the graph: attention {node['name']} lacks its qkv, o and MLP GEMMs; "
                            "build it without --tensor-parallel")
        qkv, (o, up, down) = before[-1], after[:3]
        for gemm in (o, down):
            if gemm["attrs"].get("epilogue") != "residual":
                raise FdppError(f"cannot shard the graph: FlatGemm {gemm['name']} does not add the residual; "
                                "build it without --tensor-parallel")
        layers.append((node, qkv, o, up, down))
    if not layers or len(gemms) != 4 * len(layers) + 1:
        raise FdppError("cannot shard the graph: expected one fused qkv, o, up and down GEMM per layer and the LM "
                        "head; build it without --tensor-parallel")
    return layers


def check_tensor_parallel(plan: dict, size: int) -> None:
    """One-line errors for a size the model's heads or MLP width cannot be split into."""
    if size not in TP_SIZES:
        raise FdppError(f"--tensor-parallel must be one of {', '.join(map(str, TP_SIZES))}, got {size}")
    if plan["interface"] != "fdpp":
        raise FdppError("--tensor-parallel needs a graph from `fdpp_rewrite export` (a Hugging Face torch.onnx "
                        "export is not sharded); build it without --tensor-parallel")
    for attention, _, _, up, down in _layer_gemms(plan):
        heads, kv_heads = attention["attrs"]["num_heads"], attention["attrs"]["num_kv_heads"]
        if heads % size or (kv_heads % size if kv_heads >= size else size % kv_heads):
            raise FdppError(f"--tensor-parallel {size} does not divide the model's {heads} query heads and "
                            f"{kv_heads} KV heads; pick a size that divides the query heads (and the KV heads, or "
                            "that they divide)")


def _rows(weight: np.ndarray, ranges: list) -> np.ndarray:
    return np.concatenate([weight[start:stop] for start, stop in ranges], axis=0)


def _qkv_ranges(heads: int, kv_heads: int, dim: int, size: int, rank: int) -> tuple[list, int]:
    """Row ranges of rank's q, k and v in the fused qkv output, and its KV head count."""
    q_per = heads // size
    if kv_heads >= size:
        kv_per, kv_first = kv_heads // size, rank * kv_heads // size
    else:  # fewer KV heads than ranks: the one KV head this rank's query heads belong to
        kv_per, kv_first = 1, rank * q_per // (heads // kv_heads)
    q_dim, kv_dim = heads * dim, kv_heads * dim
    ranges = [(rank * q_per * dim, (rank + 1) * q_per * dim)]
    for base in (q_dim, q_dim + kv_dim):
        ranges.append((base + kv_first * dim, base + (kv_first + kv_per) * dim))
    return ranges, kv_per


def _block_nodes(plan: dict, start: dict, end: dict) -> list:
    """The nodes on a path from start's output to end's first input (the attention block between qkv and o)."""
    reached = set(start["outputs"])
    forward = []
    for node in plan["nodes"]:
        if node is not end and any(name in reached for name in node["inputs"]):
            forward.append(node)
            reached.update(node["outputs"])
    needed = {end["inputs"][0]}
    block = []
    for node in reversed(forward):
        if any(name in needed for name in node["outputs"]):
            block.append(node)
            needed.update(node["inputs"])
    return block


def _remap_shapes(plan: dict, arrays: dict, block: list, mapping: dict, tag: str) -> None:
    """Rewrite the head-count constants of the attention block (Split sizes; Reshape targets' head axis) into new
    initializers (a constant may be shared with code outside the block)."""
    for node in block:
        if node["op"] == "Split" and len(node["inputs"]) > 1:
            positions = None  # every size
        elif node["op"] == "Reshape":
            positions = (2,)
        else:
            continue
        name = node["inputs"][1]
        value = arrays.get(name)
        if value is None or value.dtype.kind not in "iu":
            continue
        new = np.array(value, copy=True)
        for position in range(new.size) if positions is None else positions:
            if position < new.size and int(new[position]) in mapping:
                new[position] = mapping[int(new[position])]
        if not np.array_equal(new, value):
            renamed = f"{name}/{tag}"
            arrays[renamed] = new
            node["inputs"] = [renamed if i == 1 else n for i, n in enumerate(node["inputs"])]


def shard(plan: dict, arrays: dict, size: int, rank: int) -> tuple[dict, dict]:
    """(plan, arrays) of one rank (see the module docstring); the inputs are left unchanged."""
    import copy

    plan = copy.deepcopy(plan)
    arrays = dict(arrays)
    kv_per = plan["num_kv_heads"]
    for attention, qkv, o, up, down in _layer_gemms(plan):
        attrs = attention["attrs"]
        heads, kv_heads, dim = attrs["num_heads"], attrs["num_kv_heads"], attrs["head_dim"]
        ranges, kv_per = _qkv_ranges(heads, kv_heads, dim, size, rank)
        _shard_rows(arrays, qkv, lambda w, r=ranges: _rows(w, r))
        mapping = {heads: heads // size, kv_heads: kv_per, heads * dim: heads // size * dim,
                   kv_heads * dim: kv_per * dim}
        _remap_shapes(plan, arrays, _block_nodes(plan, qkv, o), mapping, f"tp{rank}")
        for node in _block_nodes(plan, qkv, o) + [attention]:
            if "num_heads" in node["attrs"]:
                node["attrs"].update(num_heads=heads // size, num_kv_heads=kv_per)
        _shard_columns(arrays, o, rank * heads // size * dim, (rank + 1) * heads // size * dim, rank)
        width = arrays[down["inputs"][1]].shape[1]
        if width % size:
            raise FdppError(f"--tensor-parallel {size} does not divide the MLP width {width}; pick a smaller size")
        part = width // size
        if up["attrs"].get("epilogue") == "silu_mul":  # gate rows, then up rows
            ranges = [(rank * part, (rank + 1) * part), (width + rank * part, width + (rank + 1) * part)]
        else:
            ranges = [(rank * part, (rank + 1) * part)]
        _shard_rows(arrays, up, lambda w, r=ranges: _rows(w, r))
        _shard_columns(arrays, down, rank * part, (rank + 1) * part, rank)
    plan["num_kv_heads"] = kv_per
    plan["tensor_parallel"] = {"size": size, "rank": rank}
    return plan, arrays


def _shard_rows(arrays: dict, gemm: dict, select) -> None:
    """A column-parallel GEMM: the rank's output rows of its weight (and bias)."""
    names = gemm["inputs"][1:3] if gemm["attrs"].get("has_bias", 0) else gemm["inputs"][1:2]
    for name in names:
        arrays[name] = select(arrays[name])


def _shard_columns(arrays: dict, gemm: dict, start: int, stop: int, rank: int) -> None:
    """A row-parallel GEMM: the rank's input columns; bias and residual on rank 0 only; the all-reduce after."""
    weight = gemm["inputs"][1]
    arrays[weight] = arrays[weight][:, start:stop]
    gemm["attrs"]["all_reduce"] = 1
    if rank:
        gemm["inputs"] = gemm["inputs"][:2]
        gemm["attrs"].update(has_bias=0, epilogue="none")
