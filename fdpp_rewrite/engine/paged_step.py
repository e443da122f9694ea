"""Paged steps: one forward pass over B decode rows and P prompt chunks, reading K/V through block tables.

The mixed step (mixed.py) generalised to a paged cache: the graph runs on input_ids [1, T], T = B + P * C: the B
decode tokens (row i is whichever sequence the step gives it; padding rows have length 0 and an all-null table
row), then P prompt chunks each padded to C tokens. Every GEMM, norm and elementwise op sees T rows and reads the
weights once; only the two position-dependent ops are split along the token axis, without copies:
  - fdpp::RopeAppend rotates and appends the decode rows (viewed [B, H, 1, D]) through table rows [:B] at their
    lengths, then the chunks (viewed [P, H, C, D]) through rows [B:] at their starts;
  - fdpp::AsyncSoftmaxAttention: the same two calls over the pools, writing one output whose memory is
    tokens-major [1, T, H, D] (mixed.tokens_major), so the graph's Transpose back is free.
The graph's past_len input is [B + P]: the decode lengths, then the chunks' starts. P = 0 is a pure decode step,
B = 0 a batched prefill (16 prompts of 128 tokens: one pass of T = 2,048).

Example: B = 4, P = 2, C = 16: input_ids [1, 36]; query [1, H, 36, D] in memory [1, 36, H, D]; the decode view
is x[0, :, :4] as [4, H, 1, D], the chunks x[0, :, 4:] as [2, H, 16, D] (strides (16 H D, D, H D, 1)).

A step's static inputs (StepBuffers: ids, past_len, its table rows, the logits rows it keeps) belong to its shape
(B, P, C, KV length): the first step of a shape is traced and captured, later ones replay with new contents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fdpp_rewrite.engine.mixed import tokens_major


@dataclass(frozen=True, eq=False)
class PagedLayout:
    batch: int    # B decode rows, first on the token axis
    chunks: int   # P prompt chunks after them
    chunk: int    # C tokens per chunk (padded)
    kv_len: int   # bound on past_len + tokens of every row (sizes the attention's decode grid)
    table: torch.Tensor  # int32 [B + P, W] on the device: the step's table rows (a static buffer)

    def wrap(self, op_type: str, fn):
        return wrap(op_type, fn, self)


def decode_rows(x, batch: int):
    """[1, H, T, D] -> the decode rows as [B, H, 1, D] (a view)."""
    return x[0, :, :batch].transpose(0, 1).unsqueeze(2)


def chunk_rows(x, batch: int, chunks: int, chunk: int):
    """[1, H, T, D] -> the chunks as [P, H, C, D] (a view: token b + p C + s is row s of chunk p)."""
    return x[0, :, batch:batch + chunks * chunk].unflatten(1, (chunks, chunk)).transpose(0, 1)


def join(decode_out, chunk_out):
    """[B, H, 1, D] and [P, H, C, D] -> [1, H, B + P C, D] (the cpu backend's rotated query is a new tensor)."""
    parts = []
    if decode_out is not None:
        parts.append(decode_out.squeeze(2).transpose(0, 1))
    if chunk_out is not None:
        parts.append(chunk_out.transpose(0, 1).flatten(1, 2))
    return torch.cat(parts, dim=1).unsqueeze(0)


def wrap(op_type: str, fn, layout: PagedLayout):
    """The step of a RopeAppend or attention node for a paged step: `fn` (the backend's step, called with
    block_table=) once on the decode rows and once on the chunks; a part of size 0 is skipped."""
    b, p, c = layout.batch, layout.chunks, layout.chunk
    table = layout.table

    def parts(x):
        return (decode_rows(x, b) if b else None), (chunk_rows(x, b, p, c) if p else None)

    if op_type == "RopeAppend":
        def rope_append(query, k_new, v_new, key_pool, value_pool, past_len, inv_freq):
            (q_dec, q_chunk), (k_dec, k_chunk), (v_dec, v_chunk) = parts(query), parts(k_new), parts(v_new)
            out_dec = out_chunk = None
            if b:
                out_dec = fn(q_dec, k_dec, v_dec, key_pool, value_pool, past_len[:b], inv_freq,
                             block_table=table[:b])[0]
            if p:
                out_chunk = fn(q_chunk, k_chunk, v_chunk, key_pool, value_pool, past_len[b:], inv_freq,
                               block_table=table[b:])[0]
            in_place = all(out is None or out.data_ptr() == view.data_ptr()
                           for out, view in ((out_dec, q_dec), (out_chunk, q_chunk)))
            return (query if in_place else join(out_dec, out_chunk)), key_pool, value_pool
        return rope_append

    def attention(query, key_pool, value_pool, past_len):
        out = tokens_major(1, query.shape[1], query.shape[2], query.shape[3], query)
        (q_dec, q_chunk), (o_dec, o_chunk) = parts(query), parts(out)
        if b:
            fn(q_dec, key_pool, value_pool, past_len[:b], out=o_dec, block_table=table[:b], max_kv_len=layout.kv_len)
        if p:
            fn(q_chunk, key_pool, value_pool, past_len[b:], out=o_chunk, block_table=table[b:],
               max_kv_len=layout.kv_len)
        return out
    return attention


class StepBuffers:
    """The static inputs of one step shape (B, P, C, KV length) on the device: ids [1, T], past_len [B + P], the
    table rows [B + P, W] and the logits rows [B + P] (the decode rows, then each chunk's last real token). All four
    are views of one byte buffer, so a step uploads them in one copy from one pinned staging buffer (staging())."""

    def __init__(self, batch: int, chunks: int, chunk: int, width: int, device):
        rows = batch + chunks
        self.fields = {"ids": (torch.int64, (1, batch + chunks * chunk)), "past": (torch.int64, (rows,)),
                       "rows": (torch.int64, (rows,)), "table": (torch.int32, (rows, width))}
        self.offsets, total = {}, 0
        for name, (dtype, shape) in self.fields.items():
            self.offsets[name] = total
            total += -(-math.prod(shape) * dtype.itemsize // 8) * 8  # every field 8-byte aligned
        self.device = device
        self.packed = torch.zeros(total, dtype=torch.uint8, device=device)
        self.ids, self.past, self.rows, self.table = (self.view(self.packed, name) for name in self.fields)
        self.rows.copy_(torch.arange(rows, dtype=torch.int64))

    def view(self, buffer, name: str):
        """Field `name` of a buffer laid out like `packed` (a device or staging tensor)."""
        dtype, shape = self.fields[name]
        start = self.offsets[name]
        return buffer[start:start + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)

    def staging(self) -> tuple:
        """(a zeroed host buffer laid out like `packed`, pinned on cuda; {field: its numpy view}) to fill and upload.
        A fresh one per step: the previous step's copy may not have run yet."""
        host = torch.zeros(self.packed.numel(), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        return host, {name: self.view(host, name).numpy() for name in self.fields}

    def upload(self, host) -> None:
        """Every field from the filled staging buffer, in one copy (no host synchronization)."""
        self.packed.copy_(host, non_blocking=True)
