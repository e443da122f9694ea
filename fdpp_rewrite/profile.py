"""`python -m fdpp_rewrite profile <preset> [<preset> ...]`: the offline half of FlashDecoding++'s heuristic
dataflow (paper section 5, Figure 9b).

For every [N, K] GEMM of the models (fused qkv, o, gate_up / fc1, down / fc2, lm_head) it
1. picks the ImplB (flat GEMM) tile config: every candidate from the library's list, timed at a few decode
   batch sizes, best geometric-mean slowdown wins (if its plan in step 3 leaves an M more than 2% slower than the
   best implementation, the next four are timed at every M as well, and the config with the best plan wins);
2. sweeps M = 1..16, then powers of two and their midpoints up to 256, timing ImplA (GEMV, M <= 8), ImplB
   (M <= 64), ImplC through cuBLASLt and through CUTLASS, and cuBLAS through torch as the peer. By default
   (--timing graph) the way an engine runs them: launches back to back in a CUDA graph over rotating weight
   copies (a decode step: layer after layer of different weights, none in L2), with programmatic dependent
   launch as the library does by default; --timing flushed times each launch alone after an L2 flush;
3. chooses ImplC (cuBLASLt or CUTLASS) and the thresholds M1, M2 that minimise the worst slowdown of the
   dispatched GEMM against the best single implementation over the sweep;
4. merges the result into engines/profiles/<gpu>.json by (n, k, dtype) and draws one PNG per shape.

Shapes already in the file are kept (and not re-measured) unless --force.

This module is the command; the work is in fdpp_rewrite.profile_measure (steps 1-2, on the GPU),
fdpp_rewrite.profile_plan (step 3, the silu_mul plan each entry stores, the merge rule of step 4) and
fdpp_rewrite.profile_plot (the PNGs). The readers of profile files (fdpp_rewrite.profiles) import none of them.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
from pathlib import Path

from fdpp_rewrite.cli_args import add_force
from fdpp_rewrite.errors import FdppError, require_gpu
from fdpp_rewrite.profile_measure import GRAPH_ITERS, M_GRID, TIMINGS, device_facts, profile_shape
from fdpp_rewrite.profile_plan import SEARCH_MS, check_existing_profile, merge_profile, model_shapes
from fdpp_rewrite.profile_plot import plot_entry
from fdpp_rewrite.profiles import gpu_slug
from fdpp_rewrite.resources import engines_dir
from fdpp_rewrite.schemas import PROFILE_SCHEMA


def add_arguments(parser) -> None:
    parser.add_argument("presets", nargs="+", metavar="preset", help="model presets whose GEMM shapes to profile")
    parser.add_argument("--out", type=Path, default=None,
                        help="profile file to create or merge into (default engines/profiles/<gpu>.json)")
    parser.add_argument("--plots", type=Path, default=None,
                        help="folder for one PNG per shape (default engines/profiles/plots/<gpu>)")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--reps", type=int, default=20, help="timed launches per point (median)")
    parser.add_argument("--timing", default="graph", choices=sorted(TIMINGS),
                        help="graph (default): back to back in a CUDA graph over rotating weights, as an engine "
                             "runs a decode step; flushed: each launch alone after an L2 flush")
    parser.add_argument("--quick", action="store_true",
                        help="search only the kw = 128 ImplB configs (2 and 3 stages) instead of every candidate")
    add_force(parser, "(re-measure) shapes already in the profile and their plots")


def _command_line() -> str:
    return "python -m fdpp_rewrite " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def run(args) -> int:
    from fdpp_rewrite.models import get_config

    configs = {name: get_config(name) for name in args.presets}  # FdppError for an unknown preset
    if args.reps < 3:
        raise FdppError("--reps must be at least 3")
    require_gpu("profiling GEMMs")
    import torch
    from tqdm import tqdm

    from fdpp_rewrite.gpu import gemm
    from fdpp_rewrite.gpu.gemm_timing import Timer
    device = device_facts(torch)
    slug = gpu_slug(device["name"])
    out = args.out or engines_dir() / "profiles" / f"{slug}.json"
    plots = args.plots or engines_dir() / "profiles" / "plots" / slug
    existing = None
    if out.exists():
        try:
            existing = json.loads(out.read_text())
        except json.JSONDecodeError as exc:
            raise FdppError(f"{out} is not valid JSON ({exc}); fix or move it, then re-run") from exc
        check_existing_profile(existing, device["name"])  # before the measuring, not after it
    if not gemm.cublaslt_available() and not gemm.cutlass_available():
        raise FdppError("neither cuBLASLt nor the CUTLASS ImplC is available; install torch's nvidia-cublas or "
                        "build with the nvidia-cutlass headers")

    # Unique shapes, named by the layers that use them.
    shapes = {}
    for preset, config in configs.items():
        for layer, n, k in model_shapes(config):
            shapes.setdefault((n, k, args.dtype), []).append(f"{preset}:{layer}")
    known = {(int(e["n"]), int(e["k"]), e["dtype"]) for e in (existing or {}).get("shapes", [])}
    todo = [key for key in sorted(shapes) if args.force or key not in known]
    for key in sorted(shapes):
        if key not in todo:
            print(f"[{key[0]}, {key[1]}] {key[2]} is already in {out}; keeping it (--force re-measures)")
    clobber = [plots / f"{n}x{k}_{dtype}.png" for n, k, dtype in todo if (plots / f"{n}x{k}_{dtype}.png").exists()]
    if clobber and not args.force:
        raise FdppError(f"{clobber[0]} exists (and {len(clobber) - 1} more); pass --force to overwrite the plots")

    timer = Timer(reps=args.reps)
    entries = []
    with tqdm(total=len(todo) * len(M_GRID), desc="profile", unit="M", disable=None) as progress:
        for n, k, dtype in todo:
            progress.set_postfix_str(f"[{n}, {k}]")
            entry = profile_shape(n, k, dtype, timer, device, progress=progress, timing=args.timing, quick=args.quick)
            entry["used_by"] = shapes[(n, k, dtype)]
            entries.append(entry)
            plot_entry(entry, plots / f"{n}x{k}_{dtype}.png",
                       f"{device['name']}: [N={n}, K={k}] {dtype} ({', '.join(entry['used_by'])})\n"
                       f"M1={entry['m1']}, M2={entry['m2']}" + (f", M3={entry['m3']} (wgmma)" if "m3" in entry else "")
                       + f", ImplC={entry['implc']}"
                       + (" at every M" if entry["m2"] == 0 else ""))
            torch.cuda.empty_cache()

    header = {"schema": PROFILE_SCHEMA, "gpu": device["name"], "compute_capability": device["cc"],
              "num_sms": device["num_sms"], "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "command": _command_line(),
              "presets": sorted(configs),
              "method": f"{args.timing}: {TIMINGS[args.timing]} ({args.reps} repetitions for flushed, 10 replays "
                        f"of {GRAPH_ITERS} launches for graph); programmatic dependent launch "
                        f"{'on' if gemm.pdl_supported() else 'off'}; ImplB config by geometric-mean slowdown over M in "
                        f"{list(SEARCH_MS)}"
                        + (" among the kw = 128 cp.async configs and the TMA ones (--quick)" if args.quick else "")}
    data, replaced = merge_profile(existing, header, entries, args.force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, out)

    print(f"\nwrote {out} ({len(data['shapes'])} shapes; {len(entries)} measured, {len(replaced)} replaced), "
          f"plots in {plots}")
    print(f"{'shape':>16} {'m1':>3} {'m2':>3} {'m3':>3} {'implc':>8}  ImplB config            worst/best  used by")
    for e in entries:
        cfg = gemm.config_label(e["implb"])
        print(f"{'[' + str(e['n']) + ', ' + str(e['k']) + ']':>16} {e['m1']:>3} {e['m2']:>3} {e.get('m3', '-'):>3} "
              f"{e['implc']:>8}  "
              f"{cfg:<22} {e['worst_ratio_vs_best_impl']:>9.3f}  {', '.join(e['used_by'])}")
    for e in entries:
        if e.get("implb_wgmma"):
            print(wgmma_summary(e))
    return 0


def wgmma_summary(entry: dict) -> str:
    """One line per profile entry for its wgmma ImplB record (profile_measure.measure_wgmma): microseconds and the
    weight read rate at each M, cuBLASLt's beside them.
        [4096, 4096] wgmma n64 k64 s4 x4 wgmma: M=64 10.0 us 3.36 TB/s (cuBLASLt 12.0 us 2.80 TB/s) ..."""
    from fdpp_rewrite.gpu.gemm import config_label

    record = entry["implb_wgmma"]
    weight = 2 * int(entry["n"]) * int(entry["k"])

    def point(us):
        return f"{us:.1f} us {weight / us / 1e6:.2f} TB/s" if us else "n/a"
    points = [f"M={m} {point(ours)} (cuBLASLt {point(theirs)})"
              for m, ours, theirs in zip(record["m"], record["implb_wgmma_us"], record["cublaslt_us"])]
    return f"[{entry['n']}, {entry['k']}] wgmma {config_label(record['config'])}: " + "; ".join(points)


