"""Benchmark of fdpp's flat GEMM on the Llama2-7B decode shapes, in one run on one GPU:
the dispatched GEMM, each implementation alone (ImplA GEMV, ImplB flat GEMM, ImplC cuBLASLt / CUTLASS) and
cuBLAS through torch.nn.functional.linear, for M in {1, 2, 4, 8, 16, 32, 64, 128, 256}; then the ablations
(M padded to 8 / 16 / 64, double buffering on / off, one static implementation vs the dispatch) and fused
epilogues against torch's unfused ops. Prints time, TB/s, TFLOP/s and ratios, checks the issue's bars, and
writes results.json (with the command) and plots into --out.

    PYTHONPATH=. python scripts/bench_gemm.py --out out/bench_gemm [--profile engines/profiles/h200.json]

Timing: CUDA events around each launch with L2 flushed before it (median of --reps) -- "flushed"; and, for
the dispatched GEMM and cuBLAS, launches back to back in a CUDA graph over rotating weight copies -- "graph"
(a decode step's steady state). Plans (M1, M2, ImplB config) come from --profile when it has the shape, else
they are measured here with the profiler's own procedure (fdpp_rewrite.profile.profile_shape).
"""

import argparse
import datetime
import json
import math
import shlex
import sys
from pathlib import Path

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
GEOMEAN_MS = [1, 2, 4, 8, 16]
READ_BW_TARGET = 3.85  # TB/s: 90% of the 4.27 TB/s read bandwidth measured on this H200 (shared/anchors)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for results.json and plots")
    p.add_argument("--profile", type=Path, default=None, help="profile JSON to take plans from (default: measure)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ",".join(SHAPES))
    p.add_argument("--force", action="store_true", help="overwrite an existing results.json")
    return p.parse_args()


def geomean(values):
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def bytes_moved(m, n, k):
    return 2 * (n * k + m * k + m * n)


def fmt(t):
    return f"{t:8.2f}" if t is not None else "       -"


def plan_for(n, k, dtype, profile, timer, device):
    from fdpp_rewrite.profile import profile_shape

    if profile is not None:
        for entry in profile.get("shapes", []):
            if int(entry["n"]) == n and int(entry["k"]) == k and entry["dtype"] == dtype:
                return entry, "profile file"
    return profile_shape(n, k, dtype, timer, device), "measured in this run"


def main():
    args = parse_args()
    from fdpp_rewrite.errors import FdppError, require_gpu

    require_gpu("the GEMM benchmark")
    import torch

    from fdpp_rewrite.gpu import gemm
    from fdpp_rewrite.gpu.gemm_timing import Timer, safe_time
    from fdpp_rewrite.profile import ShapeBench, _device_facts

    out_dir = args.out
    results_path = out_dir / "results.json"
    if results_path.exists() and not args.force:
        raise FdppError(f"{results_path} exists; pass --force to overwrite or choose another --out")
    out_dir.mkdir(parents=True, exist_ok=True)
    shapes = {name: SHAPES[name] for name in args.shapes.split(",") if name}
    unknown = [name for name in args.shapes.split(",") if name and name not in SHAPES]
    if unknown:
        raise FdppError(f"unknown shape {unknown[0]!r}; choose from {', '.join(SHAPES)}")
    profile = json.loads(args.profile.read_text()) if args.profile else None
    device = _device_facts(torch)
    timer = Timer(reps=args.reps)
    if not gemm.cublaslt_available():
        print("warning: libcublasLt not found; ImplC cuBLASLt columns will be empty", file=sys.stderr)

    rows, plans, ablation, epilogue_rows = [], {}, [], []
    for name, (n, k) in shapes.items():
        entry, source = plan_for(n, k, args.dtype, profile, timer, device)
        plan = {key: entry[key] for key in ("m1", "m2", "implb", "implc")}
        plans[name] = {"plan": plan, "source": source, "entry": entry}
        search = entry.get("implb_search", {})
        if search:
            print(f"\n{name}: ImplB config search over {search['candidates']} candidates, best first "
                  f"(us at M = {search['m']}):")
            for item in search["top"]:
                c = item["config"]
                print(f"   n{c['n_tile']} k{c['k_tile']} s{c['stages']} x{c['split_k']}: "
                      f"{' '.join(fmt(t) for t in item['us'])}  score {item['score']}")
        w_bytes = 2 * n * k
        copies = max(2, math.ceil(3 * timer.l2_bytes / w_bytes))
        bench = ShapeBench(n, k, args.dtype, max(MS), copies=copies)
        # What reading the weight once costs with the same timing: a plain torch reduction over it.
        w0 = bench.ws[0]
        read_us = timer.flushed_us(lambda: w0.sum())
        read_graph_us = timer.graph_us([lambda c=c: bench.ws[c].sum() for c in range(copies)])
        plans[name]["weight_read"] = {"flushed_us": read_us, "graph_us": read_graph_us}
        print(f"\n== {name} [N={n}, K={k}] {args.dtype}: m1={plan['m1']} m2={plan['m2']} implb={plan['implb']} "
              f"implc={plan['implc']} ({source}); floor at 4.27 TB/s: {w_bytes / 4.27e6:.1f} us; torch.sum of the "
              f"weight: {read_us:.2f} us flushed ({w_bytes / read_us / 1e6:.2f} TB/s), {read_graph_us:.2f} us in a "
              f"graph ({w_bytes / read_graph_us / 1e6:.2f} TB/s)")
        print(f"{'M':>4} {'dispatch':>8} {'impla':>8} {'implb':>8} {'cublasLt':>8} {'cutlass':>8} {'cuBLAS':>8} "
              f"{'TB/s':>6} {'TFLOP/s':>7} {'vs cuBLAS':>9} {'graph':>7} {'no PDL':>7} {'cuBLAS g':>8} {'vs g':>5}")
        for m in MS:
            fns = {"dispatched": bench.launcher("auto", m, plan=plan), "impla": bench.launcher("impla", m),
                   "implb": bench.launcher("implb", m, plan["implb"]), "cublaslt": bench.launcher("cublaslt", m),
                   "cutlass": bench.launcher("cutlass", m), "cublas": bench.launcher("cublas", m)}
            if m > 8:
                del fns["impla"]
            if m > 64:
                del fns["implb"]
            gemm.set_pdl(False)  # flushed timing: each launch alone, nothing to overlap with
            t = {"impla": None, "implb": None, **timer.flushed_many_us(fns)}
            if t["dispatched"] is None or t["cublas"] is None:
                raise FdppError(f"{name} M={m}: the dispatched GEMM or cuBLAS failed to run")
            # Back to back in a graph: with programmatic dependent launch (each GEMM streams its weights while
            # the previous one finishes), without it, and cuBLAS.
            gemm.set_pdl(True)
            g_disp = timer.graph_us([bench.launcher("auto", m, plan=plan, copy=c) for c in range(copies)])
            gemm.set_pdl(False)
            g_disp_nopdl = timer.graph_us([bench.launcher("auto", m, plan=plan, copy=c) for c in range(copies)])
            g_cublas = timer.graph_us([bench.launcher("cublas", m, copy=c) for c in range(copies)])
            moved = bytes_moved(m, n, k)
            singles = [v for key, v in t.items() if key in ("impla", "implb", "cublaslt", "cutlass") and v]
            row = {"shape": name, "n": n, "k": k, "m": m, **{f"{key}_us": v for key, v in t.items()},
                   "graph_dispatched_us": g_disp, "graph_dispatched_no_pdl_us": g_disp_nopdl,
                   "graph_cublas_us": g_cublas,
                   "dispatched_impl": gemm.select(m, plan),
                   "tbps": moved / t["dispatched"] / 1e6, "tflops": 2 * m * n * k / t["dispatched"] / 1e6,
                   "graph_tbps": moved / g_disp / 1e6,
                   "speedup_vs_cublas": t["cublas"] / t["dispatched"], "graph_speedup_vs_cublas": g_cublas / g_disp,
                   "graph_no_pdl_speedup_vs_cublas": g_cublas / g_disp_nopdl,
                   "vs_best_single": t["dispatched"] / min(singles)}
            rows.append(row)
            print(f"{m:>4} {fmt(t['dispatched'])} {fmt(t['impla'])} {fmt(t['implb'])} {fmt(t['cublaslt'])} "
                  f"{fmt(t['cutlass'])} {fmt(t['cublas'])} {row['tbps']:6.2f} {row['tflops']:7.1f} "
                  f"{row['speedup_vs_cublas']:8.3f}x {g_disp:7.2f} {g_disp_nopdl:7.2f} {g_cublas:8.2f} "
                  f"{row['graph_speedup_vs_cublas']:5.2f}")

        # Ablations on ImplB with the shape's config (flushed, PDL off like every flushed timing).
        gemm.set_pdl(False)
        cfg = plan["implb"]
        for m in (1, 8, 16):
            variants = {"pad8": (cfg, 8), "pad16": (cfg, 16), "pad64": (cfg, 64),
                        "stages1_no_overlap": (dict(cfg, stages=1), 8), "stages2_double_buffer": (dict(cfg, stages=2), 8),
                        "stages_profiled": (cfg, 8)}
            rec = {"shape": name, "m": m}
            for label, (c, pad) in variants.items():
                rec[label + "_us"] = safe_time(lambda: timer.flushed_us(bench.launcher("implb", m, c, pad_m=pad)))
            ablation.append(rec)
        # Fused epilogues against torch's separate ops.
        if name in ("gate_up", "o"):
            ep = "silu_mul" if name == "gate_up" else "residual"
            for m in (1, 8):
                try:
                    epilogue_rows.append(time_epilogue(torch, gemm, timer, bench, plan, name, ep, m, n, k))
                except FdppError as exc:
                    print(f"warning: fused-epilogue timing for {name} M={m} failed: {exc}", file=sys.stderr)
        torch.cuda.empty_cache()

    summary = summarize(rows, ablation)
    print_summary(summary, ablation, epilogue_rows)
    gemm.set_pdl(True)
    results = {
        "command": "PYTHONPATH=. python " + " ".join(shlex.quote(a) for a in sys.argv),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "device": device, "torch": torch.__version__, "dtype": args.dtype, "reps": args.reps,
        "method": {"flushed": "CUDA events around each launch, L2 flushed by reading 4x L2 before it, median; "
                              "all implementations of one (shape, M) interleaved rep by rep; PDL off",
                   "graph": "launches back to back in one CUDA graph over rotating weight copies (> 3x L2), "
                            "per-launch time = replay / launches, median of 10 replays; fdpp with programmatic "
                            "dependent launch (graph_dispatched_us) and without (graph_dispatched_no_pdl_us)"},
        "plans": {k: {"plan": v["plan"], "source": v["source"], "weight_read": v.get("weight_read")}
                  for k, v in plans.items()},
        "profile_entries": {k: v["entry"] for k, v in plans.items()},
        "rows": rows, "ablation": ablation, "epilogues": epilogue_rows, "summary": summary,
    }
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "command.txt").write_text(results["command"] + "\n")
    try:
        from plot_gemm import plot_results  # scripts/plot_gemm.py, beside this file

        for path in plot_results(results, out_dir):
            print(f"plot: {path}")
    except ImportError as exc:
        print(f"warning: plots skipped ({exc})", file=sys.stderr)
    print(f"\nwrote {results_path}")
    return 0


def time_epilogue(torch, gemm, timer, bench, plan, name, ep, m, n, k):
    """fdpp's fused epilogue vs torch's linear followed by separate elementwise kernels."""
    import ctypes

    from fdpp_rewrite.gpu import lib as base

    F = torch.nn.functional
    x, w = bench.x[:m], bench.ws[0]
    n_out = n // 2 if ep == "silu_mul" else n
    out = torch.empty(m, n_out, device="cuda", dtype=x.dtype)
    residual = torch.randn(m, n_out, device="cuda", dtype=x.dtype) if ep == "residual" else None
    kernel_ep = "silu_mul" if ep == "silu_mul" else "none"
    args = gemm.make_args(x, w, None, residual, out, kernel_ep)
    plan_c = gemm.Plan.from_dict(plan)
    lib = gemm.library()
    workspace = torch.empty(gemm.workspace_bytes(m, n, bench.dtype, kernel_ep), dtype=torch.uint8, device="cuda")

    def ours():
        status = lib.fdpp_gemm_run(ctypes.byref(args), ctypes.byref(plan_c), workspace.data_ptr(),
                                   workspace.numel(), torch.cuda.current_stream().cuda_stream)
        if status:
            base.check(status, "fused GEMM")

    if ep == "silu_mul":
        def theirs():
            g, u = F.linear(x, w).chunk(2, dim=-1)
            return F.silu(g) * u
    else:
        def theirs():
            return F.linear(x, w) + residual
    t_ours, t_theirs = timer.flushed_us(ours), timer.flushed_us(theirs)
    return {"shape": name, "epilogue": ep, "m": m, "fdpp_fused_us": t_ours, "torch_unfused_us": t_theirs,
            "speedup": t_theirs / t_ours}


def summarize(rows, ablation):
    ratios_small = [r["speedup_vs_cublas"] for r in rows if r["m"] in GEOMEAN_MS]
    worst = min(rows, key=lambda r: r["speedup_vs_cublas"])
    worst_best = max(rows, key=lambda r: r["vs_best_single"])
    low_bw = [r for r in rows if r["m"] <= 8 and r["tbps"] < READ_BW_TARGET]
    low_bw_graph = [r for r in rows if r["m"] <= 8 and r["graph_tbps"] < READ_BW_TARGET]
    static = {}
    for impl in ("impla", "implb", "cublaslt", "cutlass"):
        pairs = [(r[f"{impl}_us"], r["dispatched_us"]) for r in rows if r.get(f"{impl}_us")]
        static[impl] = {"geomean_slowdown_vs_dispatched": geomean([a / b for a, b in pairs]),
                        "points_it_can_run": len(pairs), "points": len(rows)}
    return {
        "bar_every_point_vs_cublas": {"pass": worst["speedup_vs_cublas"] >= 0.98,
                                      "worst": {k: worst[k] for k in ("shape", "m", "speedup_vs_cublas")}},
        "bar_geomean_small_m_vs_cublas": {"pass": geomean(ratios_small) >= 1.10, "value": geomean(ratios_small),
                                          "graph_value": geomean([r["graph_speedup_vs_cublas"] for r in rows
                                                                  if r["m"] in GEOMEAN_MS]),
                                          "graph_no_pdl_value": geomean([r["graph_no_pdl_speedup_vs_cublas"]
                                                                         for r in rows if r["m"] in GEOMEAN_MS])},
        "bar_read_bandwidth_m_le_8": {"pass": not low_bw, "target_tbps": READ_BW_TARGET,
                                      "below": [(r["shape"], r["m"], round(r["tbps"], 3)) for r in low_bw],
                                      "graph_below": [(r["shape"], r["m"], round(r["graph_tbps"], 3))
                                                      for r in low_bw_graph]},
        "bar_dispatch_vs_best_single": {"pass": worst_best["vs_best_single"] <= 1.02,
                                        "worst": {k: worst_best[k] for k in ("shape", "m", "vs_best_single")}},
        "static_single_implementation": static,
    }


def print_summary(summary, ablation, epilogue_rows):
    print("\n== ablation (ImplB, us, L2 flushed)")
    print(f"{'shape':>8} {'M':>3} {'pad8':>8} {'pad16':>8} {'pad64':>8} {'stages=1':>9} {'stages=2':>9} {'profiled':>9}")
    for a in ablation:
        print(f"{a['shape']:>8} {a['m']:>3} {fmt(a['pad8_us'])} {fmt(a['pad16_us'])} {fmt(a['pad64_us'])} "
              f"{fmt(a['stages1_no_overlap_us']):>9} {fmt(a['stages2_double_buffer_us']):>9} "
              f"{fmt(a['stages_profiled_us']):>9}")
    print("\n== static single implementation vs dispatched (geomean slowdown over the points it can run)")
    for impl, s in summary["static_single_implementation"].items():
        print(f"  {impl:>9}: {s['geomean_slowdown_vs_dispatched']:.3f}x over {s['points_it_can_run']}/{s['points']} points")
    if epilogue_rows:
        print("\n== fused epilogue vs torch unfused")
        for e in epilogue_rows:
            print(f"  {e['shape']:>8} {e['epilogue']:>9} M={e['m']}: fdpp {e['fdpp_fused_us']:.2f} us, "
                  f"torch {e['torch_unfused_us']:.2f} us ({e['speedup']:.2f}x)")
    print("\n== bars")
    for key, bar in summary.items():
        if key.startswith("bar_"):
            detail = {k: v for k, v in bar.items() if k != "pass"}
            print(f"  {'PASS' if bar['pass'] else 'FAIL'} {key}: {json.dumps(detail)}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # FdppError and friends: one line, no traceback
        from fdpp_rewrite.errors import FdppError

        if isinstance(exc, FdppError):
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        raise
