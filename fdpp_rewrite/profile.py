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
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shlex
import sys
from pathlib import Path

from fdpp_rewrite.dispatch import IMPLA_MAX_M, IMPLB_MAX_M, select_impl
from fdpp_rewrite.errors import FdppError, require_gpu
from fdpp_rewrite.resources import engines_dir
from fdpp_rewrite.schemas import PROFILE_SCHEMA

M_GRID = list(range(1, 17)) + [24, 32, 48, 64, 96, 128, 192, 256]
SEARCH_MS = (1, 2, 4, 8, 16)  # the decode batch sizes ImplB is for; ImplC takes over at larger M
IMPLS = ("impla", "implb", "cublaslt", "cutlass")
TIMINGS = {
    "graph": "launches back to back in one CUDA graph over rotating weight copies (none in L2 when read), time "
             "per launch = replay / launches, median of replays; programmatic dependent launch as the library "
             "default (on, sm_90+)",
    "flushed": "CUDA events around one launch after an L2 flush (reading 4x the L2), median of repetitions",
}
GRAPH_ITERS = 60  # launches per graph replay
IMPLB_ALTERNATIVES = 4  # the search's runners-up whose whole curve is timed when the winner's plan misses


# ---- pure logic (CPU-tested) --------------------------------------------------------------------------------
def model_shapes(config) -> list:
    """[(name, n, k)] of a model's linear layers as the rewriter fuses them (q/k/v into qkv, gate/up into
    gate_up for SwiGLU), plus the lm_head."""
    c = config
    shapes = [("qkv", c.q_dim + 2 * c.kv_dim, c.hidden_size), ("o", c.hidden_size, c.q_dim)]
    if c.activation == "swiglu":
        shapes += [("gate_up", 2 * c.intermediate_size, c.hidden_size), ("down", c.hidden_size, c.intermediate_size)]
    else:
        shapes += [("fc1", c.intermediate_size, c.hidden_size), ("fc2", c.hidden_size, c.intermediate_size)]
    shapes.append(("lm_head", c.vocab_size, c.hidden_size))
    return shapes


def _valid(t) -> bool:
    return t is not None and math.isfinite(t) and t > 0


def choose_plan(ms: list, curves: dict, best_floor: list = None) -> dict:
    """m1, m2 and implc from measured curves ({"impla_us": [...], "implb_us": [...], "cublaslt_us": [...],
    "cutlass_us": [...]}, None where an implementation cannot run).

    ImplC is whichever library is faster in total above M = 16 (over all M when it has no points there). Then
    every (m1, m2) with ImplA valid on every M <= m1 and ImplB valid on every M in (m1, m2] is scored against
    the best of ImplA/ImplB/ImplC at each M: first by how many M it is more than 2% slower there, then by the
    geometric mean of its slowdowns (to 0.1%), then by the worst one. (Counting misses first keeps one outlier
    point -- a library heuristic switching algorithms at a single M -- from dragging a threshold across many
    good points.) Among plans tied on all three, the one with the smaller m1 and then the larger m2: ImplB's
    time is its weight stream, which holds from machine to machine where a library's time at a tied M may not
    (docs/notes-gemm.md). Example: ms [8, 16], ImplB [45.4, 60], cuBLASLt [45.4, 50] -> m2 = 8 (tied at M = 8,
    the larger m2 wins), ImplC above. best_floor: per M, the fastest time of the ImplB configs timed besides
    this curve's (pick_implb_curve), so that the best single implementation is the best of all of them. Returns
    {"m1", "m2", "implc", "worst_ratio", "mean_ratio", "misses"}."""
    n = len(ms)

    def series(name):
        values = curves.get(f"{name}_us") or [None] * n
        return [t if _valid(t) else None for t in values]

    a, b = series("impla"), series("implb")
    c_options = {name: series(name) for name in ("cublaslt", "cutlass") if any(_valid(t) for t in series(name))}
    if not c_options:
        raise FdppError("no ImplC measurement (neither cuBLASLt nor CUTLASS ran); cannot choose thresholds")

    def total(values, lo):
        picked = [t for m, t in zip(ms, values) if m > lo]
        if not picked or any(t is None for t in picked):
            return math.inf
        return sum(picked)

    implc = min(c_options, key=lambda name: (total(c_options[name], 16) if any(m > 16 for m in ms)
                                             else total(c_options[name], 0), name))
    c = c_options[implc]
    best = []
    for i in range(n):
        options = [t for t in (a[i], b[i], c[i]) if t is not None]
        if best_floor is not None and _valid(best_floor[i]):
            options.append(best_floor[i])
        best.append(min(options) if options else None)

    m1_options = [0] + [m for i, m in enumerate(ms) if m <= IMPLA_MAX_M and all(a[j] is not None for j in range(i + 1))]
    winner = None
    for m1 in m1_options:
        m2_options = [m1] + [m for i, m in enumerate(ms) if m1 < m <= IMPLB_MAX_M and
                             all(b[j] is not None for j in range(n) if m1 < ms[j] <= m)]
        for m2 in m2_options:
            ratios = []
            for i, m in enumerate(ms):
                impl = select_impl(m, {"m1": m1, "m2": m2, "implc": implc})
                t = {"impla": a, "implb": b}.get(impl, c)[i]
                ratios.append(t / best[i] if t is not None and best[i] is not None else math.inf)
            if not all(math.isfinite(r) for r in ratios):
                continue
            misses = sum(r > 1.02 + 1e-9 for r in ratios)
            mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            key = (misses, round(mean, 3), round(max(ratios), 3), m1, -m2)
            if winner is None or key < winner[0]:
                winner = (key, m1, m2)
    if winner is None:
        raise FdppError("the measured curves leave some M without a working implementation")
    return {"m1": winner[1], "m2": winner[2], "implc": implc, "worst_ratio": winner[0][2], "mean_ratio": winner[0][1],
            "misses": winner[0][0]}


# A GEMM with the SiLU-mul epilogue whose plan hands part of the decode batches to ImplC runs two kernels there:
# the ImplC GEMM, then the SiLU-mul pass. fused_decode_plan keeps those batches on ImplB, one launch, when one of
# the configs the ImplB search timed is within FUSED_DECODE_TOLERANCE of the fastest implementation at every M of
# the search above m1: the engine's decode step then runs 8 kernels per layer, where the pass made it 9
# (llama2-7b gate_up [22016, 4096] on the H200: the pair kernel's 49.1 us at M = 16 against cuBLASLt's 45.8 us
# plus a 2.5 us pass).
FUSED_DECODE_MAX_M = max(SEARCH_MS)
FUSED_DECODE_TOLERANCE = 1.10


def fused_decode_plan(entry: dict) -> dict | None:
    """The plan a silu_mul GEMM of this profile entry runs instead of the entry's, or None where the entry's already
    keeps every M <= FUSED_DECODE_MAX_M in one launch or no searched config is close enough. Reads the entry's
    implb_search (times per config at SEARCH_MS) and curves. Example: m2 8, cuBLASLt 45.8 us at M = 16, a config
    at [44.0, 45.5, 45.6, 46.0, 49.1] us against the best [44.0, 44.5, 44.9, 45.0, 45.8] -> m2 16 with that config
    (worst ratio 1.07)."""
    m1, m2 = int(entry["m1"]), int(entry["m2"])
    search, curves = entry.get("implb_search") or {}, entry.get("curves") or {}
    if m2 >= FUSED_DECODE_MAX_M or not search.get("top") or not curves.get("m"):
        return None
    implc = entry.get("implc", "cublaslt")

    def fastest(m):
        if m not in curves["m"]:
            return None
        i = curves["m"].index(m)
        times = [(curves.get(f"{name}_us") or [None] * (i + 1))[i] for name in ("impla", "implb", implc)]
        times = [t for t in times if _valid(t)]
        return min(times) if times else None

    searched = [(i, m) for i, m in enumerate(search["m"]) if m1 < m <= FUSED_DECODE_MAX_M]
    best = {m: fastest(m) for _, m in searched}
    if not searched or any(t is None for t in best.values()):
        return None
    winner = None
    for candidate in search["top"]:
        if len(candidate.get("us") or ()) != len(search["m"]):
            continue
        times = [candidate["us"][i] for i, _ in searched]
        if not all(_valid(t) for t in times):
            continue
        worst = max(t / best[m] for t, (_, m) in zip(times, searched))
        if winner is None or worst < winner[0]:
            winner = (worst, candidate["config"])
    if winner is None or winner[0] > FUSED_DECODE_TOLERANCE:
        return None
    return {"m1": m1, "m2": FUSED_DECODE_MAX_M, "implb": dict(winner[1]), "implc": implc,
            "worst_ratio": round(winner[0], 3)}


def pick_implb_curve(ms: list, curves: dict, implb_curves: list) -> tuple:
    """Which of several ImplB configs' curves (the search's winner first) gives the best plan. Each is planned by
    choose_plan against the fastest time that any of them, ImplA or ImplC reached at each M, and scored by
    (misses, geometric-mean slowdown to 0.1%, worst slowdown); a tie keeps the earlier one. Returns (index, plan).

    A winner that is slow at one M between the ones the search timed leaves that M to ImplC or to a miss; a
    runner-up as fast at every M serves them all:
        ms [4, 6, 8], cuBLASLt [133, 134, 133], ImplB [[124, 138, 125], [126, 127, 126]] -> index 1, m2 = 8"""
    floor = []
    for i in range(len(ms)):
        times = [b[i] for b in implb_curves if _valid(b[i])]
        floor.append(min(times) if times else None)
    winner = None
    for index, implb_us in enumerate(implb_curves):
        try:
            plan = choose_plan(ms, dict(curves, implb_us=implb_us), best_floor=floor)
        except FdppError:
            continue
        key = (plan["misses"], plan["mean_ratio"], plan["worst_ratio"])
        if winner is None or key < winner[0]:
            winner = (key, index, plan)
    if winner is None:
        raise FdppError("the measured curves leave some M without a working implementation")
    return winner[1], winner[2]


def lone_peaks(ms: list, values: list, margin: float = 0.02) -> list:
    """Indices of the points that stand more than `margin` above both neighbours one M away (M and M +- 1 all
    measured). Such a point may be noise, so profile_shape times it again and keeps the lower time; a real step
    stays (one noisy point can move a threshold by several M):
        ms [5, 6, 7, 8], values [44.5, 44.6, 47.1, 44.6] -> [2]"""
    peaks = []
    for i in range(1, len(ms) - 1):
        left, here, right = values[i - 1], values[i], values[i + 1]
        if ms[i] - ms[i - 1] != 1 or ms[i + 1] - ms[i] != 1 or not all(_valid(t) for t in (left, here, right)):
            continue
        if here > (1 + margin) * max(left, right):
            peaks.append(i)
    return peaks


def check_existing_profile(existing: dict, gpu: str) -> None:
    """Refuse to add to a profile file of another schema or another GPU (called before measuring)."""
    if not isinstance(existing, dict) or existing.get("schema") != PROFILE_SCHEMA:
        raise FdppError(f"the existing profile is not {PROFILE_SCHEMA}; move it away or pass another --out")
    if existing.get("gpu") and existing["gpu"] != gpu:
        raise FdppError(f"the existing profile was measured on {existing['gpu']}, this GPU is {gpu}; "
                        "pass --out engines/profiles/<this gpu>.json")


def merge_profile(existing: dict | None, header: dict, entries: list, force: bool) -> tuple:
    """The profile file's new content: existing shapes kept unless re-measured with force, new ones appended,
    sorted by (n, k, dtype). Returns (data, replaced_keys). Refuses an existing file of another GPU."""
    shapes = {}
    if existing is not None:
        check_existing_profile(existing, header["gpu"])
        for entry in existing.get("shapes", []):
            shapes[(int(entry["n"]), int(entry["k"]), entry["dtype"])] = entry
    replaced = []
    for entry in entries:
        key = (int(entry["n"]), int(entry["k"]), entry["dtype"])
        if key in shapes:
            if not force:
                continue
            replaced.append(key)
        shapes[key] = entry
    presets = sorted(set((existing or {}).get("presets", [])) | set(header["presets"]))
    data = dict(header, presets=presets, shapes=[shapes[key] for key in sorted(shapes)])
    return data, replaced


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200'; 'NVIDIA GeForce RTX 4090' -> 'geforce-rtx-4090'."""
    slug = name.lower().replace("nvidia", "").strip()
    return "-".join(part for part in slug.replace("_", " ").split() if part) or "gpu"


# ---- measurement ----------------------------------------------------------------------------------------------
class ShapeBench:
    """Tensors for one [N, K] and launch closures for each implementation (shared with scripts/bench_gemm.py)."""

    def __init__(self, n: int, k: int, dtype: str, max_m: int, copies: int = 1):
        """copies: weight copies for graph timing (weight_copies()); 1 for flushed timing."""
        import torch

        from fdpp_rewrite.gpu import gemm

        self.torch, self.gemm = torch, gemm
        self.n, self.k, self.dtype = n, k, dtype
        tdtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
        gen = torch.Generator(device="cuda").manual_seed(0)
        scale = 1.0 / math.sqrt(k)
        self.ws = [torch.randn(n, k, device="cuda", dtype=tdtype, generator=gen).mul_(scale) for _ in range(copies)]
        self.x = torch.randn(max_m, k, device="cuda", dtype=tdtype, generator=gen)
        self.y = torch.empty(max_m, n, device="cuda", dtype=tdtype)
        nbytes = gemm.workspace_bytes(max_m, n, dtype)
        self.workspace = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self.lib = gemm.library()

    def _stream(self) -> int:
        return self.torch.cuda.current_stream().cuda_stream

    def launcher(self, impl: str, m: int, config: dict = None, pad_m: int = 8, copy: int = 0, plan: dict = None):
        """A no-argument function launching impl ('impla', 'implb', 'cublaslt', 'cutlass', 'auto' with plan,
        'cublas' = torch) for the first m rows. Raises FdppError on its first call if the implementation rejects
        the problem."""
        import ctypes

        torch, gemm, lib = self.torch, self.gemm, self.lib
        x, w, y = self.x[:m], self.ws[copy], self.y[:m]
        if impl == "cublas":
            return lambda: torch.nn.functional.linear(x, w)
        args = gemm.make_args(x, w, out=y)
        ws_ptr, ws_bytes = self.workspace.data_ptr(), self.workspace.numel()
        from fdpp_rewrite.gpu import lib as base

        if impl == "auto":
            plan_c = gemm.Plan.from_dict(plan)

            def run_auto():
                status = lib.fdpp_gemm_run(ctypes.byref(args), ctypes.byref(plan_c), ws_ptr, ws_bytes, self._stream())
                if status:
                    base.check(status, "dispatched GEMM")
            return run_auto
        cfg = ctypes.byref(gemm.ImplBConfig.from_dict(config)) if config is not None else None
        impl_id = gemm.IMPLS[impl]
        gemm.cublaslt_available()  # locate libcublasLt before the first ImplC call

        def run_one():
            status = lib.fdpp_gemm_run_impl(ctypes.byref(args), impl_id, cfg, pad_m, 0, ws_ptr, ws_bytes,
                                            self._stream())
            if status:
                base.check(status, f"GEMM {impl}")
        return run_one


def weight_copies(n: int, k: int, l2_bytes: int, iters: int = GRAPH_ITERS) -> int:
    """Weight copies a graph timing cycles over so that every weight is read cold: together more than 3x the
    L2 (at least 2), and no more than the graph has launches (each copy is then read once per replay)."""
    return max(2, min(iters, math.ceil(3 * l2_bytes / (2 * n * k))))


def time_impl(bench: ShapeBench, timer, timing: str, impl: str, m: int, config: dict = None, plan: dict = None,
              replays: int = 10):
    """Microseconds per launch of one implementation at M = m by `timing` (TIMINGS), or None when it rejects
    the problem."""
    from fdpp_rewrite.gpu.gemm_timing import safe_time

    if timing == "flushed":
        return safe_time(lambda: timer.flushed_us(bench.launcher(impl, m, config, plan=plan)))
    if timing != "graph":
        raise FdppError(f"unknown timing {timing!r}; choose from {', '.join(TIMINGS)}")
    return safe_time(lambda: timer.graph_us([bench.launcher(impl, m, config, copy=c, plan=plan)
                                              for c in range(len(bench.ws))], iters=GRAPH_ITERS, replays=replays))


def search_implb(bench: ShapeBench, timer, device: dict, search_ms=SEARCH_MS, search_reps: int = 10,
                 timing: str = "graph", quick: bool = False) -> tuple:
    """(best config, [(config, {m: us})] of every candidate) by geometric-mean slowdown over search_ms, where a
    candidate's time at an M counts no higher than cuBLASLt's there: the dispatch hands such an M to ImplC anyway,
    so a config that is slow only where it would never run is not penalized.
    quick: only the kw = 128, 2- and 3-stage cp.async candidates (every earlier search's winners were among them)
    and the 1024-column ones (k_tile >= 1024)."""
    from fdpp_rewrite.gpu import gemm

    candidates = gemm.implb_candidates(bench.n, bench.k, 1, device["num_sms"], device["max_smem"], device["cc_major"])
    if quick:
        short = [c for c in candidates if c["k_tile"] >= 1024
                 or (c["k_tile"] * c["n_tile"] // 64 == 128 and c["stages"] in (2, 3))]
        candidates = short or candidates
    if not candidates:
        raise FdppError(f"no valid ImplB config for [{bench.n}, {bench.k}]")
    results = []
    saved_reps, timer.reps = timer.reps, min(timer.reps, search_reps)  # ranking needs less precision
    try:
        ceiling = {m: time_impl(bench, timer, timing, "cublaslt", m, replays=5) for m in search_ms}
        for config in candidates:
            times = {}
            for m in search_ms:
                times[m] = time_impl(bench, timer, timing, "implb", m, config, replays=5)
            results.append((config, times))
    finally:
        timer.reps = saved_reps

    def capped(times, m):
        t = times[m]
        return min(t, ceiling[m]) if _valid(t) and _valid(ceiling[m]) else t

    best_by_m = {m: min((capped(t, m) for _, t in results if _valid(t[m])), default=None) for m in search_ms}

    def score(times):
        logs = [math.log(capped(times, m) / best_by_m[m]) if _valid(times[m]) else math.inf for m in search_ms
                if best_by_m[m]]
        return math.exp(sum(logs) / len(logs)) if logs else math.inf

    results.sort(key=lambda item: score(item[1]))
    return results[0][0], [(cfg, times, score(times)) for cfg, times in results]


def profile_shape(n: int, k: int, dtype: str, timer, device: dict, ms=M_GRID, progress=None, timing: str = "graph",
                  quick: bool = False) -> dict:
    """One profile entry (schema in engines/profiles/README.md) with the raw curves, timed by `timing`."""
    copies = weight_copies(n, k, timer.l2_bytes) if timing == "graph" else 1
    bench = ShapeBench(n, k, dtype, max(ms), copies=copies)
    config, search = search_implb(bench, timer, device, timing=timing, quick=quick)
    curves = {"m": list(ms)}
    for name in IMPLS + ("cublas",):
        curves[f"{name}_us"] = []
    retimed = []
    for j, m in enumerate(ms):
        for name in IMPLS + ("cublas",):
            if (name == "impla" and m > IMPLA_MAX_M) or (name == "implb" and m > IMPLB_MAX_M):
                t = None
            else:
                t = time_impl(bench, timer, timing, name, m, config if name == "implb" else None)
            values = curves[f"{name}_us"]
            values.append(None if t is None else round(t, 3))
            # A second look at the previous M if it stands out as a lone peak, right away, so that the second time
            # is taken in the same state of the GPU as its neighbours (timed after the sweep's large M, a second
            # time comes out higher). The lower time stands: noise only adds.
            if j >= 2 and lone_peaks(ms[j - 2:j + 1], values[j - 2:j + 1]) == [1]:
                again = time_impl(bench, timer, timing, name, ms[j - 1], config if name == "implb" else None)
                retimed.append({"impl": name, "m": ms[j - 1],
                                "us": [values[j - 1], None if again is None else round(again, 3)]})
                if _valid(again) and again < values[j - 1]:
                    values[j - 1] = round(again, 3)
        if progress is not None:
            progress.update(1)
    plan = choose_plan(ms, curves)
    # The search ranks configs at a few M only; a winner that is slow at an M between them can leave a point that
    # no threshold serves within 2%. Then the runners-up are timed at every M too, and the best plan of all wins.
    alternatives = []
    if plan["misses"]:
        for alt_config, _, _ in search[1:1 + IMPLB_ALTERNATIVES]:
            alt_us = [None if m > IMPLB_MAX_M else time_impl(bench, timer, timing, "implb", m, alt_config) for m in ms]
            alt_us = [None if t is None else round(t, 3) for t in alt_us]
            alternatives.append({"config": alt_config, "implb_us": alt_us})
        if alternatives:
            index, plan = pick_implb_curve(ms, curves, [curves["implb_us"]] + [a["implb_us"] for a in alternatives])
            if index:  # the runner-up's curve becomes the entry's ImplB curve, the winner's goes to the list
                chosen = alternatives[index - 1]
                alternatives[index - 1] = {"config": config, "implb_us": curves["implb_us"]}
                config, curves["implb_us"] = chosen["config"], chosen["implb_us"]
    curves["dispatched_us"] = [curves[f"{select_impl(m, plan)}_us"][i] for i, m in enumerate(ms)]
    return {
        "n": n, "k": k, "dtype": dtype, "m1": plan["m1"], "m2": plan["m2"], "implb": config, "timing": timing,
        "implc": plan["implc"], "worst_ratio_vs_best_impl": plan["worst_ratio"],
        "points_over_2pct_vs_best_impl": plan["misses"],
        "implb_search": {"m": list(SEARCH_MS),
                         "top": [{"config": c, "us": [t[m] for m in SEARCH_MS], "score": round(s, 4)}
                                 for c, t, s in search[:8]],
                         "candidates": len(search)},
        "curves": curves,
        "retimed": retimed,
        "implb_alternatives": alternatives,
    }


def plot_entry(entry: dict, path: Path, title: str) -> None:
    """Figure 9b of the paper for one shape: time per implementation against M, with M1 and M2 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, ms = entry["curves"], entry["curves"]["m"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"impla": ("ImplA GEMV (CUDA cores)", "-o"), "implb": ("ImplB flat GEMM (pad 8)", "-s"),
              "cublaslt": ("ImplC cuBLASLt", "-^"), "cutlass": ("ImplC CUTLASS 64x128", "-v"),
              "cublas": ("cuBLAS (torch, peer)", "--")}
    for name, (label, style) in styles.items():
        pts = [(m, t) for m, t in zip(ms, curves.get(f"{name}_us", [])) if _valid(t)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, markersize=3, linewidth=1.2)
    top = ax.get_ylim()[1]
    marks = [(entry["m1"], "M1")] if entry["m1"] != entry["m2"] else []
    marks.append((entry["m2"], "M1=M2" if entry["m1"] == entry["m2"] else "M2"))
    for row, (value, name) in enumerate(marks):
        if value > 0:
            ax.axvline(value, color="gray", linestyle=":", linewidth=1)
            ax.text(value, top * (1 - 0.06 * row), f" {name}={value}", va="top", fontsize=8, color="dimgray")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (rows of X: batch x tokens)")
    timing = entry.get("timing", "flushed")
    ax.set_ylabel("time per GEMM (us, " + ("graph, rotating weights" if timing == "graph" else "L2 flushed") + ")")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- command ----------------------------------------------------------------------------------------------------
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
    parser.add_argument("--force", action="store_true",
                        help="re-measure shapes already in the profile and overwrite their plots")


def _device_facts(torch) -> dict:
    from fdpp_rewrite.gpu import gemm

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    info = gemm.device_info()
    return dict(info, name=props.name, cc=f"{info['cc_major']}.{info['cc_minor']}")


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
    device = _device_facts(torch)
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
                       f"M1={entry['m1']}, M2={entry['m2']}, ImplC={entry['implc']}"
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
    print(f"{'shape':>16} {'m1':>3} {'m2':>3} {'implc':>8}  ImplB config            worst/best  used by")
    for e in entries:
        cfg = gemm.config_label(e["implb"])
        print(f"{'[' + str(e['n']) + ', ' + str(e['k']) + ']':>16} {e['m1']:>3} {e['m2']:>3} {e['implc']:>8}  "
              f"{cfg:<22} {e['worst_ratio_vs_best_impl']:>9.3f}  {', '.join(e['used_by'])}")
    return 0

