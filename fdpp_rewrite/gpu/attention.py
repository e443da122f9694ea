"""ctypes bindings of the attention C ABI (plugins/capi/attention_capi.h) and torch-facing functions.

    from fdpp_rewrite.gpu.attention import attention, rope_append, Counters
    out = attention(q, k_cache, v_cache, past_len, scale=d ** -0.5, phi=phi)   # [B, Hq, S, D]

`attention` is fdpp::AsyncSoftmaxAttention: FlashDecoding++'s asynchronized softmax with a unified max `phi`
and an exact fallback for rows whose scores leave [phi + guard_lo, phi + guard_hi]; `softmax="synchronized"`
runs the online-max baseline of the same kernels. Launches are asynchronous on torch's current stream and CUDA-graph
capturable (pass `workspace=` to reuse one buffer; past_len and bias must already be on the GPU then).

A decode whose splits cannot combine in a thread block cluster takes one kernel instead of two when it gets
`combine_counters=`: a zeroed int32 tensor of combine_counters_size(query, key) entries, which every call leaves
zeroed (one buffer serves any number of calls in order on one stream).

A paged call (`block_table=`, int32 [batch, W]) reads K/V from pools [blocks, kv_heads, KV_BLOCK_SIZE, head_dim].
Every table entry must name a pool block at all times (0, the null block, for unused ones), also while the kernel
before the attention rewrites the table: the decode kernel starts its first loads from ids read before that kernel
completes, and re-issues them if an id changed.
"""

from __future__ import annotations

import ctypes

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.gpu import lib as fdpp_lib
# re-exported: callers use attention.AttentionArgs, attention.library() and the rest
from fdpp_rewrite.gpu.attention_abi import (  # noqa: F401
    CONTRACT, DECODE_COMBINES, KERNEL_NAMES, KERNELS, KV_BLOCK_SIZE, MASK_MODES, PREFILL_CONFIGS, SOFTMAX_MODES,
    SUPPORTED_HEAD_DIMS, AttentionArgs, RopeAppendArgs, cluster_combine_ok, decode_splits, decode_stages, library,
    prefill_plan)

_i32 = ctypes.c_int32


def _dtype_code(tensor) -> int:
    name = str(tensor.dtype).replace("torch.", "")
    if name not in fdpp_lib.DTYPE_CODES:
        raise FdppError(f"attention takes float16, bfloat16 or float32 tensors, not {name}; cast the inputs")
    return fdpp_lib.DTYPE_CODES[name]


def _check_4d(name: str, tensor, device) -> None:
    if tensor.dim() != 4:
        raise FdppError(f"attention: {name} must be 4-D [batch, heads, seq, head_dim], got shape {tuple(tensor.shape)}")
    if tensor.device != device:
        raise FdppError(f"attention: {name} is on {tensor.device} but query is on {device}; put all inputs on one GPU")
    if tensor.stride(-1) != 1:
        raise FdppError(f"attention: {name}'s last dimension must be contiguous (call .contiguous())")


def _check_pools(fn: str, key, value, dim: int, device) -> None:
    """Paged K/V: two pools [blocks, kv_heads, KV_BLOCK_SIZE, dim] of one shape."""
    for name, pool in (("key pool", key), ("value pool", value)):
        _check_4d(name, pool, device)
    if key.shape != value.shape or key.shape[2] != KV_BLOCK_SIZE or key.shape[3] != dim:
        raise FdppError(f"{fn}: with a block_table the key/value pools must both be [blocks, kv_heads, "
                        f"{KV_BLOCK_SIZE}, {dim}], got {tuple(key.shape)} and {tuple(value.shape)}")


def _table_args(fn: str, table, batch: int, device) -> tuple[int, int, int]:
    """(device pointer, row stride, columns W) of a block table after checking it: int32 [batch, W] on the query's
    GPU, last dimension contiguous, any row stride (a view of a wider table works)."""
    torch = _torch()
    if table.dtype != torch.int32 or table.device != device or table.dim() != 2 or table.shape[0] != batch \
            or table.shape[1] < 1 or (table.shape[1] > 1 and table.stride(1) != 1):
        raise FdppError(f"{fn}: block_table must be an int32 [{batch}, W] tensor on {device} with a contiguous last "
                        f"dimension, got {table.dtype} {tuple(table.shape)} on {table.device}")
    stride = int(table.stride(0)) if batch > 1 else int(table.shape[1])  # one row: its stride is never used
    return table.data_ptr(), stride, int(table.shape[1])


class Counters:
    """A pair of device counters the kernels add to: rows that took the exact fallback, and rows whose kv length
    was clamped to the cache. Pass `counters=` to attention(); read with .fallback_rows / .clamped_rows (these
    synchronize)."""

    def __init__(self, device=None):
        import torch

        self.tensor = torch.zeros(2, dtype=torch.int64, device=device or "cuda")

    def reset(self) -> None:
        self.tensor.zero_()

    @property
    def fallback_rows(self) -> int:
        return int(self.tensor[0].item())

    @property
    def clamped_rows(self) -> int:
        return int(self.tensor[1].item())


def read_library_counters(reset: bool = False) -> tuple[int, int]:
    """(fallback rows, clamped rows) of the library's own counters on the current device (used when no
    Counters is passed). Synchronizes."""
    fallback, clamped = ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)
    fdpp_lib.check(library().fdpp_attention_read_counters(ctypes.byref(fallback), ctypes.byref(clamped), int(reset)),
                   "reading the attention counters")
    return fallback.value, clamped.value


def combine_counters_size(query, key, kernel: str = "auto") -> int:
    """Entries of the combine_counters buffer attention(query, key, ...) needs: batch x KV heads x blocks of 16 query
    rows (G x seq per KV head) when the call runs the decode kernel, else 0. From the library, on the shapes alone
    (key: the cache or, paged, the key pool: only its head count is read)."""
    if kernel not in KERNELS:
        raise FdppError(f"attention: unknown kernel {kernel!r} (choose from {', '.join(KERNELS)})")
    defaults = CONTRACT.defaults()
    args = AttentionArgs()
    args.dtype = _dtype_code(query)
    args.batch, args.num_heads, args.seq, args.head_dim = (int(n) for n in query.shape)
    args.num_kv_heads, args.kv_capacity = int(key.shape[1]), int(key.shape[2])
    args.mask_mode, args.kernel = MASK_MODES["none"], KERNELS[kernel]
    args.scale, args.phi = 1.0, float(defaults["phi"])
    args.guard_lo, args.guard_hi = float(defaults["guard_lo"]), float(defaults["guard_hi"])
    count = ctypes.c_size_t(0)
    fdpp_lib.check(library().fdpp_attention_combine_counters(ctypes.byref(args), ctypes.byref(count)),
                   "attention combine counters query")
    return count.value


def _combine_counters_ptr(combine_counters, query, key, kernel: str):
    """The device pointer of a combine_counters tensor after checking it (None passes through)."""
    if combine_counters is None:
        return None
    torch = _torch()
    if combine_counters.dtype not in (torch.int32, torch.uint32) or combine_counters.device != query.device \
            or not combine_counters.is_contiguous():
        raise FdppError(f"attention: combine_counters must be a contiguous int32 tensor on {query.device}, got "
                        f"{combine_counters.dtype} on {combine_counters.device}")
    need = combine_counters_size(query, key, kernel)
    if combine_counters.numel() < need:
        raise FdppError(f"attention: combine_counters holds {combine_counters.numel()} entries, this call needs "
                        f"{need} (combine_counters_size)")
    return combine_counters.data_ptr()


def _args(query, key, value, out, past_len, bias, *, scale, phi, guard_lo, guard_hi, mask_mode, softmax, kernel,
          num_splits, max_kv_len, counters, prefill_config=0, decode_combine="auto", pdl=True,
          combine_counters=None, block_table=None, softcap=0.0, window=0) -> AttentionArgs:
    device = query.device
    if device.type != "cuda":
        raise FdppError(f"attention runs on a CUDA GPU; query is on {device}")
    for name, tensor in (("query", query), ("key", key), ("value", value), ("out", out)):
        _check_4d(name, tensor, device)
        if tensor.dtype != query.dtype:
            raise FdppError(f"attention: {name} is {tensor.dtype} but query is {query.dtype}; use one dtype")
    batch, heads, seq, dim = query.shape
    kv_heads, kv_capacity = key.shape[1], key.shape[2]
    if dim not in SUPPORTED_HEAD_DIMS:
        raise FdppError(f"attention: head_dim {dim} is not supported (the kernels take "
                        f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))})")
    if not softcap >= 0 or (window and mask_mode != "past_len") or window < 0:
        raise FdppError(f"attention: softcap {softcap} must be >= 0 and window {window} >= 0, a window only with "
                        "mask_mode 'past_len' (0: none)")
    table = (None, 0, 0)
    if block_table is not None:
        _check_pools("attention", key, value, dim, device)
        table = _table_args("attention", block_table, batch, device)
        kv_capacity = table[2] * KV_BLOCK_SIZE
        if mask_mode != "past_len":
            raise FdppError(f"attention: a block_table (paged KV cache) needs mask_mode 'past_len', not {mask_mode!r}")
        if max_kv_len is None:
            raise FdppError("attention: a block_table needs max_kv_len (a host bound on past_len + seq, at most "
                            f"{kv_capacity} = the table's {table[2]} blocks x {KV_BLOCK_SIZE})")
    elif key.shape != value.shape or key.shape[0] != batch or key.shape[3] != dim:
        raise FdppError(f"attention: key {tuple(key.shape)} and value {tuple(value.shape)} must both be "
                        f"[{batch}, kv_heads, kv_len, {dim}]")
    if heads % kv_heads:
        raise FdppError(f"attention: {heads} query heads is not a multiple of {kv_heads} KV heads")
    if tuple(out.shape) != tuple(query.shape):
        raise FdppError(f"attention: out must have the query's shape {tuple(query.shape)}, got {tuple(out.shape)}")
    if mask_mode not in MASK_MODES:
        raise FdppError(f"attention: unknown mask_mode {mask_mode!r} (choose from {', '.join(MASK_MODES)})")
    if softmax not in SOFTMAX_MODES:
        raise FdppError(f"attention: unknown softmax {softmax!r} (choose from {', '.join(SOFTMAX_MODES)})")
    if kernel not in KERNELS:
        raise FdppError(f"attention: unknown kernel {kernel!r} (choose from {', '.join(KERNELS)})")

    past_ptr = None
    if mask_mode == "past_len":
        if past_len is None:
            raise FdppError("attention: mask_mode past_len needs past_len (int64 [batch])")
        if past_len.dtype.is_floating_point or past_len.numel() != batch:
            raise FdppError(f"attention: past_len must be an integer tensor of {batch} values")
        if past_len.device.type == "cpu":  # checkable here; on the GPU the kernels clamp and count instead
            longest = int(past_len.max()) + seq
            if int(past_len.min()) < 0 or longest > kv_capacity:
                raise FdppError(f"attention: past_len + seq reaches {longest} keys but the KV cache holds "
                                f"{kv_capacity}; grow the cache or shorten the sequence")
            if max_kv_len is None:
                max_kv_len = longest
        past_len = past_len.to(device=device, dtype=_torch().int64).contiguous()
        past_ptr = past_len.data_ptr()
    bias_strides = (0, 0, 0)
    bias_ptr = None
    if mask_mode == "bias":
        if bias is None:
            raise FdppError("attention: mask_mode bias needs bias (broadcastable to [batch, 1, seq, kv_len])")
        if bias.dtype != query.dtype or bias.device != device:
            raise FdppError("attention: bias must have the query's dtype and device")
        try:
            expanded = bias.expand(batch, 1, seq, kv_capacity)
        except RuntimeError as exc:
            raise FdppError(f"attention: bias of shape {tuple(bias.shape)} does not broadcast to "
                            f"[{batch}, 1, {seq}, {kv_capacity}]") from exc
        bias_strides = (expanded.stride(0), expanded.stride(2), expanded.stride(3))
        bias_ptr = expanded.data_ptr()

    args = AttentionArgs()
    args.dtype = _dtype_code(query)
    args.batch, args.num_heads, args.num_kv_heads, args.seq, args.head_dim = batch, heads, kv_heads, seq, dim
    args.kv_capacity = kv_capacity
    args.max_kv_len = int(max_kv_len or 0)
    args.mask_mode, args.softmax_mode, args.kernel = MASK_MODES[mask_mode], SOFTMAX_MODES[softmax], KERNELS[kernel]
    args.num_splits = int(num_splits)
    if prefill_config not in PREFILL_CONFIGS:
        raise FdppError(f"attention: unknown prefill_config {prefill_config!r} (choose from "
                        f"{', '.join(map(str, PREFILL_CONFIGS))})")
    args.prefill_config = int(prefill_config)
    if decode_combine not in DECODE_COMBINES:
        raise FdppError(f"attention: unknown decode_combine {decode_combine!r} (choose from "
                        f"{', '.join(DECODE_COMBINES)})")
    args.decode_combine = DECODE_COMBINES[decode_combine]
    args.pdl = 0 if pdl else 1  # fdpp_pdl: AUTO (on where the GPU runs the sm_90a code), OFF
    args.scale = float(dim ** -0.5 if scale is None else scale)
    args.phi, args.guard_lo, args.guard_hi = float(phi), float(guard_lo), float(guard_hi)
    args.query, (args.q_stride_b, args.q_stride_h, args.q_stride_s) = query.data_ptr(), query.stride()[:3]
    args.key, (args.k_stride_b, args.k_stride_h, args.k_stride_s) = key.data_ptr(), key.stride()[:3]
    args.value, (args.v_stride_b, args.v_stride_h, args.v_stride_s) = value.data_ptr(), value.stride()[:3]
    args.output, (args.o_stride_b, args.o_stride_h, args.o_stride_s) = out.data_ptr(), out.stride()[:3]
    args.past_len = past_ptr
    args.bias = bias_ptr
    args.bias_stride_b, args.bias_stride_s, args.bias_stride_l = bias_strides
    args.counters = counters.tensor.data_ptr() if counters is not None else None
    args.combine_counters = _combine_counters_ptr(combine_counters, query, key, kernel)
    args.block_table, args.block_table_stride = table[0], table[1]
    args.kv_block_size = KV_BLOCK_SIZE if block_table is not None else 0
    args.softcap, args.window = float(softcap), int(window)
    # keep the tensors the pointers came from alive for the call
    args._keep = (past_len, bias, block_table)
    return args


def _torch():
    import torch

    return torch


def workspace_bytes(args: AttentionArgs) -> int:
    size = ctypes.c_size_t(0)
    fdpp_lib.check(library().fdpp_attention_workspace_bytes(ctypes.byref(args), ctypes.byref(size)),
                   "attention workspace query")
    return size.value


def plan(query, key, value, past_len=None, bias=None, **kwargs) -> tuple[str, int]:
    """(kernel name, decode split count) that attention() would use for these inputs on the current device."""
    out = _torch().empty_like(query)
    args = _args(query, key, value, out, past_len, bias, **_defaults(kwargs))
    kernel, splits = _i32(0), _i32(0)
    fdpp_lib.check(library().fdpp_attention_plan(ctypes.byref(args), ctypes.byref(kernel), ctypes.byref(splits)),
                   "attention plan")
    return KERNEL_NAMES[kernel.value], splits.value


def decode_combines_in_cluster(query, key, value, past_len=None, bias=None, **kwargs) -> bool:
    """Whether attention() would combine these inputs' decode splits inside a thread block cluster."""
    out = _torch().empty_like(query)
    args = _args(query, key, value, out, past_len, bias, **_defaults(kwargs))
    cluster = _i32(0)
    fdpp_lib.check(library().fdpp_attention_decode_cluster(ctypes.byref(args), ctypes.byref(cluster)),
                   "attention decode plan")
    return bool(cluster.value)


def _defaults(kwargs: dict) -> dict:
    defaults = CONTRACT.defaults()
    options = dict(scale=None, phi=defaults["phi"], guard_lo=defaults["guard_lo"], guard_hi=defaults["guard_hi"],
                   mask_mode=defaults["mask_mode"], softmax="unified", kernel="auto", num_splits=0, max_kv_len=None,
                   counters=None, prefill_config=0, decode_combine="auto", pdl=True, combine_counters=None,
                   block_table=None, softcap=defaults["softcap"], window=defaults["window"])
    unknown = set(kwargs) - set(options)
    if unknown:
        raise FdppError(f"attention: unknown option(s) {', '.join(sorted(unknown))}")
    options.update(kwargs)
    return options


def attention(query, key, value, past_len=None, bias=None, *, out=None, workspace=None, stream=None, **kwargs):
    """softmax(scale * q k^T + mask) v for query [B, Hq, S, D] against key/value [B, Hkv, L, D] (the caches), or
    against paged caches: key/value the pools [N, Hkv, KV_BLOCK_SIZE, D] and block_table an int32 [B, W] GPU tensor
    (last dimension contiguous, any row stride) whose entry j of row b is the block holding positions
    [64 j, 64 j + 64) of sequence b; then mask_mode is "past_len" and max_kv_len (a host int bounding past_len + S,
    at most W x 64) is required.

    Options: scale (default D^-0.5), phi, guard_lo, guard_hi (the unified max and its guard window, natural-log
    units), mask_mode ("past_len": key j visible to query i iff j <= past_len[b] + i; "bias"; "none"),
    softcap (> 0: scores = softcap * tanh(scores / softcap) before the mask; 0 none), window (> 0, past_len only:
    key j also needs (past_len[b] + i) - j < window; 0 none),
    softmax ("unified" | "synchronized"), kernel ("auto" | "decode" | "prefill" | "rowwise"), num_splits (decode;
    0 = heuristic), max_kv_len (a bound on past_len + S that sizes the decode grid; default: the cache length,
    or exact when past_len is on the CPU), counters (a Counters to add fallback counts to), prefill_config
    (0 = the plan's tile shape; 1, 2, 4 or 5 force one, see PREFILL_CONFIGS; 4 and 5 need an sm_90 GPU),
    decode_combine ("auto" | "kernel" | "cluster" | "last_block", see DECODE_COMBINES; "cluster" needs an sm_90 GPU
    and 2 to 8 splits, "last_block" combine_counters), pdl (programmatic dependent launch of the decode kernels where
    the GPU supports it; False for a timing baseline or when key/value are written by a kernel that may still run),
    combine_counters (a zeroed int32 tensor of combine_counters_size(query, key) entries on the GPU, left zeroed by
    every call: with it "auto" combines the splits in their last CTA where no cluster fits, one kernel instead of
    two). Defaults of phi, the guard, mask_mode, softcap and window: the op contract's.
    """
    torch = _torch()
    out = torch.empty_like(query) if out is None else out
    args = _args(query, key, value, out, past_len, bias, **_defaults(kwargs))
    need = workspace_bytes(args)
    if need and (workspace is None or workspace.numel() * workspace.element_size() < need):
        if workspace is not None:
            raise FdppError(f"attention: the workspace holds {workspace.numel() * workspace.element_size()} bytes, "
                            f"this call needs {need}")
        workspace = torch.empty(need, dtype=torch.uint8, device=query.device)
    ws_ptr = workspace.data_ptr() if need else None
    fdpp_lib.check(library().fdpp_attention_forward(ctypes.byref(args), ws_ptr, need,
                                                    fdpp_lib.stream_handle(stream)), "attention")
    return out


def rope_append(query, k_new, v_new, k_cache, v_cache, past_len, *, rope_theta: float = 10000.0,
                interleaved: bool = False, q_out=None, counters: Counters | None = None, stream=None,
                rope_dim: int | None = None, inv_freq=None, block_table=None):
    """fdpp::RopeAppend: RoPE on query (into q_out; in place by default) and on k_new, then k_new and v_new
    written into the caches at positions past_len[b] + s. Returns the rotated query.

    block_table: paged caches (k_cache/v_cache the pools [N, Hkv, KV_BLOCK_SIZE, D], the table int32 [B, W] on the
    GPU as in attention()): position p goes to row p % 64 of block table[b, p // 64]; positions >= W x 64 are
    dropped and counted, as positions past a contiguous cache are.

    rope_dim: rotated channels per head (None: head_dim, full rotary; fewer: partial rotary as chatglm2, the other
    channels pass through; 0: no rotation, append only, query copied to q_out). inv_freq: a float32 [rope_dim / 2]
    GPU tensor of angles per position (the model's rotary table, scaling included); None: rope_theta^(-2i/rope_dim).
    For CUDA-graph capture pass past_len (and inv_freq) already on the GPU."""
    torch = _torch()
    device = query.device
    q_out = query if q_out is None else q_out
    for name, tensor in (("query", query), ("q_out", q_out), ("k_new", k_new), ("v_new", v_new),
                         ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_4d(name, tensor, device)
        if tensor.dtype != query.dtype:
            raise FdppError(f"rope_append: {name} is {tensor.dtype} but query is {query.dtype}")
    if q_out.stride() != query.stride():
        raise FdppError("rope_append: q_out must have the query's strides")
    batch, heads, seq, dim = query.shape
    if dim not in SUPPORTED_HEAD_DIMS:
        raise FdppError(f"rope_append: head_dim {dim} is not supported "
                        f"({', '.join(map(str, SUPPORTED_HEAD_DIMS))})")
    if k_new.shape != v_new.shape or k_new.shape[0] != batch or k_new.shape[2] != seq or k_new.shape[3] != dim:
        raise FdppError(f"rope_append: k_new/v_new must be [{batch}, kv_heads, {seq}, {dim}]")
    table = (None, 0, 0)
    capacity = k_cache.shape[2]
    if block_table is not None:
        _check_pools("rope_append", k_cache, v_cache, dim, device)
        if k_cache.shape[1] != k_new.shape[1]:
            raise FdppError(f"rope_append: the pools have {k_cache.shape[1]} KV heads, k_new {k_new.shape[1]}")
        table = _table_args("rope_append", block_table, batch, device)
        capacity = table[2] * KV_BLOCK_SIZE
    elif k_cache.shape != v_cache.shape or k_cache.shape[:2] != k_new.shape[:2] or k_cache.shape[3] != dim:
        raise FdppError("rope_append: k_cache/v_cache must be [batch, kv_heads, capacity, head_dim]")
    if past_len.device.type == "cpu" and int(past_len.max()) + seq > capacity:
        raise FdppError(f"rope_append: positions reach {int(past_len.max()) + seq} but the cache holds "
                        f"{capacity}; grow the cache")
    rope_dim = dim if rope_dim is None else int(rope_dim)
    if rope_dim < 0 or rope_dim > dim or rope_dim % 2:
        raise FdppError(f"rope_append: rope_dim {rope_dim} must be even and in [0, head_dim {dim}] (0: no rotation)")
    if inv_freq is not None:
        if inv_freq.dtype != torch.float32 or inv_freq.device != device or inv_freq.dim() != 1 \
                or inv_freq.numel() != rope_dim // 2 or not inv_freq.is_contiguous():
            raise FdppError(f"rope_append: inv_freq must be a contiguous float32 [{rope_dim // 2}] tensor on {device}, "
                            f"got {tuple(inv_freq.shape)} {inv_freq.dtype} on {inv_freq.device}")
    past_len = past_len.to(device=device, dtype=torch.int64).contiguous()
    a = RopeAppendArgs()
    a.rope_dim = rope_dim
    a.inv_freq = inv_freq.data_ptr() if inv_freq is not None and rope_dim else None
    a.dtype = _dtype_code(query)
    a.batch, a.num_heads, a.num_kv_heads, a.seq, a.head_dim = batch, heads, k_new.shape[1], seq, dim
    a.kv_capacity, a.rope_interleaved, a.rope_theta = capacity, int(interleaved), float(rope_theta)
    a.q_in, a.q_out = query.data_ptr(), q_out.data_ptr()
    a.q_stride_b, a.q_stride_h, a.q_stride_s = query.stride()[:3]
    a.k_new, (a.kn_stride_b, a.kn_stride_h, a.kn_stride_s) = k_new.data_ptr(), k_new.stride()[:3]
    a.v_new, (a.vn_stride_b, a.vn_stride_h, a.vn_stride_s) = v_new.data_ptr(), v_new.stride()[:3]
    a.k_cache, (a.kc_stride_b, a.kc_stride_h, a.kc_stride_s) = k_cache.data_ptr(), k_cache.stride()[:3]
    a.v_cache, (a.vc_stride_b, a.vc_stride_h, a.vc_stride_s) = v_cache.data_ptr(), v_cache.stride()[:3]
    a.past_len = past_len.data_ptr()
    a.counters = counters.tensor.data_ptr() if counters is not None else None
    a.block_table, a.block_table_stride = table[0], table[1]
    a.kv_block_size = KV_BLOCK_SIZE if block_table is not None else 0
    fdpp_lib.check(library().fdpp_rope_append(ctypes.byref(a), fdpp_lib.stream_handle(stream)), "rope_append")
    return q_out
