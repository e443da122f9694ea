"""ImplB's two 1024-column pipelines against each other and cuBLAS, in one run (the data behind the rows loader).

    PYTHONPATH=. python3 scripts/bench_implb_loaders.py --out DIR [--shapes o,down] [--ms 1,8] [--stages 2,3]

For each Llama2-7B decode shape and M: cuBLAS (torch.nn.functional.linear), the TMA pipeline (loader "tma" at the
stages of the run-23 profile: 3 for qkv, 2 otherwise) and the row-streaming cp.async pipeline (loader "rows") at each
--stages. Every variant is captured as one CUDA graph of 60 launches over rotating weight copies (together > 3x
L2, so every weight is read cold), with programmatic dependent launch as the library default; all graphs of a row
are replayed in turn, rep by rep, and the median per launch is reported. Each kernel's output is also compared with
torch's (max |diff|). Writes DIR/implb_loaders.json.
"""

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}
GRAPH_LAUNCHES = 60


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for implb_loaders.json")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down", help="comma-separated subset of " + ",".join(SHAPES))
    ap.add_argument("--ms", default="1,2,4,8,16", help="comma-separated batch sizes (at most 16)")
    ap.add_argument("--stages", default="2,3", help="stages of the rows pipeline to time")
    ap.add_argument("--reps", type=int, default=10, help="graph replays per variant")
    ap.add_argument("--variants", default="old_s3,new_s3", help="EXPERIMENT")
    return ap.parse_args()


def main():
    args = parse_args()
    from fdpp_rewrite.errors import FdppError, require_gpu

    require_gpu("bench_implb_loaders")
    import torch

    from fdpp_rewrite.gpu import gemm
    from fdpp_rewrite.gpu.gemm_timing import capture_graph
    from fdpp_rewrite.profile import ShapeBench, weight_copies

    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        raise FdppError(f"unknown shape {unknown[0]!r}; choose from {', '.join(SHAPES)}")
    ms = [int(v) for v in args.ms.split(",")]
    if any(m < 1 or m > 16 for m in ms):
        raise FdppError("--ms: the 1024-column pipelines take 1 <= M <= 16")
    gemm.set_pdl(True)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        copies = weight_copies(n, k, l2)
        bench = ShapeBench(n, k, "float16", max(ms), copies=copies)
        base = {"n_tile": 16, "k_tile": 1024, "split_k": 1}
        variants = {"cublas": ("cublas", None), "tma": ("implb", dict(base, stages=3 if name == "qkv" else 2))}
        for v in args.variants.split(","):  # label: <loader>_s<stages>_l<lead|x>_c<1|2>
            loader, st, ld, cc = v.split("_")
            variants[v] = ("implb", dict(base, stages=int(st[1:]), loader=loader))
        for m in ms:
            ref = torch.nn.functional.linear(bench.x[:m].float(), bench.ws[0].float())
            graphs, diffs = {}, {}
            for label, (impl, cfg) in variants.items():
                import os, re
                for _v in [k for k in os.environ if k.startswith(("FDPP_ROWS_", "FDPP_PAIR_"))]:
                    os.environ.pop(_v, None)
                if label.count("_") == 3:
                    loader, st, ld, cc = label.split("_")
                    prefix = "FDPP_PAIR_" if loader == "pair" else "FDPP_ROWS_"
                    for key, val in re.findall(r"([osvakpetxymwndgfrizh])(\d+)", cc):
                        os.environ[prefix + {"o": "ROT", "s": "XSPLIT", "v": "WEF", "a": "XCG", "k": "RANKS", "p": "LEAD1", "e": "LEAD2", "t": "TWO", "x": "XEVEN", "y": "SLOTEVEN", "m": "CAST", "w": "SKEW", "n": "TILES", "d": "DEFER", "g": "SPLITW", "f": "PF", "r": "XREG", "i": "ACC", "z": "NOMATH", "h": "HALF"}[key]] = val
                    if int(st[1:]) * (16 + m) * 2048 > 227 * 1024:
                        continue
                fns = [bench.launcher(impl, m, cfg, copy=c) for c in range(copies)]
                if impl == "implb":
                    bench.y.fill_(float("nan"))
                    fns[0]()
                    torch.cuda.synchronize()
                    diffs[label] = (bench.y[:m].float() - ref).abs().max().item()
                graphs[label] = capture_graph(fns, GRAPH_LAUNCHES)
                if impl == "implb":  # again after replays: the shared buffers must come back to zero
                    for _ in range(3):
                        graphs[label].replay()
                    bench.y.fill_(float("nan"))
                    fns[0]()
                    torch.cuda.synchronize()
                    diffs[label] = max(diffs[label], (bench.y[:m].float() - ref).abs().max().item())
            times = {label: [] for label in graphs}
            for g in graphs.values():
                g.replay()
            for _ in range(args.reps):
                for label, g in graphs.items():
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    g.replay()
                    end.record()
                    end.synchronize()
                    times[label].append(start.elapsed_time(end) * 1000 / GRAPH_LAUNCHES)
            us = {label: statistics.median(t) for label, t in times.items()}
            tbps = {label: 2 * n * k / t / 1e6 for label, t in us.items()}
            rows.append({"shape": name, "n": n, "k": k, "m": m, "us": us, "weight_tbps": tbps,
                         "max_abs_diff_vs_torch_fp32": diffs, "configs": {lab: v[1] for lab, v in variants.items()}})
            print(f"{name:8} M={m:2}  " + "  ".join(f"{lab} {t:7.2f}" for lab, t in us.items())
                  + "  | max|diff| " + ", ".join(f"{lab} {d:.1e}" for lab, d in diffs.items()), flush=True)
            del graphs
        del bench
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=. python3 " + " ".join(shlex.quote(a) for a in sys.argv)
    path = args.out / "onecta.json"
    path.write_text(json.dumps({"command": command, "gpu": torch.cuda.get_device_name(), "unit": "us per launch",
                                "method": f"CUDA graph of {GRAPH_LAUNCHES} launches over rotating weights, PDL on, "
                                          f"median of {args.reps} replays, variants interleaved", "rows": rows},
                               indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # FdppError: one line, no traceback
        from fdpp_rewrite.errors import FdppError

        if isinstance(exc, FdppError):
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        raise
