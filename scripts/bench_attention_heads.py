#!/usr/bin/env python3
"""Times fdpp::AsyncSoftmaxAttention at the head sizes beyond 64/128 (80, 96, 256; 128 as the reference point)
against torch SDPA's cuDNN and FLASH backends in one run on this GPU.

    PYTHONPATH=. python3 scripts/bench_attention_heads.py --out out/heads.json [--quick]

Decode: fp16, 32 query heads (MHA), one query token, head_dim {80, 96, 128, 256} x batch {1, 4, 16} x context
{1K, 8K, 32K}; points whose caches do not fit are skipped with a note. Prefill: causal, B=1, 32 heads, L {1K, 4K}.
Both with the unified softmax (the engine's default). Timing is scripts/bench_attention.py's: each variant captured
in one CUDA graph of back-to-back calls over input copies that exceed the L2 four times, replayed in turn with the
peers, median replay time / calls. A peer that refuses a head size is reported with its reason, not a time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_attention import Ours, claim_output, copies_for, result_header, sdpa, time_variants, write_json

HEAD_DIMS = (80, 96, 128, 256)
BATCHES = (1, 4, 16)
CONTEXTS = (1024, 8192, 32768)
PREFILL_LENGTHS = (1024, 4096)
HEADS = 32


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (its folder is created)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out")
    return parser.parse_args(argv)


def bench_point(phase: str, dim: int, batch: int, length: int, quick: bool) -> dict:
    import torch

    queries = 1 if phase == "decode" else length
    kv_bytes = 2 * batch * HEADS * length * dim * 2
    copies = copies_for(kv_bytes) if phase == "decode" else 2
    row = {"phase": phase, "head_dim": dim, "batch": batch, "heads": HEADS, "kv_len": length, "input_copies": copies}
    free, _ = torch.cuda.mem_get_info()
    if copies * (kv_bytes + 2 * batch * HEADS * queries * dim * 2) > 0.8 * free:
        row["note"] = "skipped: the inputs do not fit in free GPU memory"
        return row
    sets = []
    for _ in range(copies):
        q = torch.randn(batch, HEADS, queries, dim, device="cuda", dtype=torch.float16)
        k = torch.randn(batch, HEADS, length, dim, device="cuda", dtype=torch.float16)
        past = torch.full((batch,), length - queries, dtype=torch.int64, device="cuda")
        sets.append((q, k, torch.randn_like(k), past))
    causal = phase == "prefill"
    ours = [Ours(q, k, v, p, softmax="unified") for q, k, v, p in sets]
    row["kernel"] = ours[0].kernel
    time_variants(row, [("ours_us", ours),
                        ("cudnn_us", [sdpa("cudnn", q, k, v, causal=causal) for q, k, v, _ in sets]),
                        ("flash_us", [sdpa("flash", q, k, v, causal=causal) for q, k, v, _ in sets])], quick)
    if row.get("ours_us") and row.get("cudnn_us"):
        row["speed_vs_cudnn"] = row["cudnn_us"] / row["ours_us"]
    if phase == "decode" and row.get("ours_us"):
        row["ours_tbps"] = kv_bytes / (row["ours_us"] * 1e-6) / 1e12
    if phase == "prefill" and row.get("ours_us"):
        row["ours_tflops"] = 4 * batch * HEADS * length * length * dim / 2 / (row["ours_us"] * 1e-6) / 1e12
    q, k, v, _ = (t[:1] for t in sets[0])  # the first sequence against fp32: the whole batch would not fit at 32K
    reference = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    row["max_abs_diff_vs_fp32"] = (ours[0]()[:1].float() - reference).abs().max().item()
    del sets, ours
    torch.cuda.empty_cache()
    return row


def describe(row: dict) -> str:
    if "note" in row:
        return row["note"]
    times = ", ".join(f"{name[:-3]} {row[name]:.1f} us" for name in ("ours_us", "cudnn_us", "flash_us")
                      if row.get(name))
    refused = "; ".join(f"{name[:-5]}: {row[name]}" for name in ("cudnn_note", "flash_note") if row.get(name))
    ratio = f", {row['speed_vs_cudnn']:.2f}x cuDNN" if "speed_vs_cudnn" in row else ""
    return f"{times}{ratio}, max |diff| {row['max_abs_diff_vs_fp32']:.1e}" + (f" ({refused})" if refused else "")


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from fdpp_rewrite.errors import require_gpu

    require_gpu("bench_attention_heads")
    claim_output(args.out, args.force)
    torch.manual_seed(0)
    points = [("decode", d, b, length) for d in HEAD_DIMS for b in BATCHES for length in CONTEXTS]
    points += [("prefill", d, 1, length) for d in HEAD_DIMS for length in PREFILL_LENGTHS]
    rows = []
    for phase, dim, batch, length in points:
        rows.append(bench_point(phase, dim, batch, length, args.quick))
        print(f"{phase} d{dim} B{batch} L{length}: {describe(rows[-1])}", flush=True)
    result = {**result_header("fdpp-bench-attention-heads/1"), "rows": rows}
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    from fdpp_rewrite.errors import run_script

    run_script(main)
