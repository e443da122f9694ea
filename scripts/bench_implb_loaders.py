"""ImplB's 1024-column pipelines against each other and cuBLAS, in one run (the data behind the loader choice).

    PYTHONPATH=. python3 scripts/bench_implb_loaders.py --out DIR [--shapes o,down] [--ms 1,8] [--stages 2,3]

For each Llama2-7B decode shape and M: cuBLAS (torch.nn.functional.linear), the TMA pipeline (loader "tma" at the
stages of the run-23 profile: 3 for qkv, 2 otherwise) and the row-streaming cp.async pipeline at each --stages, with
every stage's weights issued before the PDL wait (loader "rows") and with only the first unit's (loader "rows1"),
and the cluster-pair pipeline (loader "pair", M <= 16) at each --stages.
Every variant is captured as one CUDA graph of 60 launches over rotating weight copies (together > 3x L2, so every
weight is read cold), with programmatic dependent launch as the library default; all graphs of a row are replayed
in turn, rep by rep, L2 flushed before each replay (Timer.replay_many_us), and the median per launch is reported.
Each kernel's output is also compared with torch's (max |diff|). Writes DIR/implb_loaders.json.
"""

import argparse
import json
import shlex
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
    return ap.parse_args()


def main():
    args = parse_args()
    from fdpp_rewrite.errors import FdppError, require_gpu

    require_gpu("bench_implb_loaders")
    import torch

    from fdpp_rewrite.gpu.gemm_timing import Timer, capture_graph
    from fdpp_rewrite.profile_measure import ShapeBench, weight_copies

    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        raise FdppError(f"unknown shape {unknown[0]!r}; choose from {', '.join(SHAPES)}")
    ms = [int(v) for v in args.ms.split(",")]
    if any(m < 1 or m > 16 for m in ms):
        raise FdppError("--ms: the 1024-column pipelines take 1 <= M <= 16")
    timer = Timer()
    l2 = timer.l2_bytes
    rows = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        copies = weight_copies(n, k, l2)
        bench = ShapeBench(n, k, "float16", max(ms), copies=copies)
        base = {"n_tile": 16, "k_tile": 1024, "split_k": 1}
        variants = {"cublas": ("cublas", None), "tma": ("implb", dict(base, stages=3 if name == "qkv" else 2))}
        for loader in ("rows", "rows1", "pair"):
            for s in args.stages.split(","):
                variants[f"{loader}_s{s}"] = ("implb", dict(base, stages=int(s), loader=loader))
        for m in ms:
            ref = torch.nn.functional.linear(bench.x[:m].float(), bench.ws[0].float())
            graphs, diffs = {}, {}
            for label, (impl, cfg) in variants.items():
                fns = [bench.launcher(impl, m, cfg, copy=c) for c in range(copies)]
                if impl == "implb":
                    bench.y.fill_(float("nan"))
                    fns[0]()
                    torch.cuda.synchronize()
                    diffs[label] = (bench.y[:m].float() - ref).abs().max().item()
                graphs[label] = capture_graph(fns, GRAPH_LAUNCHES)
            us = timer.replay_many_us(graphs, iters=GRAPH_LAUNCHES, replays=args.reps)
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
    path = args.out / "implb_loaders.json"
    path.write_text(json.dumps({"command": command, "gpu": torch.cuda.get_device_name(), "unit": "us per launch",
                                "method": f"CUDA graph of {GRAPH_LAUNCHES} launches over rotating weights, PDL on, "
                                          f"median of {args.reps} replays, variants interleaved, L2 flushed "
                                          "before each replay", "rows": rows},
                               indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    from fdpp_rewrite.errors import run_script

    run_script(main)
