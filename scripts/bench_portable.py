#!/usr/bin/env python3
"""Times the portable kernels (plugins/kernels/portable/: the source the AMD build compiles) beside the Hopper ones on
this GPU, with bench_attention.py's CUDA-graph timing (inputs copied past the L2, median of replays):
decode attention (fp16, 32 query heads, head_dim 128, one query token; MHA and GQA 32/8) and the GEMM at M in
{1, 2, 4, 8, 16} on the Llama2-7B decode shapes (fp16), portable against ImplA / ImplB (the pick of the committed
H200 profile's plan, engines/profiles/h200.json) and cuBLAS. Prints one line per case and the portable / Hopper
ratio; --out also writes them as JSON with the command.

    PYTHONPATH=. python3 scripts/bench_portable.py [--quick] [--out docs/benchmarks/portable-h200.json]
"""

from __future__ import annotations

import argparse
import json
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


def profiled_plan(n, k):
    """The committed profile's plan for [n, k] fp16 (what an engine runs), or None."""
    from fdpp_rewrite.profiles import DEFAULT_PROFILE

    if DEFAULT_PROFILE.is_file():
        for entry in json.loads(DEFAULT_PROFILE.read_text())["shapes"]:
            if (entry["n"], entry["k"], entry["dtype"]) == (n, k, "float16"):
                return {key: entry[key] for key in ("m1", "m2", "implb", "implc")}
    return None


def bench_gemm(n, k, m, quick):
    import torch

    from fdpp_rewrite.gpu import gemm, portable

    sets = []
    for _ in range(copies_for(n * k * 2)):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
        sets.append((x, w, torch.empty(m, n, device="cuda", dtype=torch.float16)))
    plan = profiled_plan(n, k)
    source = "profile" if plan else "unprofiled default"
    plan = plan or gemm.default_plan(n, k)
    row = {"hopper_impl": gemm.select(m, plan), "plan": source}
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
    parser.add_argument("--out", type=Path, help="also write the rows here as JSON (replaced)")
    args = parser.parse_args(argv)
    import torch

    from fdpp_rewrite.errors import require_gpu

    require_gpu("bench_portable")
    gpu = torch.cuda.get_device_name()
    print(f"# {gpu}: portable kernels beside the Hopper ones (us per call, CUDA graphs)")
    rows = []
    for batch, kv_heads, kv_len in DECODE_CASES[:2] if args.quick else DECODE_CASES:
        row = bench_decode(batch, kv_heads, kv_len, args.quick)
        rows.append({"case": "decode", "batch": batch, "heads": 32, "kv_heads": kv_heads, "kv_len": kv_len, **row})
        print(f"decode B={batch} 32/{kv_heads} heads L={kv_len}: hopper {row['hopper']:.1f}, portable "
              f"{row['portable']:.1f} (portable at {ratio(row)} of Hopper's speed)")
    for name, (n, k) in list(GEMM_SHAPES.items())[:1] if args.quick else GEMM_SHAPES.items():
        for m in GEMM_MS:
            row = bench_gemm(n, k, m, args.quick)
            rows.append({"case": "gemm", "name": name, "n": n, "k": k, "m": m, **row})
            print(f"gemm {name} {n}x{k} M={m}: hopper {row['hopper_impl']} {row['hopper']:.1f}, cublas "
                  f"{row['cublas']:.1f}, portable {row['portable']:.1f} (portable at {ratio(row)} of Hopper's speed)")
    if args.out:
        from fdpp_rewrite.atomic import AtomicOutputs

        command = "PYTHONPATH=. python3 scripts/bench_portable.py" + (" --quick" if args.quick else "") + \
            f" --out {args.out}"
        report = {"command": command, "gpu": gpu, "unit": "us per call (CUDA graph replay, inputs past the L2)",
                  "rows": rows}
        outputs = AtomicOutputs([args.out], force=True, option="--out", example="portable-h200.json")
        with outputs:
            outputs.temp(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from fdpp_rewrite.errors import run_script

    run_script(main)
