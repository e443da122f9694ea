"""The profiler's pure half: from measured curves to a profile entry's plan, and the profile file's merge rule.
No GPU, no torch: the CPU tests exercise every function here (tests/fdpp_rewrite/test_profile.py).

    model_shapes(config)                      -> [(layer, n, k)] a model's GEMM shapes as the rewriter fuses them
    choose_plan(ms, curves)                   -> m1, m2, implc from the curves (paper section 5, Figure 9b)
    pick_implb_curve(ms, curves, implb_curves)-> which ImplB config's curve gives the best plan
    fused_decode_plan(entry)                  -> the plan a silu_mul GEMM of this shape runs (stored in the entry)
    wgmma_range(entry)                        -> m3 and the wgmma config from the entry's implb_wgmma record
    complete_entry(entry)                     -> the entry with its wgmma range and "silu_mul" plan, as stored
    merge_profile(existing, header, entries)  -> the profile file's new content
"""

from __future__ import annotations

import math

from fdpp_rewrite.dispatch import IMPLA_MAX_M, IMPLB_MAX_M, IMPLB_WGMMA_MAX_M, select_impl
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.schemas import PROFILE_SCHEMA

SEARCH_MS = (1, 2, 4, 8, 16)  # the decode batch sizes ImplB is for; ImplC takes over at larger M


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
# (measured in docs/notes-gemm.md, "One launch for a silu_mul GEMM's decode batches").
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


def wgmma_range(entry: dict) -> dict:
    """{"m3", "wgmma"} from the entry's implb_wgmma record (profile_measure.measure_wgmma: its best config's
    times and cuBLASLt's at record["m"]), or {} for no wgmma range (m3 = m2).

    m3 is the largest M the record timed (up to 256) such that the wgmma config beats cuBLASLt at every timed M
    above m2 up to it: the record's M, and the M of the entry's cuBLASLt curve between m2 and the record's last M,
    where the wgmma time is the record's at the next M it timed (the kernel pads M to 32, 64, 128 or 256, the
    record's M, so that time is the one it takes; for other record M an upper bound). Example: m2 16, record m
    [32, 64, 128, 256], wgmma [10, 11, 15, 30] us, cuBLASLt [12, 12, 16, 28] (and 11.9 at M = 24 in the curves)
    -> m3 128."""
    record, m2 = entry.get("implb_wgmma"), int(entry["m2"])
    if not record or m2 > IMPLB_MAX_M:
        return {}
    timed = [(m, ours, theirs) for m, ours, theirs in zip(record["m"], record["implb_wgmma_us"],
                                                          record["cublaslt_us"]) if m2 < m <= IMPLB_WGMMA_MAX_M]
    curves = entry.get("curves") or {}
    cublaslt = dict(zip(curves.get("m") or (), curves.get("cublaslt_us") or ()))
    m3 = m2
    for m, ours, theirs in timed:
        # every timed cuBLASLt point in (m3, m] runs on the wgmma kernel at its M = m cost
        points = [theirs] + [t for cm, t in cublaslt.items() if m3 < cm < m]
        if not _valid(ours) or not all(_valid(t) and ours < t for t in points):
            break
        m3 = m
    if m3 == m2:
        return {}
    return {"m3": m3, "wgmma": dict(record["config"])}


def complete_entry(entry: dict) -> dict:
    """The entry as the profile stores it: with its wgmma range where the record gives one (wgmma_range: "m3" and
    "wgmma", absent for none), and "silu_mul", the plan a node of this shape with the silu_mul epilogue runs
    (fused_decode_plan, with the entry's wgmma range above its m2), or None where it runs the entry's own plan.
    Computed once, when the profiler writes the entry; the readers (fdpp_rewrite.profiles) take it as stored."""
    entry = {key: value for key, value in entry.items() if key not in ("m3", "wgmma")}
    entry.update(wgmma_range(entry))
    silu = fused_decode_plan(entry)
    if silu is not None and entry.get("m3", 0) > silu["m2"]:
        silu.update(m3=entry["m3"], wgmma=entry["wgmma"])
    return dict(entry, silu_mul=silu)


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
