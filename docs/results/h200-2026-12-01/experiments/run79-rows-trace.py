"""EXPERIMENT (run 79): per-CTA timelines of the rows kernel in a 60-launch PDL chain (FDPP_ROWS_TRACE=1)."""
import ctypes, json, os, statistics, sys
import numpy as np
import torch
from fdpp_rewrite.gpu import gemm, lib as fdpp_lib
from fdpp_rewrite.gpu.gemm_timing import capture_graph
from fdpp_rewrite.profile import ShapeBench, weight_copies

REC = np.dtype([("w", "u8"), ("g0", "u8"), ("g1", "u8"), ("g2", "u8"), ("g3", "u8"), ("block", "u4"), ("smid", "u4"),
                ("c0", "i8"), ("c1", "i8"), ("c2", "i8"), ("c3", "i8")])
assert REC.itemsize == 80
L = fdpp_lib.load()
L.fdpp_exp_trace_read.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
buf = np.zeros(1 << 16, dtype=REC)
def read(reset=True):
    n = L.fdpp_exp_trace_read(buf.ctypes.data, len(buf), int(reset))
    assert n >= 0
    return buf[:n].copy()

out = {}
gemm.set_pdl(True)
l2 = torch.cuda.get_device_properties(0).L2_cache_size
cases = [("o", 4096, 4096, 1, dict(stages=2, loader="rows1")), ("o", 4096, 4096, 8, dict(stages=2, loader="rows1")),
         ("o", 4096, 4096, 1, dict(stages=2, loader="rows")), ("qkv", 12288, 4096, 1, dict(stages=3, loader="rows")),
         ("down", 4096, 11008, 1, dict(stages=3, loader="rows"))]
for name, n, k, m, cfg in cases:
    copies = weight_copies(n, k, l2)
    bench = ShapeBench(n, k, "float16", 8, copies=copies)
    config = {"n_tile": 16, "k_tile": 1024, "split_k": 1, **cfg}
    fns = [bench.launcher("implb", m, config, copy=c) for c in range(copies)]
    res = {}
    for trace in ("0", "1"):
        os.environ["FDPP_ROWS_TRACE"] = trace
        g = capture_graph(fns, 60)
        os.environ["FDPP_ROWS_TRACE"] = "0"
        for _ in range(3): g.replay()
        torch.cuda.synchronize(); read()
        ts = []
        for _ in range(7):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); g.replay(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) * 1000 / 60)
            recs = read()
        res[f"us_trace{trace}"] = statistics.median(ts)
    # the last replay's records
    recs = recs[np.argsort(recs["g0"])]
    ctas = len(recs) // 60
    inst = []
    for w in np.unique(recs["w"]):
        r = recs[recs["w"] == w]
        r = r[np.argsort(r["g0"])]
        for i in range(0, len(r), ctas):
            inst.append(r[i:i + ctas])
    inst.sort(key=lambda r: int(r["g1"].min()))
    t_us = lambda a: a / 1000.0
    rows = []
    for a, b in zip(inst[5:55], inst[6:56]):
        rows.append({
            "period": t_us(float(b["g1"].min()) - float(a["g1"].min())),
            "release_after_last_end": t_us(float(b["g1"].min()) - float(a["g3"].max())),
            "release_spread": t_us(float(b["g1"].max()) - float(b["g1"].min())),
            "tail_last_minus_median_end": t_us(float(a["g3"].max()) - float(np.median(a["g3"]))),
            "tail_last_minus_first_end": t_us(float(a["g3"].max()) - float(a["g3"].min())),
            "end_p10_to_p90": t_us(float(np.percentile(a["g3"], 90)) - float(np.percentile(a["g3"], 10))),
            "first_start_before_release": t_us(float(b["g1"].min()) - float(b["g0"].min())),
            "unit0_ready_after_release_median": t_us(float(np.median(b["g2"].astype(float) - b["g1"].astype(float)))),
            "cta_after_release_median": t_us(float(np.median(b["g3"].astype(float) - b["g1"].astype(float)))),
            "cta_after_release_max": t_us(float(np.max(b["g3"].astype(float) - b["g1"].astype(float)))),
            "cta_start_after_prev_first_end": t_us(float(b["g0"].min()) - float(a["g3"].min())),
        })
    summary = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    deltas = np.diff(np.unique(recs["g3"]))
    summary["globaltimer_min_step_ns"] = int(deltas[deltas > 0].min()) if len(deltas) else None
    summary["ctas"] = ctas
    # per-SM: how the kernel's CTAs on one SM end relative to each other, and the SM's second CTA
    key = f"{name} M={m} {cfg['loader']} s{cfg['stages']}"
    out[key] = {**res, **summary}
    print(key, json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in out[key].items()}), flush=True)
    np.save(f"{sys.argv[1]}/{name}_m{m}_{cfg['loader']}.npy", recs)
    del bench, fns, g
    torch.cuda.empty_cache()
json.dump(out, open(f"{sys.argv[1]}/trace_summary.json", "w"), indent=1)
