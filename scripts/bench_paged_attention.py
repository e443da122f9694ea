#!/usr/bin/env python3
"""Times decode attention on paged KV caches (a block table) against the same caches contiguous, on this GPU.

    PYTHONPATH=. python3 scripts/bench_paged_attention.py --out out/bench-paged/results.json

fp16, 32 query heads, head_dim 128, one query token per row, every row at the full context; MHA (32 KV heads,
llama2-7b) and GQA 32/8; batch 1, 16, 64, 256 x context 512, 2K, 8K. Points whose caches do not fit in free GPU
memory are skipped with a printed note.

The paged pool aliases the contiguous caches' storage ([Hkv, B, L, D], so that both views are strided tensors):
viewed [B x W, Hkv, 64, D], block b x W + j holds positions [64 j, 64 j + 64) of row b, so each (block, head) is
the same 16 KB run of rows either way and the two timings read the same bytes. The table maps every row's W
blocks to a random permutation of all B x W blocks (rows read each other's blocks, in scattered order), as an
engine's pool after churn would. What differs is the table indirection and the block order.

Timing (scripts/bench_attention.py's method): each variant captured in one CUDA graph calling it back to back on
enough input copies to exceed the L2 four times over, warmed up, then replayed in turn (contiguous, paged, rep by
rep) with CUDA events; the median replay time / calls. Reports per point: contiguous us, paged us, and the paged /
contiguous speed ratio (contiguous time / paged time: 1.0 = no cost, below 1 = paged slower), with TB/s of K+V read.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_attention import L2_BYTES, Ours, claim_output, result_header, time_variants, write_json

BATCHES = (1, 16, 64, 256)
CONTEXTS = (512, 2048, 8192)
HEADS = ((32, 32), (32, 8))  # (query heads, KV heads): llama2-7b MHA, and GQA 32/8
DIM = 128


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (its folder is created)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out")
    return parser.parse_args(argv)


def copies_for(kv_bytes: int) -> int:
    """Input copies so that one pass over them reads at least 4x the L2 (one copy when the caches alone do)."""
    return max(1, -(-4 * L2_BYTES // kv_bytes))


def cache_and_pool(batch: int, kv_heads: int, context: int, block: int):
    """Random K (or V) storage [Hkv, B, L, D] seen two ways: the contiguous cache [B, Hkv, L, D] (each (row, head)
    a run of L rows, batch stride L x D) and a pool [B x L / block, Hkv, block, D] whose block b x W + j is
    positions [block j, block (j + 1)) of row b (block stride block x D, head stride B x L x D)."""
    import torch

    storage = torch.randn(kv_heads, batch, context, DIM, device="cuda", dtype=torch.float16)
    pool = storage.as_strided((batch * context // block, kv_heads, block, DIM), (block * DIM, batch * context * DIM,
                                                                                  DIM, 1))
    return storage.permute(1, 0, 2, 3), pool


def random_table(batch: int, width: int, generator):
    """int32 [batch, width]: a random permutation of the batch x width pool blocks, one block per table entry."""
    import torch

    return torch.randperm(batch * width, generator=generator).view(batch, width).to(torch.int32)


def bench_point(batch, heads, kv_heads, context, quick, generator):
    """One point: {contiguous_us, paged_us, speed_ratio, ...}, or a row with a note where it does not fit."""
    import torch

    from fdpp_rewrite.gpu.attention import KV_BLOCK_SIZE

    kv_bytes = 2 * batch * kv_heads * context * DIM * 2
    copies = copies_for(kv_bytes)
    row = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "context": context, "head_dim": DIM,
           "kv_bytes": kv_bytes, "input_copies": copies}
    free, _ = torch.cuda.mem_get_info()
    if copies * kv_bytes > 0.85 * free:
        row["note"] = (f"skipped: {copies} x {kv_bytes / 2**30:.1f} GiB of K/V does not fit in "
                       f"{free / 2**30:.1f} GiB free")
        return row
    width = context // KV_BLOCK_SIZE
    contiguous, paged = [], []
    for _ in range(copies):
        q = torch.randn(batch, heads, 1, DIM, device="cuda", dtype=torch.float16)
        (k, k_pool), (v, v_pool) = (cache_and_pool(batch, kv_heads, context, KV_BLOCK_SIZE) for _ in range(2))
        past = torch.full((batch,), context - 1, dtype=torch.int64, device="cuda")
        contiguous.append(Ours(q, k, v, past, softmax="unified", combine_counters=True))
        # The table sends (row b, block j) to pool block perm[b, j]: the keys differ from the contiguous call's
        # (each row reads some other row's positions), the bytes read are the same amount.
        table = random_table(batch, width, generator).cuda()
        paged.append(Ours(q, k_pool, v_pool, past, softmax="unified", combine_counters=True,
                          options={"block_table": table, "max_kv_len": context}))
    row["kernel"], row["splits"], row["cluster_combine"] = contiguous[0].kernel, contiguous[0].splits, \
        contiguous[0].cluster
    row["paged_plan"] = [paged[0].kernel, paged[0].splits, paged[0].cluster]  # the same plan: one grid rule
    time_variants(row, [("contiguous_us", contiguous), ("paged_us", paged)], quick)
    if row.get("contiguous_us") and row.get("paged_us"):
        row["speed_ratio"] = row["contiguous_us"] / row["paged_us"]
        row["contiguous_tbps"] = kv_bytes / (row["contiguous_us"] * 1e-6) / 1e12
        row["paged_tbps"] = kv_bytes / (row["paged_us"] * 1e-6) / 1e12
    del contiguous, paged
    torch.cuda.empty_cache()
    return row


def print_table(rows):
    print(f"\n{'heads':>7} {'B':>4} {'ctx':>5} {'splits':>6} {'contig us':>10} {'paged us':>9} {'ratio':>6} "
          f"{'contig TB/s':>11} {'paged TB/s':>10}")
    for r in rows:
        heads = f"{r['heads']}/{r['kv_heads']}"
        if "speed_ratio" not in r:
            print(f"{heads:>7} {r['batch']:>4} {r['context']:>5}  {r.get('note') or r.get('paged_note') or 'no time'}")
            continue
        print(f"{heads:>7} {r['batch']:>4} {r['context']:>5} {r['splits']:>6} {r['contiguous_us']:>10.1f} "
              f"{r['paged_us']:>9.1f} {r['speed_ratio']:>6.3f} {r['contiguous_tbps']:>11.2f} {r['paged_tbps']:>10.2f}")


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from fdpp_rewrite.errors import require_gpu

    require_gpu("bench_paged_attention")
    claim_output(args.out, args.force)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for heads, kv_heads in HEADS:
        for batch in BATCHES:
            for context in CONTEXTS:
                rows.append(bench_point(batch, heads, kv_heads, context, args.quick, generator))
                r = rows[-1]
                status = r.get("note") or (f"contiguous {r['contiguous_us']:.1f} us, paged {r['paged_us']:.1f} us, "
                                           f"ratio {r['speed_ratio']:.3f}" if "speed_ratio" in r else "no time")
                print(f"{heads}/{kv_heads} B{batch} L{context}: {status}", flush=True)
    print_table(rows)
    result = {**result_header("fdpp-bench-paged-attention/1"), "rows": rows}
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    from fdpp_rewrite.errors import run_script

    run_script(main)
