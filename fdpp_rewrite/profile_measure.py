"""The profiler's measuring half (on the GPU): tensors and launchers for one [N, K], the ImplB config search and
the M sweep that makes one profile entry (schema in engines/profiles/README.md). Shared with scripts/bench_gemm.py.

    entry = profile_shape(n, k, dtype, Timer(reps=10), device, quick=True)
"""

from __future__ import annotations

import math

from fdpp_rewrite.dispatch import IMPLA_MAX_M, IMPLB_MAX_M, IMPLS, select_impl
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.profile_plan import SEARCH_MS, _valid, choose_plan, complete_entry, lone_peaks, pick_implb_curve

M_GRID = list(range(1, 17)) + [24, 32, 48, 64, 96, 128, 192, 256]
TIMINGS = {
    "graph": "launches back to back in one CUDA graph over rotating weight copies (none in L2 when read), time "
             "per launch = replay / launches, median of replays; programmatic dependent launch as the library "
             "default (on, sm_90+)",
    "flushed": "CUDA events around one launch after an L2 flush (reading 4x the L2), median of repetitions",
}
GRAPH_ITERS = 60  # launches per graph replay
# Where the wgmma ImplB loader (sm_90a) is measured against cuBLASLt: the batches past mma.sync's ImplB.
WGMMA_MS = (32, 64, 128, 256)
IMPLB_ALTERNATIVES = 4  # the search's runners-up whose whole curve is timed when the winner's plan misses

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
        impl_id = gemm.IMPL_CODES[impl]
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


def measure_wgmma(bench: ShapeBench, timer, device: dict, timing: str = "graph", ms=WGMMA_MS) -> dict | None:
    """The wgmma ImplB loader against cuBLASLt at ms: each of its candidate configs timed at every M, the one with
    the lowest geometric-mean time kept with its curve and cuBLASLt's beside it; None on a GPU without it (compute
    capability other than 9)."""
    from fdpp_rewrite.gpu import gemm

    if device.get("cc_major") != 9:
        return None
    candidates = [c for c in gemm.implb_candidates(bench.n, bench.k, ms[0], device["num_sms"], device["max_smem"],
                                                   device["cc_major"]) if c.get("loader") == "wgmma"]
    if not candidates:
        return None
    cublaslt = [time_impl(bench, timer, timing, "cublaslt", m) for m in ms]
    timed = [(config, [time_impl(bench, timer, timing, "implb", m, config) for m in ms]) for config in candidates]

    def score(times):
        valid = [t for t in times if _valid(t)]
        return math.exp(sum(math.log(t) for t in valid) / len(valid)) if len(valid) == len(times) else math.inf

    timed.sort(key=lambda item: score(item[1]))
    config, best = timed[0]

    def rounded(times):
        return [None if t is None else round(t, 3) for t in times]
    return {"m": list(ms), "config": config, "implb_wgmma_us": rounded(best), "cublaslt_us": rounded(cublaslt),
            "candidates": [{"config": c, "us": rounded(t)} for c, t in timed]}


def profile_shape(n: int, k: int, dtype: str, timer, device: dict, ms=M_GRID, progress=None, timing: str = "graph",
                  quick: bool = False) -> dict:
    """One profile entry (schema in engines/profiles/README.md) with the raw curves, timed by `timing`, and its
    silu_mul plan (profile_plan.complete_entry)."""
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
    return complete_entry({
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
        # The wgmma loader against cuBLASLt above mma.sync's ImplB: complete_entry turns it into the entry's wgmma
        # range (m3 and its config), where the loader wins.
        "implb_wgmma": measure_wgmma(bench, timer, device, timing=timing),
    })


def device_facts(torch) -> dict:
    """What the search and the profile header need of this GPU: the library's device_info, name and cc."""
    from fdpp_rewrite.gpu import gemm

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    info = gemm.device_info()
    return dict(info, name=props.name, cc=f"{info['cc_major']}.{info['cc_minor']}")
