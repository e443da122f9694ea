"""The gpt-fast peer: pytorch-labs/gpt-fast's decode recipe (as in shared/anchors/gptfast_peer.py) on a model's
shapes with random weights, timed the way `bench` times the engine, so that `bench --kernels fdpp gptfast` makes
one ratio from one run.

The recipe: fused wqkv, separate w1 / w3 / w2, a static KV cache sized to the prompt + the new tokens (rounded up to
8) and updated by index, SDPA with a sliced causal mask, and decode_one_token (the model + argmax) under
torch.compile(mode="reduce-overhead", fullgraph=True) with coordinate-descent tuning: what an engineer who wants
batch-1 speed in plain PyTorch picks. Per (batch, context), as bench: random prompt ids (seed 0); one warm-up
generation of new_tokens (it compiles and captures the CUDA graph); then the timed generation: the prompt's eager
prefill and the first token (first_token_ms), then new_tokens - 1 decode steps, each timed on the host from its
start to its tokens read back (the step's one synchronization), tokens/s = batch / mean step. The anchors' method
is reported beside it: CUDA events around the same number of steps back to back without the readback
(ms_per_step_events).
"""

from __future__ import annotations

import random
import statistics
import time

from fdpp_rewrite.errors import FdppError

FAMILIES = ("llama", "mistral")  # RMSNorm, SwiGLU, RoPE on whole heads, no biases: the recipe's model


def checked_config(config, name: str, layers: int | None = None):
    """`config` (a ModelConfig named `name` in messages) checked against what the recipe's model is, cut to its
    first `layers` layers if given."""
    from dataclasses import replace

    # the RoPE variant (pairs, scaling) changes no shape: the recipe's own rotation stands in for every one
    partial_rope = config.rotary_dim not in (0, config.head_dim)
    if config.family not in FAMILIES or config.qkv_bias or config.linear_bias or partial_rope:
        raise FdppError(f"{name} is not a plain Llama layout (family {config.family}); the gpt-fast recipe here "
                        f"takes {', '.join(FAMILIES)} models without biases, rotating whole heads, e.g. llama2-7b")
    if layers is not None:
        if not 1 <= layers <= config.num_layers:
            raise FdppError(f"--layers {layers} is outside 1 .. {config.num_layers}")
        config = replace(config, num_layers=layers)
    return config


def build_model(config, dtype):
    """gpt-fast's Transformer for `config`, random weights (normal, std 0.02), on the GPU."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dim, heads, kv_heads, head_dim = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim

    class KVCache(nn.Module):
        def __init__(self, batch, length):
            super().__init__()
            self.register_buffer("k", torch.zeros(batch, kv_heads, length, head_dim, dtype=dtype))
            self.register_buffer("v", torch.zeros(batch, kv_heads, length, head_dim, dtype=dtype))

        def update(self, pos, k, v):
            self.k[:, :, pos] = k
            self.v[:, :, pos] = v
            return self.k, self.v

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + config.norm_eps)).type_as(x) * self.weight

    def rope(x, fc):  # x [B, S, H, D]; fc [S, D/2, 2]
        xs = x.float().reshape(*x.shape[:-1], -1, 2)
        fc = fc.view(1, xs.size(1), 1, xs.size(3), 2)
        out = torch.stack([xs[..., 0] * fc[..., 0] - xs[..., 1] * fc[..., 1],
                           xs[..., 1] * fc[..., 0] + xs[..., 0] * fc[..., 1]], -1)
        return out.flatten(3).type_as(x)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.wqkv = nn.Linear(dim, (heads + 2 * kv_heads) * head_dim, bias=False)
            self.wo = nn.Linear(heads * head_dim, dim, bias=False)
            self.w1 = nn.Linear(dim, config.intermediate_size, bias=False)
            self.w3 = nn.Linear(dim, config.intermediate_size, bias=False)
            self.w2 = nn.Linear(config.intermediate_size, dim, bias=False)
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.cache = None

        def forward(self, x, fc, mask, pos):
            b, s, _ = x.shape
            q, k, v = self.wqkv(self.n1(x)).split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
            q, k, v = q.view(b, s, heads, head_dim), k.view(b, s, kv_heads, head_dim), v.view(b, s, kv_heads, head_dim)
            q, k = rope(q, fc), rope(k, fc)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            k, v = self.cache.update(pos, k, v)
            if heads != kv_heads:  # gpt-fast's GQA (multi-head models skip the copy, as the anchor's run did)
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
            x = x + self.wo(y.transpose(1, 2).contiguous().view(b, s, heads * head_dim))
            h = self.n2(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    class Transformer(nn.Module):
        def __init__(self, max_seq):
            super().__init__()
            self.emb = nn.Embedding(config.vocab_size, dim)
            self.layers = nn.ModuleList(Block() for _ in range(config.num_layers))
            self.norm = RMSNorm()
            self.out = nn.Linear(dim, config.vocab_size, bias=False)
            inv = 1.0 / (config.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
            f = torch.outer(torch.arange(max_seq).float(), inv)
            self.register_buffer("fc", torch.stack([f.cos(), f.sin()], -1))
            self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)))
            self.length = 0

        def setup(self, batch, length):  # gpt-fast sizes the cache to prompt + new tokens, rounded up to 8
            self.length = (length + 7) // 8 * 8
            for layer in self.layers:
                layer.cache = KVCache(batch, self.length).to(self.fc.device)

        def forward(self, idx, pos):
            mask = self.causal[None, None, pos, : self.length]
            fc = self.fc[pos]
            x = self.emb(idx)
            for layer in self.layers:
                x = layer(x, fc, mask, pos)
            return self.out(self.norm(x))

    return Transformer


def compile_settings(points: int):
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor

    inductor.coordinate_descent_tuning = True
    inductor.triton.unique_kernel_names = True
    inductor.fx_graph_cache = True
    # every point's shapes (batch, cache length) compile anew: past the default limit torch would fall back to eager
    dynamo.cache_size_limit = max(dynamo.cache_size_limit, 4 * points)


def generate(model, decode, prompts, new_tokens: int) -> dict:
    """One generation as bench's into the cache model.setup made: eager prefill and the first token, then
    new_tokens - 1 compiled decode steps, each timed to its tokens read back. Returns first_token_s and the step
    times."""
    import torch

    context = prompts.shape[1]
    started = time.perf_counter()
    logits = model(prompts, torch.arange(context, device=prompts.device))
    tok = torch.argmax(logits[:, -1], -1, keepdim=True)
    tok.tolist()
    first = time.perf_counter() - started
    steps = []
    for i in range(new_tokens - 1):
        started = time.perf_counter()
        tok = decode(model, tok, torch.tensor([context + i], device=prompts.device)).clone()
        tok.tolist()  # the step's one synchronization, as bench's sampled tokens
        steps.append(time.perf_counter() - started)
    return {"first_token_s": first, "step_s": steps}


def events_ms_per_step(model, decode, prompts, new_tokens: int) -> float:
    """The anchors' timing: CUDA events around new_tokens - 1 decode steps back to back, no readback."""
    import torch

    batch, context = prompts.shape
    model(prompts, torch.arange(context, device=prompts.device))
    tok = torch.zeros(batch, 1, dtype=torch.int64, device=prompts.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(new_tokens - 1):
        tok = decode(model, tok, torch.tensor([context + i], device=prompts.device)).clone()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (new_tokens - 1)


def bench_point(model, decode, batch: int, context: int, new_tokens: int, vocab: int) -> dict:
    import torch

    rng = random.Random(0)
    prompts = torch.tensor([[rng.randrange(vocab) for _ in range(context)] for _ in range(batch)], device="cuda")
    # one cache per point: new cache tensors would be new static inputs of the captured graph (a capture again)
    model.setup(batch, context + new_tokens)
    started = time.perf_counter()
    generate(model, decode, prompts, new_tokens)  # warm-up: compiles and captures this shape
    warmup = time.perf_counter() - started
    result = generate(model, decode, prompts, new_tokens)
    steps = result["step_s"]
    mean_s = statistics.fmean(steps)
    point = {"kernels": "gptfast", "batch": batch, "context": context, "new_tokens": new_tokens,
             "decode_steps": len(steps), "tokens_per_s": batch / mean_s, "ms_per_step": mean_s * 1e3,
             "ms_per_step_median": statistics.median(steps) * 1e3,
             "ms_per_step_p90": sorted(steps)[int(0.9 * (len(steps) - 1))] * 1e3, "ms_per_step_max": max(steps) * 1e3,
             "first_token_ms": result["first_token_s"] * 1e3,
             "ms_per_step_events": events_ms_per_step(model, decode, prompts, new_tokens), "warmup_s": warmup}
    for layer in model.layers:
        layer.cache = None
    torch.cuda.empty_cache()
    return point


def run_points(config, batches: list, contexts: list, new_tokens: int, progress=print) -> list[dict]:
    """The recipe's model for `config` (checked_config first) with random weights (normal, std 0.02), compiled,
    and one point per (context, batch) in bench's order (contexts outer). `progress` gets a line per point."""
    import torch

    compile_settings(len(batches) * len(contexts))
    max_seq = max(contexts) + new_tokens + 8
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = build_model(config, torch.float16)(max_seq).to(torch.float16)
    for param in model.parameters():
        param.data.normal_(0, 0.02)
    model.eval()

    def decode_one_token(model, x, pos):
        logits = model(x, pos)
        return torch.argmax(logits[:, -1], -1, keepdim=True)

    decode = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
    points = []
    with torch.no_grad():
        for context in contexts:
            for batch in batches:
                point = bench_point(model, decode, batch, context, new_tokens, config.vocab_size)
                points.append(point)
                progress(f"gptfast batch {batch:>3} context {context:>6}: {point['tokens_per_s']:9.1f} tok/s  "
                         f"{point['ms_per_step']:.3f} ms/step ({point['ms_per_step_events']:.3f} without the "
                         f"readback)  first token {point['first_token_ms']:.1f} ms  warm-up {point['warmup_s']:.0f} s")
    del model
    torch.cuda.empty_cache()
    return points
