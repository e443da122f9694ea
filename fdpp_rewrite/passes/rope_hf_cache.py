"""For an engine that runs transformers decode-with-cache graphs on its own caches: RoPE + the cache Concats of a
layer -> one fdpp::RopeAppend on the engine's cache buffers. Not a rewrite pass (`rewrite` and `compare` keep the
graph's own semantics, rope_append.HF_CACHE_CONCAT says why); an engine build calls it.

In the graph (after the attention pass), per layer:

    present.i.key   = Concat(past_key_values.i.key,   rotate(k, cos/sin(position_ids * inv_freq)))  (axis 2)
    present.i.value = Concat(past_key_values.i.value, v)
    attention reads rotate(q), present.i.key, present.i.value

engine/hf_interface.py feeds such a graph the views of its caches and writes each sequence's new rows at its own
length, write_pos[b] + s, which is also the position it feeds in position_ids. Under that rule the layer is exactly

    rotate(q), present.i.key, present.i.value = RopeAppend(q, k, v, buffer(past_key_values.i.key),
                                                           buffer(past_key_values.i.value), write_pos, inv_freq)

with buffer(name) the engine's [batch, kv_heads, past + seq, head_dim] view that the old rows live in. The cos/sin
tables are proven to be cos/sin(position_ids * inv_freq) by evaluating them for random position_ids first.
    run(graph, buffer_name=lambda past: "engine.cache." + past, write_pos="engine.write_pos") -> PassReport
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fdpp_rewrite.contracts import DOMAIN, load_contract
from fdpp_rewrite.hf_graph import PAST_INPUT
from fdpp_rewrite.passes.common import NameMaker, PassReport, producer_op, static_dim
from fdpp_rewrite.passes.rope_append import LEFT, OP, TABLE_ATOL, evaluate
from fdpp_rewrite.passes.rope_match import inv_freq_of, match_rotation, same_rotation
from fdpp_rewrite.passes.support import dtypes_of, unsupported

POSITIONS_INPUT = "position_ids"


def _past_source(tensor: gs.Tensor) -> gs.Tensor:
    """Through the Identity and one-input Concat nodes the TorchScript export leaves on a past input."""
    node = producer_op(tensor, "Identity", "Concat")
    while node is not None and len(node.inputs) == 1:
        tensor = node.inputs[0]
        node = producer_op(tensor, "Identity", "Concat")
    return tensor


def _cache_concat(graph: gs.Graph, tensor: gs.Tensor):
    """(past input, new rows) when tensor = Concat(past_key_values.i.*, new) on axis 2, else None."""
    concat = producer_op(tensor, "Concat")
    if concat is None or len(concat.inputs) != 2 or concat.attrs.get("axis") not in (2, -2):
        return None
    past = _past_source(concat.inputs[0])
    if past not in graph.inputs or not PAST_INPUT.match(past.name):
        return None
    return past, concat.inputs[1]


def _tables_follow_position_ids(graph: gs.Graph, rotation, inv_freq: np.ndarray) -> bool:
    """cos/sin == cos/sin(position_ids[b, s] * inv_freq) over heads ([B, 1, S, R], halves repeated), for random
    position_ids."""
    positions = next((t for t in graph.inputs if t.name == POSITIONS_INPUT), None)
    if positions is None or positions.shape is None or len(positions.shape) != 2:
        return False
    seq = static_dim(positions, 1) or 3
    symbols = {positions.shape[1]: seq} if isinstance(positions.shape[1], str) else {}
    rng = np.random.default_rng(0)
    feeds = [{POSITIONS_INPUT: rng.integers(0, 4096, (2, seq)).astype(np.int64)} for _ in range(2)]
    results = evaluate(graph, [rotation.cos, rotation.sin], feeds, symbols)
    if results is None:
        return False
    for (cos, sin), feed in zip(results, feeds):
        angles = feed[POSITIONS_INPUT].astype(np.float32)[:, :, None] * inv_freq
        want_cos = np.concatenate([np.cos(angles)] * 2, axis=-1)[:, None]
        want_sin = np.concatenate([np.sin(angles)] * 2, axis=-1)[:, None]
        if cos.shape != want_cos.shape or not (np.allclose(cos, want_cos, atol=TABLE_ATOL, rtol=0)
                                               and np.allclose(sin, want_sin, atol=TABLE_ATOL, rtol=0)):
            return False
    return True


def run(graph: gs.Graph, buffer_name, write_pos: str) -> PassReport:
    """Fuse every layer it can prove; `buffer_name(past input name)` names the engine's cache view of that past,
    `write_pos` its [batch] int64 input of each sequence's length. Both are added as graph inputs."""
    report = PassReport("rope_append (engine caches)")
    contract = load_contract(OP)
    names = NameMaker(graph, "fdpp_rope_cache")
    graph.toposort()
    added, tables = {}, {}

    def graph_input(name: str, dtype, shape):
        if name not in added:
            added[name] = gs.Variable(name, dtype=dtype, shape=shape)
            graph.inputs.append(added[name])
        return added[name]

    for attention in [n for n in graph.nodes if n.domain == DOMAIN and n.op == "AsyncSoftmaxAttention"]:
        query, key, value = attention.inputs[:3]
        k_cache, v_cache = _cache_concat(graph, key), _cache_concat(graph, value)
        if k_cache is None or v_cache is None:
            continue
        k_rotation, q_rotation = match_rotation(k_cache[1]), match_rotation(query)
        if k_rotation is None or q_rotation is None or not same_rotation(k_rotation, q_rotation) \
                or k_rotation.interleaved:
            report.leave(LEFT, attention.name, "q and k are not both rotated by rotate_half with one table")
            continue
        inv_freq = inv_freq_of(k_rotation)
        if inv_freq is None or not _tables_follow_position_ids(graph, k_rotation, inv_freq):
            report.leave(LEFT, attention.name, f"the cos/sin tables are not cos/sin({POSITIONS_INPUT} * inv_freq)")
            continue
        attrs = {name: attention.attrs[name] for name in ("num_heads", "num_kv_heads", "head_dim")}
        attrs.update(rope_dim=k_rotation.rope_dim, interleaved=0)
        why_not = unsupported(OP, attrs, dtypes_of(query=q_rotation.source))
        if why_not:
            report.leave(LEFT, attention.name, why_not)
            continue
        attrs = contract.validate_attributes(attrs, where=f"attention '{attention.name}'")
        if inv_freq.tobytes() not in tables:
            tables[inv_freq.tobytes()] = gs.Constant(names("inv_freq"), inv_freq)
        positions = graph_input(write_pos, np.int64, [key.shape[0] if key.shape else "batch"])
        buffers = [graph_input(buffer_name(past.name), past.dtype, key.shape) for past, _ in (k_cache, v_cache)]
        outputs = [query, key, value]
        for tensor in outputs:
            tensor.inputs.clear()  # disconnects the rotations and the Concats; cleanup() removes them
        inputs = [q_rotation.source, k_rotation.source, v_cache[1], *buffers, positions, tables[inv_freq.tobytes()]]
        graph.nodes.append(gs.Node(OP, name=names("rope_append"), domain=DOMAIN, attrs=attrs, inputs=inputs,
                                   outputs=outputs))
        report.replaced["rope_cache"] += 1
    graph.cleanup().toposort()
    return report
