"""Mixed steps: one forward pass that decodes a batch bucket and prefills a prompt chunk together.

A server step that decodes B sequences and a separate pass that prefills a chunk of C prompt tokens each stream
every weight once. In a mixed step the two share one pass: the graph runs on input_ids [1, B + C] (the B decode
tokens of slots 0..B-1, then the chunk of one slot), so every GEMM, norm and elementwise op sees B + C rows and
reads the weights once; only the two position-dependent ops are split along the token axis:
  - fdpp::RopeAppend: the decode rows rotate and append at each slot's own past length (cache[:B]), then the
    chunk rotates and appends at its start in its slot (cache[slot]); the decode part runs first, so the junk row
    the chunk's slot writes as a member of the bucket (at its start) is overwritten by the chunk's first row;
  - fdpp::AsyncSoftmaxAttention: the decode rows attend over cache[:B], the chunk over cache[slot] (causal after
    its start; a chunk of up to 128 tokens runs on the split-KV decode kernel too, see chunk_takes_decode).
The graph's past_len input is then [B + 1]: the B decode lengths, then the chunk's start. Neither split op copies:
RopeAppend rotates the query in place, and both attention calls write into one output whose memory is laid out
[1, B + C, H, D], so the graph's Transpose back to tokens-major is free and the o_proj GEMM reads it as is.

Example: 15 sequences decoding and a 128-token chunk of a 16th (batch bucket 16) run as one pass of input_ids
[1, 16 + 128] that streams every weight once; run apart, the decode step and the chunk's pass would each stream them.

A graph qualifies only when past_len reaches nothing but those two ops, the caches nothing but RopeAppend, and the
attention reads the caches RopeAppend wrote (llama, mistral, qwen, chatglm exports). Absolute position embeddings
(OPT, GPT-2) compute positions from past_len in the graph itself: such engines run chunks and decode steps apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIXED_OPS = ("RopeAppend", "AsyncSoftmaxAttention")


@dataclass(frozen=True)
class MixedLayout:
    batch: int  # decode rows: slots [0, batch), one token each, first on the token axis
    slot: int   # the chunk's cache slot (one of the batch's slots: its decode row is junk, see above)
    chunk: int  # the chunk's tokens (padded) after the decode rows

    def wrap(self, op_type: str, fn):
        return wrap(op_type, fn, self)


def unsupported_reason(plan: dict) -> str | None:
    """Why this plan cannot run mixed steps, or None."""
    consumers = {}
    for node in plan["nodes"]:
        for name in node["inputs"]:
            consumers.setdefault(name, []).append(node)
    fdpp_ops = [n for n in plan["nodes"] if n.get("domain") == "fdpp" and n["op"] in MIXED_OPS]
    if not any(n["op"] == "RopeAppend" for n in fdpp_ops):
        return "the graph appends its KV cache without fdpp::RopeAppend"
    for node in consumers.get("past_len", []):
        if node.get("domain") != "fdpp" or node["op"] not in MIXED_OPS:
            return f"past_len feeds {node['op']} ({node['name']}): the graph computes positions itself"
    for name in plan.get("cache_inputs", []):  # fed whole (every slot): only the split RopeAppend may read them
        for node in consumers.get(name, []):
            if node.get("domain") != "fdpp" or node["op"] != "RopeAppend":
                return f"the cache {name} feeds {node['op']} ({node['name']})"
    rope_outputs = {name for n in fdpp_ops if n["op"] == "RopeAppend" for name in n["outputs"][1:]}
    for node in fdpp_ops:
        if node["op"] == "AsyncSoftmaxAttention":
            if node["attrs"].get("mask_mode") != "past_len":
                return f"attention {node['name']} takes a bias mask"
            if not set(node["inputs"][1:3]) <= rope_outputs:
                return f"attention {node['name']} reads keys RopeAppend did not write"
    return None


def _decode_rows(x, batch: int):
    """[1, H, B + C, D] -> the decode rows as [B, H, 1, D] (a view)."""
    return x[0, :, :batch].transpose(0, 1).unsqueeze(2)


def _chunk_rows(x, batch: int):
    """[1, H, B + C, D] -> the chunk as [1, H, C, D] (a view)."""
    return x[:, :, batch:]


def _join(decode_out, chunk_out):
    """[B, H, 1, D] and [1, H, C, D] -> [1, H, B + C, D]."""
    return torch.cat((decode_out.squeeze(2).transpose(0, 1).unsqueeze(0), chunk_out), dim=2)


def tokens_major(batch: int, heads: int, seq: int, dim: int, like):
    """An empty [batch, heads, seq, dim] tensor whose memory is [batch, seq, heads, dim]: what the graph's
    Transpose(0, 2, 1, 3) after the attention makes contiguous for free (an attention output in heads-major memory
    costs a copy before the o_proj GEMM)."""
    return torch.empty(batch, seq, heads, dim, dtype=like.dtype, device=like.device).transpose(1, 2)


def wrap(op_type: str, fn, layout: MixedLayout):
    """The step of a RopeAppend or attention node for a mixed step: `fn` (the backend's step) once on the decode
    rows and once on the chunk."""
    b, rows = layout.batch, slice(layout.slot, layout.slot + 1)
    if op_type == "RopeAppend":
        def rope_append(query, k_new, v_new, key_cache, value_cache, past_len, inv_freq):
            dec, chunk = _decode_rows(query, b), _chunk_rows(query, b)
            q_dec, _, _ = fn(dec, _decode_rows(k_new, b), _decode_rows(v_new, b),
                             key_cache[:b], value_cache[:b], past_len[:b], inv_freq)
            q_chunk, _, _ = fn(chunk, _chunk_rows(k_new, b), _chunk_rows(v_new, b),
                               key_cache[rows], value_cache[rows], past_len[b:], inv_freq)
            if q_dec.data_ptr() == dec.data_ptr() and q_chunk.data_ptr() == chunk.data_ptr():
                return query, key_cache, value_cache  # rotated in place (the cuda backend): nothing to join
            return _join(q_dec, q_chunk), key_cache, value_cache
        return rope_append

    def attention(query, key, value, past_len):
        out = tokens_major(1, query.shape[1], query.shape[2], query.shape[3], query)
        fn(_decode_rows(query, b), key[:b], value[:b], past_len[:b], out=_decode_rows(out, b))
        fn(_chunk_rows(query, b), key[rows], value[rows], past_len[b:], out=_chunk_rows(out, b))
        return out
    return attention
