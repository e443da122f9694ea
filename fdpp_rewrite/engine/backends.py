"""The fdpp ops for each backend: `cuda` calls the plugin library's kernels through fdpp_rewrite.gpu, `cpu` runs
the reference semantics (fdpp_rewrite.ref_ops for the attention, the same math in torch for the rest).

A backend turns one fdpp node into a step function: `backend.lower(op_type, attrs, name) -> fn(*inputs)`. The
cuda FlatGemm takes its dispatch plan from the engine's plan.json (what build profiled for this GPU), never from
a default: an engine never runs an unprofiled GEMM.

Every backend is a Backend: `lower` applies the tensor-parallel all-reduce after a FlatGemm, `lower_local` is
the node's step on this rank. The stock-torch peer (`--kernels torch`) and `bench --ablate`'s engines are wrapper
backends around these two (ablations.py); this module has only the product's kernels and reference math.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fdpp_rewrite.engine import mixed, ops
from fdpp_rewrite.errors import FdppError

FDPP_OPS = ("FlatGemm", "AsyncSoftmaxAttention", "RMSNorm", "RopeAppend")


def _flat_gemm_math(x, weight, bias, residual, epilogue: str):
    """FlatGemm's contract in float32 torch math (the cpu backend)."""
    y = x.reshape(-1, x.shape[-1]).float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    if epilogue == "silu_mul":
        half = y.shape[-1] // 2
        y = F.silu(y[:, :half]) * y[:, half:]
    elif epilogue == "residual":
        y = y + residual.reshape(y.shape).float()
    return y.reshape(*x.shape[:-1], y.shape[-1]).to(x.dtype)


def gemm_inputs(attrs, inputs):
    """(x, weight, bias, residual) from a FlatGemm node's inputs."""
    x, weight = inputs[0], inputs[1]
    rest = list(inputs[2:])
    bias = rest.pop(0) if attrs.get("has_bias", 0) else None
    residual = rest.pop(0) if attrs.get("epilogue", "none") == "residual" else None
    return x, weight, bias, residual


def rotate_torch(attrs, query, k_new, past_len, inv_freq):
    """RopeAppend's rotation in torch: RoPE on the first rope_dim channels of query and k_new at positions
    past_len[b] + s. Returns (query_out, k_rotated, positions [B, S])."""
    batch, _, seq, dim = query.shape
    rope_dim = int(attrs.get("rope_dim", dim))  # 0: no rotation (OPT), the new rows are only appended
    interleaved = bool(attrs.get("interleaved", 0))
    positions = past_len.reshape(batch, 1) + torch.arange(seq, device=query.device).reshape(1, seq)
    angles = positions.float().reshape(batch, 1, seq, 1) * inv_freq.float().reshape(1, 1, 1, -1)
    cos, sin = angles.cos().to(query.dtype), angles.sin().to(query.dtype)

    def rotate(x):
        if rope_dim == 0:
            return x
        rotated = ops.rotary(x[..., :rope_dim], cos, sin, interleaved)
        return torch.cat((rotated, x[..., rope_dim:]), dim=-1) if rope_dim < dim else rotated

    return rotate(query), rotate(k_new), positions


def rope_append_torch(attrs, query, k_new, v_new, key_cache, value_cache, past_len, inv_freq, block_table=None):
    """fdpp::RopeAppend in torch: RoPE on the first rope_dim channels of query and k_new at positions
    past_len[b] + s, then k_new and v_new written into the caches in place. Returns (query_out, caches).
    With a block_table [B, W] the caches are pools [N, Hkv, block, D] and position p of row b is row p % block of
    block table[b, p // block]; a position past the table's W blocks goes to the null block 0, as the kernel drops it
    (a padding row)."""
    q_out, k_rot, positions = rotate_torch(attrs, query, k_new, past_len, inv_freq)
    batch, seq = positions.shape
    h_index = torch.arange(k_new.shape[1], device=query.device).reshape(1, -1, 1)
    if block_table is None:
        rows = torch.arange(batch, device=query.device).reshape(batch, 1, 1)
        index = (rows, h_index, positions.reshape(batch, 1, seq))
    else:
        block = key_cache.shape[2]
        entry = positions // block
        inside = entry < block_table.shape[1]
        blocks = torch.gather(block_table.long(), 1, entry.clamp(max=block_table.shape[1] - 1)) * inside
        index = (blocks.reshape(batch, 1, seq), h_index, (positions % block).reshape(batch, 1, seq))
    key_cache.index_put_(index, k_rot.to(key_cache.dtype))
    value_cache.index_put_(index, v_new.to(value_cache.dtype))
    return q_out, key_cache, value_cache


def all_reduced(fn, attrs: dict, name: str):
    """A FlatGemm of a tensor-parallel rank (attribute all_reduce, tensor_parallel.py): its output is this rank's
    partial sum, summed over the ranks in place (NCCL on the current stream, so a CUDA graph captures it)."""
    if not attrs.get("all_reduce", 0):
        return fn
    import torch.distributed as dist

    if not dist.is_initialized():
        raise FdppError(f"FlatGemm {name} belongs to one rank of a tensor-parallel engine; load the engine folder "
                        "above its rank folders")

    def step(*inputs):
        y = fn(*inputs)
        dist.all_reduce(y)
        return y
    return step


def node_softmax(attrs: dict) -> str:
    """The node's softmax attribute: "synchronized" where calibrate found no phi for its layer, else "unified"."""
    return attrs.get("softmax", "unified")


def node_score_options(attrs: dict) -> dict:
    """The node's soft-capping and sliding window (Gemma 2, Mistral): softcap and window, 0 = none when absent
    (graphs rewritten before the contract had them)."""
    return {"softcap": float(attrs.get("softcap", 0.0)), "window": int(attrs.get("window", 0))}


class Backend:
    """fdpp node -> step function. `lower` is what the interpreter calls; a FlatGemm of a tensor-parallel rank is
    all-reduced after the step `lower_local` gives (wrappers in ablations.py override lower_local only, so the
    all-reduce comes after their epilogues too)."""

    name: str
    device: torch.device

    def lower(self, op_type: str, attrs: dict, name: str):
        fn = self.lower_local(op_type, attrs, name)
        return all_reduced(fn, attrs, name) if op_type == "FlatGemm" else fn

    def lower_local(self, op_type: str, attrs: dict, name: str):
        raise NotImplementedError


class CpuBackend(Backend):
    """The reference semantics on the CPU (float32 math; what CI tests the lowering and the cache logic with)."""

    name = "cpu"

    def __init__(self, gemm_plans: dict | None = None):
        self.device = torch.device("cpu")
        self.gemm_plans = gemm_plans or {}

    def lower_local(self, op_type: str, attrs: dict, name: str):
        if op_type == "FlatGemm":
            epilogue = attrs.get("epilogue", "none")
            return lambda *inputs: _flat_gemm_math(*gemm_inputs(attrs, inputs), epilogue)
        if op_type == "AsyncSoftmaxAttention":
            from fdpp_rewrite.dtypes import numpy_to_torch, torch_to_numpy
            from fdpp_rewrite.ref_ops import async_softmax_attention, gather_pages

            options = {k: attrs[k] for k in ("scale", "phi", "guard_lo", "guard_hi", "mask_mode")}
            options["softmax"] = node_softmax(attrs)
            options.update(node_score_options(attrs))

            def attention(query, key, value, mask=None, out=None, block_table=None, max_kv_len=None):
                if block_table is not None:  # pools: the contiguous caches they hold, then the same math
                    key, value = (gather_pages(pool, block_table.long(), max_kv_len) for pool in (key, value))
                mask_np = None if mask is None else torch_to_numpy(mask)
                result = async_softmax_attention(torch_to_numpy(query), torch_to_numpy(key), torch_to_numpy(value),
                                                 mask_np, **options)
                result = numpy_to_torch(result)
                return result if out is None else out.copy_(result)
            return attention
        if op_type == "RMSNorm":
            return torch_rms_norm(attrs)
        if op_type == "RopeAppend":
            return lambda *inputs, block_table=None: rope_append_torch(attrs, *inputs, block_table=block_table)
        raise FdppError(f"the cpu backend has no fdpp::{op_type}")


def torch_rms_norm(attrs: dict):
    """fdpp::RMSNorm as torch ops (the cpu backend; the unfused-glue ablation on cuda)."""
    eps = float(attrs.get("epsilon", 1e-5))
    return lambda x, weight: ops.rms_norm_torch(x, weight, eps)


class CudaBackend(Backend):
    """The plugin library's kernels on the current CUDA device. Every launch goes on torch's current stream and
    allocates through torch, so a step is capturable in a CUDA graph."""

    name = "cuda"

    def __init__(self, gemm_plans: dict):
        from fdpp_rewrite.errors import require_gpu

        require_gpu("the cuda engine backend")
        self.device = torch.device("cuda")
        self.gemm_plans = gemm_plans
        # The multi-head decode attention adds its splits in their last CTA instead of a combine kernel where no
        # cluster fits (one launch less); it recomputes a guard-flagged row with the whole CTA, as the combine kernel
        # does (docs/notes-attention.md). Its counters: one zeroed buffer for all layers (their calls run in order on
        # one stream and each leaves it zeroed), the last of this list; a larger one is appended while tracing a
        # larger shape. Earlier ones stay alive: the graphs captured with them keep their addresses.
        self.combine_counter_buffers = []

    def lower_local(self, op_type: str, attrs: dict, name: str):
        if op_type == "FlatGemm":
            return self.flat_gemm(attrs, name, self.gemm_plan(name))
        if op_type == "AsyncSoftmaxAttention":
            return self._attention(attrs)
        if op_type == "RMSNorm":
            from fdpp_rewrite.gpu import norm

            eps = float(attrs.get("epsilon", 1e-5))
            return lambda x, weight: norm.rms_norm(x.contiguous(), weight, eps)
        if op_type == "RopeAppend":
            return self._rope_append(attrs)
        raise FdppError(f"the cuda backend has no fdpp::{op_type}")

    def _attention(self, attrs):
        from fdpp_rewrite.gpu import attention as gpu_attention

        options = {k: attrs[k] for k in ("scale", "phi", "guard_lo", "guard_hi", "mask_mode")}
        options.update(node_score_options(attrs))
        softmax = node_softmax(attrs)  # synchronized where calibrate found no phi for the layer
        sizes = {}  # (query shape, dtype, key shape) -> combine counters the call needs

        def combine_counters(query, key):
            """The engine's counters buffer for a call of these shapes, so that its decode combines in one kernel
            (the last-block combine); None where it needs none, or where a capture meets a shape that was not
            traced first (no allocation inside a capture: that call keeps the combine kernel)."""
            shape = (tuple(query.shape), query.dtype, tuple(key.shape))
            if shape not in sizes:
                sizes[shape] = gpu_attention.combine_counters_size(query, key)
            need, buffers = sizes[shape], self.combine_counter_buffers
            if need and (not buffers or buffers[-1].numel() < need):
                if torch.cuda.is_current_stream_capturing():
                    return None
                buffers.append(torch.zeros(need, dtype=torch.int32, device=self.device))
            return buffers[-1] if need else None

        def attention(query, key, value, mask=None, out=None, block_table=None, max_kv_len=None):
            past_len = mask if options["mask_mode"] == "past_len" else None
            bias = mask if options["mask_mode"] == "bias" else None
            if out is None and query.shape[2] > 1:  # a prompt pass: tokens-major, free to transpose back
                out = mixed.tokens_major(*query.shape, query)
            # GQA keeps the combine kernel: its last block would recompute a group's flagged rows one after
            # another, where the combine kernel gives each row a CTA
            counters = combine_counters(query, key) if query.shape[1] == key.shape[1] else None
            paged = {} if block_table is None else {"block_table": block_table, "max_kv_len": max_kv_len}
            return gpu_attention.attention(query, key, value, past_len, bias, softmax=softmax, out=out,
                                           combine_counters=counters, **paged, **options)
        return attention

    def gemm_plan(self, name: str) -> dict:
        """The dispatch plan build profiled for FlatGemm `name` (never a default: an engine runs no unprofiled GEMM)."""
        plan = self.gemm_plans.get(name)
        if plan is None:
            raise FdppError(f"FlatGemm node {name} has no profiled plan in the engine; rebuild the engine")
        return plan

    def flat_gemm(self, attrs: dict, name: str, plan: dict):
        """FlatGemm `name` on the library's GEMM with `plan`, its SiLU-mul epilogue fused and its residual added
        through the kernel's own pointer."""
        from fdpp_rewrite.gpu import gemm

        epilogue = attrs.get("epilogue", "none")
        if epilogue not in ("none", "silu_mul", "residual"):
            raise FdppError(f"FlatGemm {name}: unknown epilogue {epilogue!r}")
        # the C ABI's epilogue codes are none and silu_mul; a residual is added through its own pointer
        kernel_epilogue = "silu_mul" if epilogue == "silu_mul" else "none"

        def flat_gemm(*inputs):
            x, weight, bias, residual = gemm_inputs(attrs, inputs)
            residual = None if residual is None else residual.contiguous()
            return gemm.linear(x.contiguous(), weight, bias, residual, epilogue=kernel_epilogue, plan=plan)
        return flat_gemm

    def _rope_append(self, attrs):
        """The plugin library's rope_append kernel, writing the caches in place. The query is rotated in place: it
        is a view of the qkv GEMM's output that nothing but this node reads (the rewriter's RopeAppend pass matches
        exactly that form)."""
        from fdpp_rewrite.gpu import attention as gpu_attention

        interleaved, rope_dim = bool(attrs.get("interleaved", 0)), int(attrs["rope_dim"])

        def kernel(query, k_new, v_new, key_cache, value_cache, past_len, inv_freq, block_table=None):
            paged = {} if block_table is None else {"block_table": block_table}
            q_out = gpu_attention.rope_append(query, k_new, v_new, key_cache, value_cache, past_len,
                                              inv_freq=inv_freq if rope_dim else None, rope_dim=rope_dim,
                                              interleaved=interleaved, **paged)
            return q_out, key_cache, value_cache
        return kernel
