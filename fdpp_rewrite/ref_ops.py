"""CPU reference of the fdpp plugin ops (numpy, float32 math).

The semantics are the contracts' (plugins/<Op>Plugin/contract.json); the GPU kernels are tested against these
functions. fdpp_rewrite/ref_session.py runs a whole rewritten graph with them (make_reference_session).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.dispatch import select_impl
from fdpp_rewrite.errors import FdppError

DEFAULT_KEY_TILE = 64  # keys per tile in the reference; the kernels pick their own, the result is the same


# --- diagnostics ---------------------------------------------------------------------------------------------

@dataclass
class OpCounters:
    """What the reference ops did since the last reset(): attention rows and how many took the fallback,
    and how many FlatGemm calls each implementation ('impla', 'implb', 'cublaslt', 'cutlass') would serve."""

    attention_rows: int = 0
    fallback_rows: int = 0
    gemm_impls: Counter = field(default_factory=Counter)

    def reset(self) -> None:
        self.attention_rows = 0
        self.fallback_rows = 0
        self.gemm_impls.clear()


COUNTERS = OpCounters()


# --- AsyncSoftmaxAttention -----------------------------------------------------------------------------------

def visible_keys(mask_mode: str, mask_input, batch: int, seq: int, kv_len: int, threshold: float,
                 window: int = 0):
    """Boolean [B, 1, S, L] of the keys each query may see, and the additive bias [B, 1, S, L] (or None).
    window > 0 (past_len only): query i also sees only keys j with (past_len + i) - j < window."""
    if window and mask_mode != "past_len":
        raise FdppError(f"AsyncSoftmaxAttention: window {window} needs mask_mode 'past_len' (got {mask_mode!r}): "
                        "the window counts back from each query's position past_len + i")
    if mask_mode == "none":
        return np.ones((batch, 1, seq, kv_len), dtype=bool), None
    if mask_mode == "past_len":
        past_len = np.asarray(mask_input, dtype=np.int64).reshape(batch)
        last_visible = past_len[:, None] + np.arange(seq)[None, :]              # [B, S]
        keys = np.arange(kv_len)[None, None, :]
        visible = keys <= last_visible[:, :, None]                              # [B, S, L]
        if window:
            visible &= last_visible[:, :, None] - keys < window
        return visible[:, None], None
    if mask_mode == "bias":
        bias = np.asarray(mask_input, dtype=np.float32)
        try:
            bias = np.broadcast_to(bias, (batch, 1, seq, kv_len))
        except ValueError as exc:
            raise FdppError(f"AsyncSoftmaxAttention: bias of shape {bias.shape} does not broadcast to "
                            f"[{batch}, 1, {seq}, {kv_len}]") from exc
        return bias > threshold, bias
    raise FdppError(f"AsyncSoftmaxAttention: unknown mask_mode {mask_mode!r} (expected past_len, bias or none)")


def low_guard_tail() -> float:
    """The contract's low_guard_tail (nats): how far above guard_lo a row's max must be to ignore its low scores."""
    return float(load_contract("AsyncSoftmaxAttention").raw["low_guard_tail"])


def guard_flags(row_max, row_min, phi: float, guard_lo: float, guard_hi: float, tail: float | None = None):
    """Which rows (given each row's largest and smallest visible score, numpy arrays or torch tensors) the unified
    max sends to the fallback: a score above phi + guard_hi could overflow; scores below phi + guard_lo only matter
    while the row's max is below phi + guard_lo + tail (a term lost to underflow is then not negligible against it).
    The kernels apply the same rule (UnifiedMaxSoftmax::guard_bits). A row with no visible key (max -inf, min
    +inf) is never flagged."""
    tail = low_guard_tail() if tail is None else tail
    return (row_max - phi > guard_hi) | ((row_min - phi < guard_lo) & (row_max - phi < guard_lo + tail))


def _unified_max(scores, visible, v, phi: float, tile: int):
    """Each key tile accumulates sum(e^(s - phi) v) and sum(e^(s - phi)); tiles add their partials at the end."""
    rows, kv_len = scores.shape
    exps = np.where(visible, np.exp(np.where(visible, scores - phi, 0.0)), 0.0).astype(np.float32)
    num = np.zeros((rows, v.shape[-1]), np.float32)
    den = np.zeros(rows, np.float32)
    for start in range(0, kv_len, tile):
        part = exps[:, start:start + tile]
        num += np.einsum("rj,rjd->rd", part, v[:, start:start + tile])
        den += part.sum(axis=1)
    return num, den


def _online_max(scores, visible, v, tile: int):
    """The synchronized softmax: a running max, and earlier partials rescaled whenever it grows."""
    rows, kv_len = scores.shape
    running_max = np.full(rows, -np.inf, np.float32)
    num = np.zeros((rows, v.shape[-1]), np.float32)
    den = np.zeros(rows, np.float32)
    for start in range(0, kv_len, tile):
        part_scores = np.where(visible[:, start:start + tile], scores[:, start:start + tile], -np.inf)
        new_max = np.maximum(running_max, part_scores.max(axis=1))
        seen = np.isfinite(new_max)  # rows with at least one visible key so far
        safe_new = np.where(seen, new_max, 0.0)
        rescale = np.where(np.isfinite(running_max), np.exp(np.where(seen, running_max - safe_new, 0.0)), 0.0)
        exps = np.where(np.isfinite(part_scores), np.exp(part_scores - safe_new[:, None]), 0.0).astype(np.float32)
        num = num * rescale[:, None] + np.einsum("rj,rjd->rd", exps, v[:, start:start + tile])
        den = den * rescale + exps.sum(axis=1)
        running_max = new_max
    return num, den


def kv_block_size() -> int:
    """Tokens per block of the paged KV cache (the attention contract's kv_block_size)."""
    from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE

    return KV_BLOCK_SIZE


def gather_pages(pool, table, kv_len: int):
    """The contiguous cache [B, Hkv, kv_len, D] that a paged cache holds: pool [N, Hkv, block, D] read through the
    block table [B, W] (entry j of row b: the block of positions [block j, block (j + 1)) of sequence b). Works on
    numpy arrays and torch tensors alike (same kind out). Example: block 64, table [[3, 1]], kv_len 100 -> rows 0-63
    of pool[3], then rows 0-35 of pool[1]."""
    block = pool.shape[2]
    blocks = -(-kv_len // block)
    if blocks > table.shape[1]:
        raise FdppError(f"gather_pages: {kv_len} positions need {blocks} blocks, the table has {table.shape[1]}")
    pages = pool[table[:, :blocks]]  # [B, blocks, Hkv, block, D]
    batch, kv_heads, dim = pages.shape[0], pages.shape[2], pages.shape[4]
    return pages.swapaxes(1, 2).reshape(batch, kv_heads, blocks * block, dim)[:, :, :kv_len]


def async_softmax_attention(query, key, value, mask_input=None, *, scale: float, phi: float, guard_lo: float,
                            guard_hi: float, mask_mode: str, softmax: str = "unified", num_heads: int | None = None,
                            num_kv_heads: int | None = None, head_dim: int | None = None, softcap: float = 0.0,
                            window: int = 0, tile: int = DEFAULT_KEY_TILE,
                            counters: OpCounters = COUNTERS) -> np.ndarray:
    """fdpp::AsyncSoftmaxAttention. query [B, Hq, S, D], key/value [B, Hkv, L, D]; returns [B, Hq, S, D] in
    query's dtype. num_heads / num_kv_heads / head_dim, when given, are checked against the shapes. softmax
    "synchronized" (a calibration verdict) sends every row to the online-max path; they count as fallback rows.
    softcap > 0: scores = softcap * tanh(scores / softcap) after the scale, before the mask; window > 0 (past_len):
    a sliding window of that many keys ending at each query's position."""
    batch, heads, seq, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    for name, given, actual in (("num_heads", num_heads, heads), ("num_kv_heads", num_kv_heads, kv_heads),
                                ("head_dim", head_dim, dim)):
        if given is not None and given != actual:
            raise FdppError(f"AsyncSoftmaxAttention: attribute {name}={given} but the inputs have {actual}")
    if heads % kv_heads or key.shape != value.shape or key.shape[0] != batch or key.shape[3] != dim:
        raise FdppError(f"AsyncSoftmaxAttention: shapes query {query.shape}, key {key.shape}, value {value.shape} "
                        "do not fit [B, Hq, S, D] / [B, Hkv, L, D] with Hq a multiple of Hkv")
    if softcap < 0 or window < 0:
        raise FdppError(f"AsyncSoftmaxAttention: softcap {softcap} and window {window} must be >= 0 (0: none)")
    threshold = load_contract("AsyncSoftmaxAttention").raw["bias_mask_threshold"]
    visible, bias = visible_keys(mask_mode, mask_input, batch, seq, kv_len, threshold, window)

    kv_of_head = np.arange(heads) // (heads // kv_heads)
    q = query.astype(np.float32)
    k = key.astype(np.float32)[:, kv_of_head]    # [B, Hq, L, D]
    v = value.astype(np.float32)[:, kv_of_head]
    scores = np.float32(scale) * np.matmul(q, np.swapaxes(k, -1, -2))  # [B, Hq, S, L]
    if softcap:
        cap = np.float32(softcap)
        scores = (cap * np.tanh(scores / cap)).astype(np.float32)
    if bias is not None:
        scores = np.where(visible, scores + bias, -np.inf).astype(np.float32)
    visible = np.broadcast_to(visible, scores.shape)

    rows = batch * heads * seq
    scores, visible = scores.reshape(rows, kv_len), visible.reshape(rows, kv_len)
    v_rows = np.repeat(v, seq, axis=1).reshape(rows, kv_len, dim)  # row (b, h, i) reads v[b, h]
    if softmax not in ("unified", "synchronized"):
        raise FdppError(f"AsyncSoftmaxAttention: unknown softmax {softmax!r} (expected unified or synchronized)")
    if softmax == "synchronized":
        flagged = np.ones(rows, dtype=bool)
    else:
        row_max = np.where(visible, scores, -np.inf).max(axis=1, initial=-np.inf)
        row_min = np.where(visible, scores, np.inf).min(axis=1, initial=np.inf)
        flagged = guard_flags(row_max, row_min, np.float32(phi), guard_lo, guard_hi)

    num, den = _unified_max(scores, visible & ~flagged[:, None], v_rows, phi, tile)
    if flagged.any():
        num[flagged], den[flagged] = _online_max(scores[flagged], visible[flagged], v_rows[flagged], tile)
    out = np.divide(num, den[:, None], out=np.zeros_like(num), where=den[:, None] > 0)
    counters.attention_rows += rows
    counters.fallback_rows += int(flagged.sum())
    return out.reshape(batch, heads, seq, dim).astype(query.dtype)


# --- FlatGemm ------------------------------------------------------------------------------------------------

def flat_gemm(x, weight, bias=None, residual=None, *, epilogue: str = "none", m1: int | None = None,
              m2: int | None = None, implc: str = "cublaslt", counters: OpCounters = COUNTERS,
              **_implb) -> np.ndarray:
    """fdpp::FlatGemm. x [..., K], weight [N, K]; returns [..., N] (or [..., N/2] for silu_mul) in x's dtype.
    m1/m2/implc only record which implementation the dispatch rule (fdpp_rewrite.dispatch) picks: every one
    computes the same math; the ImplB config in **_implb changes nothing here."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise FdppError(f"FlatGemm: x has K={x.shape[-1]} but the weight is [{n}, {k}]")
    lead = x.shape[:-1]
    m = int(np.prod(lead, dtype=np.int64))
    if m1 is not None and m2 is not None and m > 0:
        plan = {"m1": m1, "m2": m2, "implc": implc, **{k: v for k, v in _implb.items() if k in ("m3", "implb_loader")}}
        counters.gemm_impls[select_impl(m, plan)] += 1
    y = x.reshape(m, k).astype(np.float32) @ weight.astype(np.float32).T
    if bias is not None:
        y = y + bias.astype(np.float32)
    if epilogue == "silu_mul":
        if n % 2:
            raise FdppError(f"FlatGemm: epilogue silu_mul needs an even N, the weight is [{n}, {k}]")
        gate, up = y[:, : n // 2], y[:, n // 2:]
        with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g gives silu = -0, as it should
            y = gate / (np.float32(1.0) + np.exp(-gate)) * up
    elif epilogue == "residual":
        if residual is None:
            raise FdppError("FlatGemm: epilogue residual needs the residual input")
        y = y + residual.astype(np.float32).reshape(m, n)
    elif epilogue != "none":
        raise FdppError(f"FlatGemm: unknown epilogue {epilogue!r} (expected none, silu_mul or residual)")
    return y.reshape(*lead, y.shape[-1]).astype(x.dtype)


# --- RMSNorm and RopeAppend: the glue ops of the decode step -------------------------------------------------

def rms_norm(x, weight, *, epsilon: float) -> np.ndarray:
    """fdpp::RMSNorm. x [..., H], weight [H]; the exported subgraph's arithmetic: the mean square in float32,
    normed rounded to x's dtype, then times the weight rounded to x's dtype. E.g. x = [3, 4] (float32), weight
    [1, 2], epsilon 0: rms = sqrt(12.5) = 3.5355, y = [0.8485, 2.2627]."""
    if weight.ndim != 1 or x.shape[-1:] != weight.shape:
        raise FdppError(f"RMSNorm: weight of shape {weight.shape} does not match the last axis of x {x.shape}")
    x32 = x.astype(np.float32)
    mean_square = np.mean(x32 * x32, axis=-1, keepdims=True, dtype=np.float32)
    normed = (x32 / np.sqrt(mean_square + np.float32(epsilon))).astype(x.dtype)
    return (normed.astype(np.float32) * weight.astype(np.float32)).astype(x.dtype)


def rope_rotate(x, positions, inv_freq, rope_dim: int, interleaved: bool) -> np.ndarray:
    """RoPE of x [..., S, D] at positions [S] (or broadcastable) on the first rope_dim channels, float32 math.
    Pair i is (2i, 2i+1) when interleaved, else (i, i + rope_dim/2); e.g. rope_dim 4, not interleaved: pairs
    (0, 2), (1, 3), channels 4.. pass through."""
    out = x.astype(np.float32)
    if rope_dim == 0:
        return out
    half = rope_dim // 2
    angles = np.asarray(positions, np.float32)[..., None] * np.asarray(inv_freq, np.float32)[:half]  # [.., S, R/2]
    cos, sin = np.cos(angles, dtype=np.float32), np.sin(angles, dtype=np.float32)
    first = np.arange(half) * 2 if interleaved else np.arange(half)
    second = first + 1 if interleaved else first + half
    x0, x1 = out[..., first].copy(), out[..., second].copy()
    out[..., first] = x0 * cos - x1 * sin
    out[..., second] = x1 * cos + x0 * sin
    return out


def rope_append(query, k_new, v_new, key_cache, value_cache, past_len, inv_freq, *, rope_dim: int = 0,
                interleaved: int = 0, num_heads: int | None = None, num_kv_heads: int | None = None,
                head_dim: int | None = None, block_table=None):
    """fdpp::RopeAppend: (query_out, key_cache_out, value_cache_out). The caches come back as updated copies
    (the GPU op writes them in place); a token at position past_len[b] + s outside the cache is not written.
    block_table [B, W]: the caches are pools [N, Hkv, block, D] and position p of row b goes to row p % block of
    block table[b, p // block] (the inverse of gather_pages); positions >= W x block are not written."""
    batch, heads, seq, dim = query.shape
    kv_heads, capacity = key_cache.shape[1], key_cache.shape[2]
    if block_table is not None:
        block_table = np.asarray(block_table)
        block = key_cache.shape[2]
        capacity = block_table.shape[1] * block
        if block_table.shape[0] != batch:
            raise FdppError(f"RopeAppend: block_table has {block_table.shape[0]} rows, the batch is {batch}")
    for name, given, actual in (("num_heads", num_heads, heads), ("num_kv_heads", num_kv_heads, kv_heads),
                                ("head_dim", head_dim, dim)):
        if given is not None and given != actual:
            raise FdppError(f"RopeAppend: attribute {name}={given} but the inputs have {actual}")
    new_shape = (batch, kv_heads, seq, dim)
    if k_new.shape != new_shape or v_new.shape != new_shape or value_cache.shape != key_cache.shape \
            or (block_table is None and key_cache.shape[0] != batch) or key_cache.shape[3] != dim or heads % kv_heads:
        raise FdppError(f"RopeAppend: shapes query {query.shape}, k_new {k_new.shape}, v_new {v_new.shape}, caches "
                        f"{key_cache.shape} / {value_cache.shape} do not fit [B, Hq, S, D], [B, Hkv, S, D], "
                        "[B, Hkv, cache_len, D]")
    if rope_dim % 2 or rope_dim > dim or np.asarray(inv_freq).size < rope_dim // 2:
        raise FdppError(f"RopeAppend: rope_dim {rope_dim} must be even and <= head_dim {dim}, with rope_dim / 2 "
                        f"inv_freq values (got {np.asarray(inv_freq).size})")
    positions = np.asarray(past_len, np.int64).reshape(batch, 1) + np.arange(seq)[None, :]  # [B, S]
    rotate = lambda x: rope_rotate(x, np.maximum(positions, 0)[:, None, :], inv_freq, rope_dim,  # noqa: E731
                                   bool(interleaved)).astype(x.dtype)
    query_out, k_rotated = rotate(query), rotate(k_new)
    key_out, value_out = key_cache.copy(), value_cache.copy()
    for b in range(batch):
        keep = (positions[b] >= 0) & (positions[b] < capacity)
        if block_table is None:
            key_out[b][:, positions[b][keep]] = k_rotated[b][:, keep]
            value_out[b][:, positions[b][keep]] = v_new[b][:, keep]
            continue
        kept = positions[b][keep]
        blocks, rows = block_table[b, kept // block], kept % block
        key_out[blocks, :, rows] = np.swapaxes(k_rotated[b][:, keep], 0, 1)  # [kept, Hkv, D]
        value_out[blocks, :, rows] = np.swapaxes(v_new[b][:, keep], 0, 1)
    return query_out, key_out, value_out
