#!/usr/bin/env python3
"""A small run of every attention kernel path, for compute-sanitizer:

    PYTHONPATH=. compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/sanitize_attention.py
    PYTHONPATH=. compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/sanitize_attention.py

Decode (both softmax variants, every combine, GQA, odd lengths, several tokens, the fallback), prefill (both, causal
with a past, bias), rowwise float32 and rope_append, each once on small shapes; then the same paths on paged caches
(pools exactly as large as the tables need, so a read past a block or past the table lands outside them); then head
dims 80, 96 and 256 with a soft cap and a window, each tensor contiguous at its head_dim with the last row ending its
allocation (a read past head_dim 80/96, which run in the 128-wide kernels, leaves it).

torch's caching allocator is off here (PYTORCH_NO_CUDA_MEMORY_CACHING=1, set before torch starts): each tensor is its
own cudaMalloc, whose end memcheck knows, instead of a slice of a larger cached segment."""

import os


def main() -> int:
    os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")  # read at torch's first CUDA allocation
    import torch

    from fdpp_rewrite.errors import require_gpu
    from fdpp_rewrite.gpu import attention as att

    require_gpu("sanitize_attention")

    torch.manual_seed(0)
    counters = att.Counters()
    combine_counters = torch.zeros(64, dtype=torch.int32, device="cuda")  # the last-block combine's, any call here

    def inputs(batch, heads, kv_heads, seq, cap, dim, dtype=torch.float16):
        q = torch.randn(batch, heads, seq, dim, device="cuda").to(dtype)
        k = torch.randn(batch, kv_heads, cap, dim, device="cuda").to(dtype)
        return q, k, torch.randn_like(k)

    configs = (1, 2, 4, 5) if torch.cuda.get_device_capability()[0] == 9 else (1, 2)  # 4 and 5: sm_90 only
    for dtype in (torch.float16, torch.bfloat16):
        for dim in (64, 128):
            q, k, v = inputs(3, 6, 2, 1, 200, dim, dtype)
            past = torch.tensor([199, 70, 0], device="cuda")
            # The plan's combine (a cluster on sm_90: 4 splits), the combine kernel, the last-block combine, and 3
            # splits of which sequence 2's two are empty (kv length 1), planned with the counters.
            for softmax in ("unified", "synchronized"):
                for combine in ("auto", "kernel", "last_block"):
                    for phi in (0.0, -50.0):
                        att.attention(q, k, v, past, softmax=softmax, kernel="decode", phi=phi, num_splits=4,
                                      decode_combine=combine, counters=counters, combine_counters=combine_counters)
                att.attention(q, k, v, past, softmax=softmax, kernel="decode", num_splits=3, counters=counters,
                              combine_counters=combine_counters)
            q, k, v = inputs(2, 4, 4, 3, 150, dim, dtype)
            att.attention(q, k, v, torch.tensor([100, 147], device="cuda"), kernel="decode", counters=counters)
            # The other pipeline depths decode_stages() picks: 2 stages for more CTAs than SMs (8 x 32 heads), 4 for
            # one CTA per SM streaming 33 key tiles (one split).
            q, k, v = inputs(8, 32, 32, 1, 200, dim, dtype)
            att.attention(q, k, v, torch.full((8,), 199, device="cuda"), kernel="decode", counters=counters)
            tile = 64 if dim == 128 else 128
            q, k, v = inputs(1, 2, 2, 1, 33 * tile, dim, dtype)
            att.attention(q, k, v, torch.tensor([33 * tile - 1], device="cuda"), kernel="decode", num_splits=1,
                          counters=counters)
            q, k, v = inputs(1, 4, 2, 300, 333, dim, dtype)
            past = torch.tensor([30], device="cuda")
            for config in configs:  # every prefill tile shape the plan can run or be forced to
                for softmax in ("unified", "synchronized"):
                    att.attention(q, k, v, past, softmax=softmax, kernel="prefill", prefill_config=config,
                                  counters=counters)
            k[:, 0, 100] *= 40  # a spike outside the anchor tiles: the in-kernel fallback runs
            for config in configs:
                att.attention(q, k, v, past, kernel="prefill", prefill_config=config, counters=counters)
            bias = torch.zeros(1, 1, 300, 333, device="cuda", dtype=dtype)
            bias[..., 200:] = float("-inf")
            att.attention(q, k, v, bias=bias, mask_mode="bias", kernel="prefill", counters=counters)
    q, k, v = inputs(2, 4, 2, 2, 100, 128, torch.float32)
    att.attention(q, k, v, torch.tensor([50, 98], device="cuda"), counters=counters)
    q, k_new, v_new = inputs(2, 4, 2, 2, 2, 64)
    k_cache = torch.zeros(2, 2, 64, 64, device="cuda", dtype=torch.float16)
    v_cache = torch.zeros_like(k_cache)
    att.rope_append(q, k_new, v_new, k_cache, v_cache, torch.tensor([10, 63], device="cuda"), counters=counters)
    paged_cases(att, counters, combine_counters, configs)
    head_dim_cases(att, counters, combine_counters, configs)
    torch.cuda.synchronize()
    assert not combine_counters.any().item(), "a decode call left its combine counters non-zero"
    print(f"sanitize_attention: ran; fallback rows {counters.fallback_rows}, dropped/clamped {counters.clamped_rows}")
    return 0


def paged_cases(att, counters, combine_counters, configs):
    """Paged K/V: pools [N, Hkv, 64, D] (and a [N, 64, Hkv, D] layout: per-row prefetch) in a random block order,
    the table exactly as wide as the longest row needs, every decode combine, the fallback, prefill tile shapes,
    rowwise and rope_append with positions past the table."""
    import torch

    block = att.KV_BLOCK_SIZE

    def pools(lengths, kv_heads, dim, dtype, interleaved=False):
        width = -(-max(lengths) // block)
        count = 1 + sum(-(-n // block) for n in lengths)  # the null block and what the rows use
        shape = (count, block, kv_heads, dim) if interleaved else (count, kv_heads, block, dim)
        k = torch.randn(shape, device="cuda").to(dtype)
        k, v = (k.transpose(1, 2), torch.randn_like(k).transpose(1, 2)) if interleaved else (k, torch.randn_like(k))
        ids = (torch.randperm(count - 1) + 1).tolist()
        table = torch.zeros(len(lengths), width, dtype=torch.int32)
        for b, n in enumerate(lengths):
            for j in range(-(-n // block)):
                table[b, j] = ids.pop()
        return k, v, table.cuda(), width * block

    for dtype in (torch.float16, torch.bfloat16):
        for dim in (64, 128):
            lengths = [200, 71, 1]
            k, v, table, cap = pools(lengths, 2, dim, dtype, interleaved=dim == 64)
            q = torch.randn(3, 6, 1, dim, device="cuda").to(dtype)
            past = torch.tensor([n - 1 for n in lengths], device="cuda")
            for combine in ("auto", "kernel", "last_block"):
                for phi in (0.0, -50.0):
                    att.attention(q, k, v, past, block_table=table, max_kv_len=cap, kernel="decode", phi=phi,
                                  num_splits=4, decode_combine=combine, counters=counters,
                                  combine_counters=combine_counters)
            lengths = [64, 128]  # whole blocks: head_dim 64's 128-key tile ends the one-column row exactly
            k, v, table, cap = pools(lengths, 2, dim, dtype)
            q = torch.randn(2, 4, 1, dim, device="cuda").to(dtype)
            att.attention(q, k, v, torch.tensor([63, 127], device="cuda"), block_table=table, max_kv_len=cap,
                          kernel="decode", num_splits=1, counters=counters)
            lengths = [2100, 700]  # one split of many tiles: block ids read one tile ahead (4 stages at d128)
            k, v, table, cap = pools(lengths, 2, dim, dtype)
            q = torch.randn(2, 8, 1, dim, device="cuda").to(dtype)
            att.attention(q, k, v, torch.tensor([n - 1 for n in lengths], device="cuda"), block_table=table,
                          max_kv_len=cap, kernel="decode", num_splits=1, counters=counters)
            lengths = [330, 300]
            k, v, table, cap = pools(lengths, 2, dim, dtype)
            q = torch.randn(2, 4, 300, dim, device="cuda").to(dtype)
            past = torch.tensor([30, 0], device="cuda")
            for config in configs:
                att.attention(q, k, v, past, block_table=table, max_kv_len=cap, kernel="prefill",
                              prefill_config=config, counters=counters)
            k[:, 0, 36] *= 40  # a spike in some block: the in-kernel fallback reads through the table
            att.attention(q, k, v, past, block_table=table, max_kv_len=cap, kernel="prefill", counters=counters)
    k, v, table, cap = pools([100, 64], 2, 128, torch.float32)
    q = torch.randn(2, 4, 2, 128, device="cuda")
    att.attention(q, k, v, torch.tensor([98, 62], device="cuda"), block_table=table, max_kv_len=cap,
                  counters=counters)
    k, v, table, cap = pools([128, 64], 2, 64, torch.float16)
    q, k_new, v_new = (torch.randn(2, h, 3, 64, device="cuda").to(torch.float16) for h in (4, 2, 2))
    # Row 0's last token (position 128) falls past the table: dropped. Row 1's position 64 has table entry 0: it
    # lands in the null block, as a padding row's write does in an engine.
    att.rope_append(q, k_new, v_new, k, v, torch.tensor([126, 62], device="cuda"), block_table=table,
                    counters=counters)


def head_dim_cases(att, counters, combine_counters, configs):
    """Head dims 80 and 96 (inside the 128 kernels: chunks past head_dim must be zero-filled, never read) and 256,
    with softcap 30 and window 100: decode in every combine and with every row recomputed (phi far off), prefill in
    every tile shape built for the size and with the in-kernel fallback, rowwise. q, k, v and the output are each
    their own allocation, contiguous at head_dim, and the last sequence fills its cache: the last row of each tensor
    is read (or written) and ends its allocation."""
    import torch

    cap = dict(softcap=30.0, window=100, counters=counters)
    for dim in (80, 96, 256):
        dtype = torch.bfloat16 if dim == 96 else torch.float16
        q = torch.randn(3, 6, 2, dim, device="cuda").to(dtype)
        k = torch.randn(3, 2, 300, dim, device="cuda").to(dtype)
        v = torch.randn_like(k)
        past = torch.tensor([150, 40, 298], device="cuda")  # sequence 2 reads key 299, the caches' last row
        for combine in ("auto", "kernel", "last_block"):
            for phi in (0.0, -1000.0):
                att.attention(q, k, v, past, kernel="decode", num_splits=4, decode_combine=combine, phi=phi,
                              combine_counters=combine_counters, **cap)
        att.attention(q, k, v, past, kernel="rowwise", **cap)
        q = torch.randn(2, 4, 300, dim, device="cuda").to(dtype)
        k = torch.randn(2, 2, 333, dim, device="cuda").to(dtype)
        v = torch.randn_like(k)
        past = torch.tensor([10, 33], device="cuda")  # sequence 1: keys 0..332, the whole cache
        # shape 1 takes no cap, window or zero-filled dims; head_dim 256 runs shape 2 only
        built = [c for c in configs if c != 1 and (dim != 256 or c == 2)]
        for config in built:
            for softmax in ("unified", "synchronized"):
                att.attention(q, k, v, past, kernel="prefill", prefill_config=config, softmax=softmax, **cap)
        # Key 100 of head 0 scaled up: capped near 30, far above the anchor of the last rows, whose anchor tiles
        # (tile 0 and the last three) leave it out under a window of 320: the in-kernel fallback.
        k[:, 0, 100] *= 40
        for config in built:
            att.attention(q, k, v, past, kernel="prefill", prefill_config=config, **{**cap, "window": 320})


if __name__ == "__main__":
    from fdpp_rewrite.errors import run_script

    run_script(main)
