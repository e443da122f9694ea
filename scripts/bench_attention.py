#!/usr/bin/env python3
"""Times fdpp::AsyncSoftmaxAttention against torch SDPA's cuDNN and FLASH backends in one run on this GPU.

    python3 scripts/bench_attention.py --out out/attention        # results.json, results.png, a table on stdout

Decode: fp16, 32 query heads, head_dim 128, one query token, B in {1, 8} x L in {1K, 8K, 32K}, MHA and GQA 32/8.
Decode also times the worst case of the exact fallback (every row flagged: scale 1 on these random inputs).
Prefill: causal, B=1, L in {1K, 4K, 16K}. Ours runs in both softmax variants (unified max = FlashDecoding++;
synchronized = the online-max baseline of the same kernels).

Timing: every implementation is captured in one CUDA graph that calls it back to back on enough copies of the
inputs to exceed the 60 MB L2 several times over (decode's K/V would otherwise be read from L2), and the graph's
replay time is divided by the number of calls (median of several replays; all variants of a row replayed in turn,
rep by rep, so that clock drift hits them alike). That is how a decode step runs in a
real engine (layers back to back in a graph), and it keeps CPU launch overhead out of the numbers for ours and the
peers alike. (Timing single calls with an L2 flush in front instead lets the flush's dirty lines be written back
during the timed call and adds each library's CPU overhead: both distort the small cases.) Memory-bound rows report
TB/s of K+V read, prefill rows TFLOP/s (4 * B * H * L^2 * D / 2 for causal). A streaming-read bandwidth (torch sum
over 4 GiB, the same graph method) is measured in the same run as the ceiling.

    PYTHONPATH=. python3 scripts/bench_attention.py --out out/bench-attention
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import shlex
import sys
from pathlib import Path


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and results.png")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--force", action="store_true", help="overwrite existing results in --out")
    parser.add_argument("--only", choices=("decode", "prefill"), help="time only these rows (default: both)")
    return parser.parse_args(argv)


def prefill_shapes():
    import torch

    return (1, 2, 4, 5) if torch.cuda.get_device_capability()[0] == 9 else (1, 2)


class Ours:
    """A prepared call of our attention: the argument struct and workspace built once, so a timed call is one
    ctypes call (the Python wrapper's checks would otherwise be timed too). options: more attention() options
    (e.g. block_table and max_kv_len for paged caches: scripts/bench_paged_attention.py)."""

    def __init__(self, q, k, v, past_len, *, softmax, kernel="auto", num_splits=0, prefill_config=0,
                 decode_combine="auto", combine_counters=False, scale=None, options=None):
        import torch

        from fdpp_rewrite.gpu import attention as att
        from fdpp_rewrite.gpu import lib as fdpp_lib

        self.att, self.check = att, fdpp_lib.check
        self.out = torch.empty_like(q)
        # combine_counters: a zeroed buffer of its own, so that the plan may combine the splits in their last CTA
        self.combine_counters = (torch.zeros(att.combine_counters_size(q, k, kernel), dtype=torch.int32,
                                             device="cuda") if combine_counters else None)
        self.args = att._args(q, k, v, self.out, past_len, None, **att._defaults(
            {"softmax": softmax, "kernel": kernel, "max_kv_len": k.shape[2], "num_splits": num_splits,
             "prefill_config": prefill_config, "decode_combine": decode_combine,
             "combine_counters": self.combine_counters, "scale": scale, **(options or {})}))
        self.need = att.workspace_bytes(self.args)
        self.workspace = torch.empty(max(self.need, 1), dtype=torch.uint8, device="cuda")
        self.lib = att.library()
        self.stream_handle = fdpp_lib.stream_handle
        self.keep = (q, k, v, past_len, options)
        kernel_id, splits = ctypes.c_int32(0), ctypes.c_int32(0)
        fdpp_lib.check(self.lib.fdpp_attention_plan(ctypes.byref(self.args), ctypes.byref(kernel_id),
                                                    ctypes.byref(splits)), "plan")
        self.kernel, self.splits = att.KERNEL_NAMES[kernel_id.value], splits.value
        cluster = ctypes.c_int32(0)
        if self.kernel == "decode":
            fdpp_lib.check(self.lib.fdpp_attention_decode_cluster(ctypes.byref(self.args), ctypes.byref(cluster)),
                           "decode plan")
        self.cluster = bool(cluster.value)

    def __call__(self):
        status = self.lib.fdpp_attention_forward(ctypes.byref(self.args), self.workspace.data_ptr(), self.need,
                                                 self.stream_handle())  # the current stream: a graph's, when capturing
        if status:
            self.check(status, "attention")
        return self.out


def sdpa(backend, q, k, v, *, causal=False, gqa=False):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def run():
        with sdpa_kernel(chosen):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return run


L2_BYTES = 60 << 20


def capture(calls, quick):
    """A CUDA graph of `calls` (callables, each on its own inputs) back to back, and the calls per replay."""
    import torch

    for call in calls:  # plans, workspaces, library loading: outside the capture
        call()
    torch.cuda.synchronize()
    rounds = max(1, -(-(8 if quick else 48) // len(calls)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            for call in calls:
                call()
    return graph, rounds * len(calls)


def replay_us(graph, calls_per_replay):
    """One timed replay: time per call in us."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls_per_replay


def loop_us(calls, quick):
    """The same back-to-back passes without a graph (for a library that cannot be captured): includes its CPU
    launch overhead wherever that exceeds the GPU time."""
    import statistics

    import torch

    times = []
    for _ in range(3 if quick else 7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(4):
            for call in calls:
                call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (4 * len(calls)))
    return statistics.median(times)


def try_time(calls, quick):
    """(time per call in us, None) or (None, why) for one variant alone (see time_variants)."""
    row = {}
    time_variants(row, [("t", calls)], quick)
    return row.get("t"), row.get("t_note")


def torch_module():
    import torch

    return torch


def copies_for(bytes_per_call: int) -> int:
    """Input copies so that one pass over them reads at least 4x the L2."""
    return max(2, -(-4 * L2_BYTES // max(bytes_per_call, 1)))


def stream_read_tbps(quick):
    import torch

    x = torch.ones(1 << 30, dtype=torch.float32, device="cuda")  # 4 GiB
    us, _ = try_time([x.sum], quick)
    del x
    return (1 << 30) * 4 / (us * 1e-6) / 1e12, us


def bench_decode(batch, heads, kv_heads, kv_len, quick):
    import torch

    dim = 128
    kv_bytes = 2 * batch * kv_heads * kv_len * dim * 2
    sets = []
    for _ in range(copies_for(kv_bytes)):
        q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=torch.float16)
        k = torch.randn(batch, kv_heads, kv_len, dim, device="cuda", dtype=torch.float16)
        sets.append((q, k, torch.randn_like(k), torch.full((batch,), kv_len - 1, dtype=torch.int64, device="cuda")))
    row = {"phase": "decode", "batch": batch, "heads": heads, "kv_heads": kv_heads, "kv_len": kv_len,
           "head_dim": dim, "bytes": kv_bytes, "input_copies": len(sets)}
    gqa = heads != kv_heads
    unified = [Ours(q, k, v, p, softmax="unified") for q, k, v, p in sets]
    synced = [Ours(q, k, v, p, softmax="synchronized") for q, k, v, p in sets]
    row["kernel"], row["splits"], row["cluster_combine"] = unified[0].kernel, unified[0].splits, unified[0].cluster
    variants = [("ours_unified_us", unified), ("ours_sync_us", synced),
                ("cudnn_us", [sdpa("cudnn", q, k, v, gqa=gqa) for q, k, v, _ in sets]),
                ("flash_us", [sdpa("flash", q, k, v, gqa=gqa) for q, k, v, _ in sets])]
    # A check of the split heuristic: twice the splits it picks (more, shorter CTAs in two waves) should be slower;
    # and half of them (for the long rows where the plan takes 4 splits over 1 or 2).
    twice = min(2 * row["splits"], 128)
    variants.append(("ours_unified_2x_splits_us",
                     [Ours(q, k, v, p, softmax="unified", num_splits=twice) for q, k, v, p in sets]))
    if row["splits"] > 1:
        variants.append(("ours_unified_half_splits_us", [Ours(q, k, v, p, softmax="unified",
                                                              num_splits=row["splits"] // 2) for q, k, v, p in sets]))
    if row["cluster_combine"]:  # the same splits through the combine kernel: what the cluster saves
        variants.append(("ours_unified_kernel_combine_us", [Ours(q, k, v, p, softmax="unified", decode_combine="kernel")
                                                            for q, k, v, p in sets]))
    elif row["kernel"] == "decode" and row["splits"] > 1:  # the last split CTA combines: one kernel instead of two
        variants.append(("ours_unified_last_block_us", [Ours(q, k, v, p, softmax="unified", combine_counters=True)
                                                        for q, k, v, p in sets]))
    # The worst case of the exact fallback: at scale 1 the scores of these random inputs reach +-40, far past the
    # default guard, so every row is flagged and recomputed (by the split kernel itself, or the combine kernel;
    # and by the last split CTA where the splits would otherwise need the combine kernel).
    variants.append(("ours_unified_all_fallback_us", [Ours(q, k, v, p, softmax="unified", scale=1.0)
                                                      for q, k, v, p in sets]))
    if row["kernel"] == "decode" and row["splits"] > 1 and not row["cluster_combine"]:
        variants.append(("ours_unified_all_fallback_last_block_us",
                         [Ours(q, k, v, p, softmax="unified", scale=1.0, combine_counters=True)
                          for q, k, v, p in sets]))
    time_variants(row, variants, quick)
    q, k, v, _ = sets[0]
    ref = sdpa("flash", q, k, v, gqa=gqa)()
    row["max_abs_diff_vs_flash"] = (unified[0]().float() - ref.float()).abs().max().item()
    del sets, unified, synced, variants
    torch.cuda.empty_cache()
    return row


def time_variants(row, variants, quick):
    """Times each (name, calls) into row[name], with a <name>_note where timing could not run. All variants of a row
    are captured first and then replayed in turn, rep by rep, so that clock and temperature drift during the row
    hits them alike (timed one after the other, the same kernel once measured 9% apart within a row). The
    median of the reps is reported. A library that cannot be graph-captured is timed in a loop (said in the note,
    which then starts with 'loop:')."""
    import statistics

    torch = torch_module()
    graphs = {}
    for name, calls in variants:
        try:
            graphs[name] = capture(calls, quick)
        except RuntimeError as exc:  # cannot be captured, or does not take this shape
            torch.cuda.synchronize()
            first = str(exc).splitlines()[0][:160]
            try:
                row[name] = loop_us(calls, quick)
                row[name.replace("_us", "_note")] = f"loop: not graph-capturable ({first})"
            except RuntimeError as exc2:
                torch.cuda.synchronize()
                row[name] = None
                row[name.replace("_us", "_note")] = str(exc2).splitlines()[0][:200]
    for graph, _ in graphs.values():  # warm-up
        for _ in range(2):
            graph.replay()
    times = {name: [] for name in graphs}
    for _ in range(3 if quick else 7):
        for name, (graph, per_replay) in graphs.items():
            times[name].append(replay_us(graph, per_replay))
    for name in graphs:
        row[name] = statistics.median(times[name])
    del graphs


def bench_prefill(seq, quick, heads=32):
    import torch

    dim = 128
    sets = []
    for _ in range(2):
        q = torch.randn(1, heads, seq, dim, device="cuda", dtype=torch.float16)
        k = torch.randn(1, heads, seq, dim, device="cuda", dtype=torch.float16)
        sets.append((q, k, torch.randn_like(k), torch.zeros(1, dtype=torch.int64, device="cuda")))
    row = {"phase": "prefill", "batch": 1, "heads": heads, "kv_heads": heads, "kv_len": seq, "head_dim": dim,
           "flops": 4 * heads * seq * seq * dim / 2, "input_copies": len(sets)}
    unified = [Ours(q, k, v, p, softmax="unified") for q, k, v, p in sets]
    synced = [Ours(q, k, v, p, softmax="synchronized") for q, k, v, p in sets]
    row["kernel"] = unified[0].kernel
    from fdpp_rewrite.gpu.attention import prefill_plan

    slots = torch.cuda.get_device_properties(0).multi_processor_count * 2
    row["plan_config"], row["plan_unified_runs_synchronized"] = prefill_plan(heads, seq, slots)
    if 4 in prefill_shapes():  # sm_90: the launcher runs the wgmma kernel, synchronized (attention_launch.cu)
        row["plan_config"], row["plan_unified_runs_synchronized"] = 4, True
    variants = [("ours_unified_us", unified), ("ours_sync_us", synced),
                ("cudnn_us", [sdpa("cudnn", q, k, v, causal=True) for q, k, v, _ in sets]),
                ("flash_us", [sdpa("flash", q, k, v, causal=True) for q, k, v, _ in sets])]
    # Each tile shape forced (1: 128 rows x 32-key steps, 2: 64 rows x 64-key steps, 4: 128 rows on warpgroup
    # MMAs, 5: shape 4 with TMA loads and ping-pong warpgroups; 4 and 5 sm_90 only), both softmax variants: the data
    # behind prefill_tile_config() in attention_heuristics.h and the sm_90 plan in attention_launch.cu.
    for config in prefill_shapes():
        for softmax, short in (("unified", "unified"), ("synchronized", "sync")):
            variants.append((f"ours_{short}_cfg{config}_us",
                             [Ours(q, k, v, p, softmax=softmax, prefill_config=config) for q, k, v, p in sets]))
    time_variants(row, variants, quick)
    q, k, v, _ = sets[0]
    ref = sdpa("flash", q, k, v, causal=True)()
    row["max_abs_diff_vs_flash"] = (unified[0]().float() - ref.float()).abs().max().item()
    del sets, unified, synced, variants
    torch.cuda.empty_cache()
    return row


def derive(row):
    times = [t for t in (row.get("ours_unified_us"), row.get("ours_sync_us")) if t]
    if not times:
        return row
    best = min(times)
    row["ours_best_us"] = best
    row["ours_best_variant"] = "unified" if best == row.get("ours_unified_us") else "synchronized"
    if row.get("ours_unified_us") and row.get("ours_sync_us"):
        row["unified_speedup_over_sync"] = row["ours_sync_us"] / row["ours_unified_us"]
    for peer in ("cudnn", "flash", "cudnn_repeated_kv"):
        if row.get(f"{peer}_us"):
            row[f"speedup_vs_{peer}"] = row[f"{peer}_us"] / row["ours_unified_us"]
            row[f"best_speedup_vs_{peer}"] = row[f"{peer}_us"] / best
    if row["phase"] == "decode":
        for name in ("ours_unified", "ours_sync", "cudnn", "flash"):
            if row.get(f"{name}_us"):
                row[f"{name}_tbps"] = row["bytes"] / (row[f"{name}_us"] * 1e-6) / 1e12
    else:
        for name in ("ours_unified", "ours_sync", "cudnn", "flash"):
            if row.get(f"{name}_us"):
                row[f"{name}_tflops"] = row["flops"] / (row[f"{name}_us"] * 1e-6) / 1e12
    return row


def bars(rows):
    """The issue's bars, evaluated on what ran (ours = the unified variant unless noted); None where no row ran."""
    mha = [r for r in rows if r["phase"] == "decode" and r["heads"] == r["kv_heads"]]
    gqa = [r for r in rows if r["phase"] == "decode" and r["heads"] != r["kv_heads"]]
    pre = [r for r in rows if r["phase"] == "prefill"]

    def every(selected, test):
        return all(map(test, selected)) if selected else None

    long, short = [r for r in mha if r["kv_len"] >= 8192], [r for r in mha if r["kv_len"] == 1024]
    out = {}
    out["decode_L>=8K_vs_cudnn>=0.97"] = every(long, lambda r: r.get("speedup_vs_cudnn", 0) >= 0.97)
    out["decode_L=1K_vs_cudnn>=1.0"] = every(short, lambda r: r.get("speedup_vs_cudnn", 0) >= 1.0)
    flash = [r["speedup_vs_flash"] for r in mha if r.get("speedup_vs_flash")]
    out["decode_geomean_vs_flash"] = math.exp(sum(map(math.log, flash)) / len(flash)) if flash else None
    out["decode_geomean_vs_flash>=1.3"] = out["decode_geomean_vs_flash"] >= 1.3 if flash else None
    out["gqa_decode_vs_cudnn>=1.0"] = every(gqa, lambda r: r.get("speedup_vs_cudnn",
                                                                 r.get("speedup_vs_cudnn_repeated_kv", 0)) >= 1.0)
    out["prefill_vs_flash>=1.0"] = every(pre, lambda r: r.get("speedup_vs_flash", 0) >= 1.0)
    # Where the synchronized variant is faster the profile may choose it per shape: the same bars on the best.
    out["best_variant_decode_L>=8K_vs_cudnn>=0.97"] = every(long, lambda r: r.get("best_speedup_vs_cudnn", 0) >= 0.97)
    out["best_variant_decode_L=1K_vs_cudnn>=1.0"] = every(short, lambda r: r.get("best_speedup_vs_cudnn", 0) >= 1.0)
    out["best_variant_prefill_vs_flash>=1.0"] = every(pre, lambda r: r.get("best_speedup_vs_flash", 0) >= 1.0)
    return out


def progress(row):
    """One line of a finished row's times (us), printed as the run goes (a run cut short still reports)."""
    return " ".join(f"{key[:-3]}={value:.1f}" for key, value in row.items()
                    if key.endswith("_us") and isinstance(value, float))


def print_table(rows, read_tbps):
    print(f"\nstreaming read (torch sum, 4 GiB): {read_tbps:.2f} TB/s")
    head = (f"{'phase':8} {'B':>2} {'H/Hkv':>6} {'L':>6} {'ours':>9} {'sync':>9} {'cuDNN':>9} {'FLASH':>9} "
            f"{'rate':>12} {'xcuDNN':>7} {'xFLASH':>7} {'u/s':>5} {'splits':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        def us(name):
            t = r.get(f"{name}_us")
            return f"{t:8.1f}u" if t else "      n/a"
        if r["phase"] == "decode":
            rate = f"{r.get('ours_unified_tbps', float('nan')):.2f} TB/s"
        else:
            rate = f"{r.get('ours_unified_tflops', float('nan')):.0f} TFLOP/s"
        if r.get("ours_unified_2x_splits_us"):
            half = (f", half the splits, {r['splits'] // 2}: {r['ours_unified_half_splits_us']:.1f}u"
                    if r.get("ours_unified_half_splits_us") else "")
            print(f"         (twice the splits, {min(2 * r['splits'], 128)}: unified "
                  f"{r['ours_unified_2x_splits_us']:.1f}u{half})")
        if r.get("ours_unified_kernel_combine_us"):
            print(f"         (splits combined in a cluster; through the combine kernel instead: unified "
                  f"{r['ours_unified_kernel_combine_us']:.1f}u)")
        if r.get("ours_unified_last_block_us"):
            print(f"         (splits combined by the combine kernel; by their last CTA instead (combine counters): "
                  f"unified {r['ours_unified_last_block_us']:.1f}u)")
        if r.get("ours_unified_all_fallback_us"):
            last = (f"; last-block combine {r['ours_unified_all_fallback_last_block_us']:.1f}u"
                    if r.get("ours_unified_all_fallback_last_block_us") else "")
            print(f"         (every row through the exact fallback: unified {r['ours_unified_all_fallback_us']:.1f}u"
                  f"{last})")
        if r["phase"] == "prefill":
            shapes = ", ".join(f"cfg{c} {s} {r[f'ours_{s}_cfg{c}_us']:.1f}u" for c in (1, 2, 3, 4)
                               for s in ("unified", "sync") if r.get(f"ours_{s}_cfg{c}_us"))
            print(f"         (tile shapes: {shapes})")
        print(f"{r['phase']:8} {r['batch']:>2} {r['heads']:>3}/{r['kv_heads']:<2} {r['kv_len']:>6} "
              f"{us('ours_unified')} {us('ours_sync')} {us('cudnn')} {us('flash')} {rate:>12} "
              f"{r.get('speedup_vs_cudnn', float('nan')):7.3f} "
              f"{r.get('speedup_vs_flash', float('nan')):7.3f} {r.get('unified_speedup_over_sync', float('nan')):5.2f} "
              f"{r.get('splits', '-'):>6}")


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['phase'][:3]} B{r['batch']} {r['heads']}/{r['kv_heads']} L{r['kv_len'] // 1024}K" for r in rows]
    series = [("ours (unified max)", "ours_unified_us"), ("ours (synchronized)", "ours_sync_us"),
              ("cuDNN", "cudnn_us"), ("FLASH", "flash_us")]
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 0.9), 5))
    width = 0.2
    for i, (name, key) in enumerate(series):
        speed = [(r["cudnn_us"] / r[key]) if r.get(key) and r.get("cudnn_us") else 0 for r in rows]
        ax.bar([x + (i - 1.5) * width for x in range(len(rows))], speed, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("speed relative to cuDNN SDPA (higher is faster)")
    ax.set_title("fdpp AsyncSoftmaxAttention vs torch SDPA on this GPU (fp16, head_dim 128)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def claim_output(path: Path, force: bool) -> None:
    """Refuse to overwrite an existing result without --force (before any GPU work); create its folder."""
    from fdpp_rewrite.errors import FdppError

    if path.exists() and not force:
        raise FdppError(f"{path} exists; pass --force to overwrite")
    path.parent.mkdir(parents=True, exist_ok=True)


def write_json(path: Path, result: dict) -> None:
    """Write atomically: a reader never sees half a file, and a failed write leaves the old one."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(result, indent=1))
    temporary.replace(path)


def result_header(schema: str) -> dict:
    """The fields a results JSON of these benchmarks starts with: schema, command line, time, GPU, torch, method."""
    torch = torch_module()
    return {
        "schema": schema,
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "timing": "CUDA graph of back-to-back calls over input copies >= 4x the L2; median replay time / calls",
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from fdpp_rewrite.errors import require_gpu

    require_gpu("bench_attention")
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out / "results.json", args.out / "results.png"
    if json_path.exists() and not args.force:
        print(f"error: {json_path} exists; pass --force to overwrite", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    read_tbps, read_us = stream_read_tbps(args.quick)
    rows = []
    for kv_heads, label in ((32, "decode"), (8, "decode GQA")):
        for batch in (1, 8) if args.only != "prefill" else ():
            for kv_len in (1024, 8192, 32768):
                rows.append(derive(bench_decode(batch, 32, kv_heads, kv_len, args.quick)))
                print(f"{label} B{batch} L{kv_len}: {progress(rows[-1])}", flush=True)
    for seq in (1024, 4096, 16384) if args.only != "decode" else ():
        rows.append(derive(bench_prefill(seq, args.quick)))
        print(f"prefill L{seq}: {progress(rows[-1])}", flush=True)
        torch.cuda.empty_cache()
    print_table(rows, read_tbps)
    verdict = bars(rows)
    print("\nbars:", json.dumps(verdict, indent=1))
    result = {
        **result_header("fdpp-bench-attention/1"),
        "stream_read_tbps": read_tbps, "stream_read_us": read_us,
        "rows": rows, "bars": verdict,
    }
    json_path.write_text(json.dumps(result, indent=1))
    plot(rows, png_path)
    print(f"\nwrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    from fdpp_rewrite.errors import run_script

    run_script(main)
