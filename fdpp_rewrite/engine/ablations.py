"""Wrapper backends for comparisons: the stock-torch peer and `bench --ablate`'s one-technique-off engines.

Each wraps the engine's backend (backends.py) and replaces the lowering of some fdpp ops, leaving the rest of the
engine (graph, buffers, CUDA graphs) as it is; the product's CudaBackend carries none of them. An Engine takes one
as `wrapper`:

    Engine(folder, wrapper=TorchKernels)                  # bench --kernels torch
    Engine(folder, wrapper=ABLATIONS["sdpa-attention"])   # bench --ablate, one of them

TorchKernels (either backend) is the engine a careful team would write with stock libraries, the peer the
benchmark and ablation compare against: the same graph, norms, RoPE and CUDA graphs, but FlatGemm becomes torch's
GEMM (cuBLAS) with SiLU-mul and the residual as separate ops, and the attention torch's
scaled_dot_product_attention over the cache view (cuDNN / memory-efficient, as torch dispatches a masked call).
An ablation (cuda) switches one technique back to its baseline and keeps the others (ABLATIONS).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fdpp_rewrite.engine.backends import Backend, gemm_inputs, node_score_options, torch_rms_norm
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.ref_ops import gather_pages


def torch_epilogue(y, epilogue: str, residual):
    """A FlatGemm's epilogue as separate torch ops on its GEMM output y."""
    if epilogue == "silu_mul":
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    return y + residual if epilogue == "residual" else y


def torch_flat_gemm(attrs):
    """FlatGemm as stock torch: the GEMM (cuBLAS on a GPU), then SiLU-mul or the residual add as their own ops."""
    epilogue = attrs.get("epilogue", "none")

    def flat_gemm(*inputs):
        x, weight, bias, residual = gemm_inputs(attrs, inputs)
        return torch_epilogue(F.linear(x, weight, bias), epilogue, residual)
    return flat_gemm


def sdpa_attention(attrs):
    """AsyncSoftmaxAttention (mask_mode past_len) as torch's scaled_dot_product_attention with a boolean mask
    built on the device from past_len (key j visible to query i iff j <= past_len[b] + i, within the node's
    sliding window if it has one); soft-capped attention is refused."""
    if attrs.get("mask_mode") != "past_len":
        raise FdppError(f"the baseline attention takes mask_mode past_len, not {attrs.get('mask_mode')!r}")
    options = node_score_options(attrs)
    if options["softcap"]:  # SDPA has no logit soft-capping: a peer without it would run another model
        raise FdppError(f"the SDPA baseline has no logit soft-capping (this graph's attention has softcap "
                        f"{options['softcap']:g}); compare against --kernels fdpp or Hugging Face instead")
    scale, window = float(attrs["scale"]), options["window"]

    def attention(query, key, value, past_len, out=None, block_table=None, max_kv_len=None):
        if block_table is not None:  # a paged engine: the contiguous caches the pools hold (a copy per call)
            key, value = (gather_pages(pool, block_table.long(), max_kv_len) for pool in (key, value))
        batch, heads, seq, _ = query.shape
        length = key.shape[2]
        last = past_len.reshape(batch, 1, 1, 1) + torch.arange(seq, device=query.device).reshape(1, 1, seq, 1)
        keys = torch.arange(length, device=query.device).reshape(1, 1, 1, length)
        mask = keys <= last
        if window:
            mask &= last - keys < window
        result = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
                                                enable_gqa=heads != key.shape[1])
        return result if out is None else out.copy_(result)
    return attention


class Wrapper(Backend):
    """A backend that lowers through `inner` except for the nodes its `replace` gives a step."""

    def __init__(self, inner: Backend):
        self.inner, self.name, self.device = inner, inner.name, inner.device

    def lower_local(self, op_type: str, attrs: dict, name: str):
        fn = self.replace(op_type, attrs, name)
        return fn if fn is not None else self.inner.lower_local(op_type, attrs, name)

    def replace(self, op_type: str, attrs: dict, name: str):
        """This wrapper's step for the node, or None to keep the inner backend's."""
        return None


class TorchKernels(Wrapper):
    """`--kernels torch`: cuBLAS GEMMs with unfused epilogues and SDPA attention (the module docstring)."""

    def replace(self, op_type: str, attrs: dict, name: str):
        if op_type == "FlatGemm":
            return torch_flat_gemm(attrs)
        return sdpa_attention(attrs) if op_type == "AsyncSoftmaxAttention" else None


class Ablation(Wrapper):
    """One technique of the cuda engine switched back to its baseline (`description` says which)."""

    description = ""

    def __init__(self, inner: Backend):
        if inner.name != "cuda":
            raise FdppError("--ablate needs the cuda backend (it switches GPU kernels)")
        super().__init__(inner)


class SynchronizedSoftmax(Ablation):
    description = "asynchronized softmax -> synchronized (per-tile max, rescaled partials)"

    def replace(self, op_type: str, attrs: dict, name: str):
        if op_type != "AsyncSoftmaxAttention":
            return None
        return self.inner.lower_local(op_type, {**attrs, "softmax": "synchronized"}, name)


class CublasLtGemm(Ablation):
    description = "ImplA/ImplB -> cuBLASLt for every GEMM (epilogues still fused)"

    def replace(self, op_type: str, attrs: dict, name: str):
        if op_type != "FlatGemm":
            return None
        # all ImplC: m3 = m2 = 0 drops a wgmma range too
        return self.inner.flat_gemm(attrs, name, {**self.inner.gemm_plan(name), "m1": 0, "m2": 0, "m3": 0})


class StaticDispatch(Ablation):
    description = "profiled per-shape dispatch -> ImplB with its default config for every shape"

    def replace(self, op_type: str, attrs: dict, name: str):
        if op_type != "FlatGemm":
            return None
        self.inner.gemm_plan(name)  # the same refusal as the engine for a GEMM build did not profile
        made = []  # the GEMM on the default plan of the weight's [N, K], made at the first (traced) call

        def flat_gemm(*inputs):
            if not made:
                from fdpp_rewrite.dispatch import IMPLB_MAX_M
                from fdpp_rewrite.gpu import gemm

                weight = inputs[1]
                epilogue = "silu_mul" if attrs.get("epilogue") == "silu_mul" else "none"
                default = gemm.default_plan(weight.shape[0], weight.shape[1], epilogue)
                made.append(self.inner.flat_gemm(attrs, name, {**default, "m1": 0, "m2": IMPLB_MAX_M}))
            return made[0](*inputs)
        return flat_gemm


class UnfusedGlue(Ablation):
    description = "fused GEMM epilogues and RMSNorm kernel -> separate torch ops"

    def replace(self, op_type: str, attrs: dict, name: str):
        if op_type == "RMSNorm":
            return torch_rms_norm(attrs)
        if op_type != "FlatGemm":
            return None
        epilogue = attrs.get("epilogue", "none")
        gemm = self.inner.flat_gemm({**attrs, "epilogue": "none"}, name, self.inner.gemm_plan(name))

        def flat_gemm(*inputs):
            residual = gemm_inputs(attrs, inputs)[3]
            return torch_epilogue(gemm(*inputs), epilogue, residual)
        return flat_gemm


class SdpaAttention(Ablation):
    description = "fdpp attention -> torch SDPA (cuDNN / memory-efficient)"

    def replace(self, op_type: str, attrs: dict, name: str):
        return sdpa_attention(attrs) if op_type == "AsyncSoftmaxAttention" else None


# bench --ablate's names, in the order it runs them
ABLATIONS = {"synchronized-softmax": SynchronizedSoftmax, "cublaslt-gemm": CublasLtGemm,
             "static-dispatch": StaticDispatch, "unfused-glue": UnfusedGlue, "sdpa-attention": SdpaAttention}
