#!/usr/bin/env python3
"""Times the portable kernels (plugins/kernels/portable/: the source the AMD build compiles) beside the Hopper ones on
this GPU, with bench_attention.py's CUDA-graph timing (inputs copied past the L2, median of replays):
decode attention (fp16, 32 query heads, head_dim 128, one query token; MHA and GQA 32/8) and the GEMM at M in
{1, 2, 4, 8, 16} on the Llama2-7B decode shapes (fp16), portable against ImplA / ImplB (the plan's pick) and cuBLAS.
Prints one line per case and the portable / Hopper ratio; writes nothing.

    PYTHONPATH=. python3 scripts/bench_portable.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import copies_for, time_variants  # noqa: E402

DECODE_CASES = [(1, 32, 1024), (1, 32, 8192), (8, 32, 8192), (1, 8, 8192), (8, 8, 32768)]  # (batch, kv heads, L)
GEMM_SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}
GEMM_MS = [1, 2, 4, 8, 16]


def bench_decode(batch, kv_heads, kv_len, quick):
    import torch

    from fdpp_rewrite.gpu import attention, portable

    heads, dim = 32, 128
    sets = []
    for _ in range(copies_for(2 * batch * kv_heads * kv_len * dim * 2)):
        q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=torch.float16)
        k = torch.randn(batch, kv_heads, kv_len, dim, device="cuda", dtype=torch.float16)
        past = torch.full((batch,), kv_len - 1, dtype=torch.int64, device="cuda")
        sets.append((q, k, torch.randn_like(k), past, torch.empty_like(q)))

    def calls(fn):
        out = []
        for q, k, v, past, o in sets:
            workspace = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
            out.append(lambda q=q, k=k, v=v, p=past, o=o, w=workspace: fn(q, k, v, p, out=o, workspace=w,
                                                                         max_kv_len=kv_len))
        return out

    row = {}
    time_variants(row, [("hopper", calls(attention.attention)), ("portable", calls(portable.attention))], quick)
    return row


def bench_gemm(n, k, m, quick):
    import torch

    from fdpp_rewrite.gpu import gemm, portable

    sets = []
    for _ in range(copies_for(n * k * 2)):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
        sets.append((x, w, torch.empty(m, n, device="cuda", dtype=torch.float16)))
    plan = gemm.default_plan(n, k)
    hopper_impl = gemm.select(m, plan)
    row = {"hopper_impl": hopper_impl}
    variants = [
        ("portable", [lambda x=x, w=w, o=o: portable.linear(x, w, out=o) for x, w, o in sets]),
        ("hopper", [lambda x=x, w=w, o=o: gemm.linear(x, w, plan=plan, out=o) for x, w, o in sets]),
        ("cublas", [lambda x=x, w=w, o=o: torch.matmul(x, w.t(), out=o) for x, w, o in sets]),
    ]
    time_variants(row, variants, quick)
    return row


def ratio(row):
    return f"{row['hopper'] / row['portable']:.2f}x" if row.get("hopper") and row.get("portable") else "n/a"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases and repetitions (a smoke run)")
    args = parser.parse_args(argv)
    import torch

    print(f"# {torch.cuda.get_device_name()}: portable kernels beside the Hopper ones (us per call, CUDA graphs)")
    for batch, kv_heads, kv_len in DECODE_CASES[:2] if args.quick else DECODE_CASES:
        row = bench_decode(batch, kv_heads, kv_len, args.quick)
        print(f"decode B={batch} 32/{kv_heads} heads L={kv_len}: hopper {row['hopper']:.1f}, portable "
              f"{row['portable']:.1f} (portable at {ratio(row)} of Hopper's speed)")
    for name, (n, k) in list(GEMM_SHAPES.items())[:1] if args.quick else GEMM_SHAPES.items():
        for m in GEMM_MS:
            row = bench_gemm(n, k, m, args.quick)
            print(f"gemm {name} {n}x{k} M={m}: hopper {row['hopper_impl']} {row['hopper']:.1f}, cublas "
                  f"{row['cublas']:.1f}, portable {row['portable']:.1f} (portable at {ratio(row)} of Hopper's speed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
