"""EXPERIMENT (run 114): per-CTA timelines of the pair kernel in a 60-launch PDL chain (FDPP_PAIR_TRACE=1)."""
import ctypes, json, os, statistics, sys
import numpy as np
import torch
from fdpp_rewrite.gpu import gemm, lib as fdpp_lib
from fdpp_rewrite.gpu.gemm_timing import capture_graph
from fdpp_rewrite.profile import ShapeBench, weight_copies

REC = np.dtype([("w", "u8"), ("g0", "u8"), ("g1", "u8"), ("g2", "u8"), ("g3", "u8"), ("g4", "u8"), ("block", "u4"),
                ("smid", "u4"), ("c0", "i8"), ("c1", "i8"), ("c2", "i8"), ("c3", "i8"), ("c4", "i8")])
assert REC.itemsize == 96
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
clk = torch.cuda.get_device_properties(0).clock_rate if hasattr(torch.cuda.get_device_properties(0), "clock_rate") else 1980000
cases = [("o", 4096, 4096, m, 2) for m in (1, 4, 8)] + [("down", 4096, 11008, m, 3) for m in (1, 8)]
for name, n, k, m, stages in cases:
    copies = weight_copies(n, k, l2)
    bench = ShapeBench(n, k, "float16", 8, copies=copies)
    config = {"n_tile": 16, "k_tile": 1024, "split_k": 1, "stages": stages, "loader": "pair"}
    fns = [bench.launcher("implb", m, config, copy=c) for c in range(copies)]
    res = {}
    for trace in ("0", "1"):
        os.environ["FDPP_PAIR_TRACE"] = trace
        g = capture_graph(fns, 60)
        os.environ["FDPP_PAIR_TRACE"] = "0"
        for _ in range(3): g.replay()
        torch.cuda.synchronize(); read()
        ts = []
        for _ in range(7):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); g.replay(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) * 1000 / 60)
            recs = read()
        res[f"us_trace{trace}"] = statistics.median(ts)
    recs = recs[np.argsort(recs["g0"])]
    ctas = len(recs) // 60
    inst = []
    for w in np.unique(recs["w"]):
        r = recs[recs["w"] == w]
        r = r[np.argsort(r["g0"])]
        for i in range(0, len(r), ctas):
            inst.append(r[i:i + ctas])
    inst.sort(key=lambda r: int(r["g1"].min()))
    us = lambda a: a / 1000.0
    cyc = lambda a: float(np.median(a)) / (clk / 1000.0)  # clock64 cycles -> us at the SM clock (kHz)
    rows = []
    for a, b in zip(inst[5:55], inst[6:56]):
        rel = float(b["g1"].min())
        rows.append({
            "period": us(float(b["g1"].min()) - float(a["g1"].min())),
            "release_after_last_end": us(rel - float(a["g4"].max())),
            "release_spread": us(float(b["g1"].max()) - rel),
            "first_start_before_release": us(rel - float(b["g0"].min())),
            "unit0_ready_after_release_median": us(float(np.median(b["g2"].astype(float) - rel))),
            "loop_end_after_release_median": us(float(np.median(b["g3"].astype(float) - rel))),
            "end_after_release_median": us(float(np.median(b["g4"].astype(float) - rel))),
            "end_after_release_max": us(float(np.max(b["g4"].astype(float) - rel))),
            "tail_last_minus_median_end": us(float(a["g4"].max()) - float(np.median(a["g4"]))),
            "clk_wait_to_unit0": cyc(b["c2"] - b["c1"]),
            "clk_unit0_to_loop_end": cyc(b["c3"] - b["c2"]),
            "clk_loop_end_to_end": cyc(b["c4"] - b["c3"]),
            "clk_entry_to_wait": cyc(b["c1"] - b["c0"]),
        })
    summary = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    summary["ctas"] = ctas
    key = f"{name} M={m} pair s{stages}"
    out[key] = {**res, **summary}
    print(key, json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in out[key].items()}), flush=True)
    np.save(f"{sys.argv[1]}/{name}_m{m}_pair.npy", recs)
    del bench, fns, g
    torch.cuda.empty_cache()
json.dump({"clock_khz": clk, "cases": out}, open(f"{sys.argv[1]}/trace_summary.json", "w"), indent=1)
