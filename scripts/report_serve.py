#!/usr/bin/env python3
"""The serving bars (docs/serving.md) from one device run: loadgen levels, the soak and `bench` of the same engine.

    python scripts/report_serve.py --levels c1 c16 c64 --sustained c16_sustained --soak soak \\
        --bench-bs1 bench_bs1.json --bench-bs16 bench_bs16.json --memory-mib 80195 80377 \\
        -o docs/benchmarks/serve-llama2-7b-h200.json

Each level folder holds loadgen.json. Compared: one client's tokens/s against what `bench` bs1 predicts for the
same requests (each: its prompt length's first-token time + (max_tokens - 1) decode steps at that context); 16
clients' tokens/s against bench bs16 at the mix's mean context and their p99 inter-token latency against twice
the bs16 step, from --sustained when given (a 16-client run long enough that the start, when every client's
prompt is prefilled at once, and the drain at the end, when fewer than 16 remain, are a small part of it; the
16-client level is reported beside it); at 64 clients and in the soak every request answered, cancelled or
refused (none failed), no KV slot held once idle, and the GPU memory used after warm-up against after the soak.
Writes the JSON and a PNG of throughput and latency against concurrency beside it.

The paged server's bars (issue 39), from everything scripts/engine_job.sh's stages paged, paged_peer, serve_paged,
capacity, soak_paged and llama3 left in its results folder (names: SCALE_RESULTS), or from the inputs named:

    python scripts/report_serve.py scale --results /tmp/engine_job/results -o serve-paged-llama2-7b-h200.json
    python scripts/report_serve.py scale --today today --decode-heavy decode_heavy --prefix-on prefix_on \
        --prefix-off prefix_off --bench bench_paged.json -o docs/benchmarks/serve-paged-llama2-7b-h200.json

Per bar: our figure, the peer's or reference figure from the same run, the ratio, the bar and met / not met:
- --peer (bench of the paged engine, --kernels fdpp torch with a contiguous --torch-engine): at batch 64, 128, 256
  x context 512 >= ROOFLINE_FLOOR_PCT of the memory roofline and >= PEER_FLOOR x the torch peer; first token at
  batch 16 x 128 <= FIRST_TOKEN_CEILING_MS. --attention: paged decode attention >= ATTENTION_FLOOR x contiguous at
  every point.
- --today (--mix today at 16, 64, 256 clients): 16 clients >= TODAY_16_FLOOR tokens/s, 64 >= 1.6x and 256 >= 2x
  the 16-client figure, time to first token p50/p99 at each.
- --decode-heavy (16 and 256 clients): 256 >= 2.5x 16; with --bench, 256 clients >= 75% of bench at batch 256 at
  the mix's mean context (mean prompt + half the output; a bench point's is its context + half its new tokens,
  within BENCH_CONTEXT_TOLERANCE) and p99 inter-token latency <= 2.5x that bench step.
- --prefix-on / --prefix-off (--mix shared-prefix at 64 clients, serve with and without --no-prefix-cache): p50
  time to first token >= 4x lower with the cache, tokens/s not lower, identical outputs (equal outputs_sha256).
- --capacity-log (the capacity server's log: its KV pool line) and --capacity (loadgen --mix 8k-sequences with
  --sample-interval): the 8,192-token sequences held at once (the peak of kv_slots_in_use, else the pool line's
  figure) within CAPACITY_TOLERANCE of the pool's memory / (KV bytes a token x 8,192); the same over --kv-memory
  x the memory free after the weights is shown beside it.
- --soak (loadgen with cancellations) and --soak-memory (nvidia-smi samples over the soak, after its warm-up): 0
  failed, 0 KV blocks in use once idle, GPU memory growth <= MEMORY_FLAT_PCT from the first sample to the last.
- --llama3-bench / --llama3-serve: llama3-8b's tokens/s and % of the roofline at batch 256 and its 256 served
  clients, beside llama2-7b's (--peer at batch 256, the 256-client levels).
With --results every bar is listed, "not measured" (and the stage to run) where its results are missing; otherwise
only the bars of the inputs given. Writes the JSON, the table as .md and a PNG of tokens/s and time to first token
against clients (a line per loadgen run) beside it, and prints the table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fdpp_rewrite.atomic import AtomicOutputs  # noqa: E402
from fdpp_rewrite.errors import FdppError  # noqa: E402


def load_loadgen():
    spec = importlib.util.spec_from_file_location("loadgen", ROOT / "scripts" / "loadgen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FdppError(f"cannot read {path}: {exc}") from None


def bench_by_context(path: Path, batch: int) -> dict:
    points = {p["context"]: p for p in read_json(path)["points"]
              if p["batch"] == batch and p.get("kernels", "fdpp") == "fdpp"}
    if not points:
        raise FdppError(f"{path} has no fdpp point at batch {batch}")
    return points


def predicted_one_client(report: dict, bench: dict, max_len: int, loadgen) -> float:
    """tokens/s that bench's bs1 figures give for the requests the one-client level sent."""
    requests = report["requests"]  # one count, or one per level (a one-client run has one level)
    mix = loadgen.request_mix(report["seed"], requests[0] if isinstance(requests, list) else requests, max_len,
                              report["max_output"],
                              report["prompt_lengths"], report["output_lengths"],
                              shared_prefix=report.get("shared_prefix", 0))
    seconds = tokens = 0.0
    for request in mix:
        point = bench.get(len(request["prompt"]))
        if point is None:
            raise FdppError(f"bench has no bs1 point at context {len(request['prompt'])}; bench every prompt length")
        seconds += (point["first_token_ms"] + (request["max_tokens"] - 1) * point["ms_per_step"]) / 1e3
        tokens += request["max_tokens"]
    return tokens / seconds


# issue 39's bars: each threshold once (docs/benchmarks.md has the measurements they come from)
TODAY_16_FLOOR = 2409.0  # tokens/s of 16 clients on today's mix before the paged cache (docs/benchmarks.md)
ROOFLINE_FLOOR_PCT = 80.0
PEER_FLOOR = 1.15  # over `bench --kernels torch` (cuBLAS + SDPA) on a contiguous build of the same graph
PEER_BATCHES, PEER_CONTEXT = (64, 128, 256), 512
FIRST_TOKEN_POINT, FIRST_TOKEN_CEILING_MS = (16, 128), 44.0  # 0.7x Hugging Face eager's 63.4 ms
ATTENTION_FLOOR = 0.97
CAPACITY_TOKENS, CAPACITY_TOLERANCE = 8192, 0.05
MEMORY_FLAT_PCT = 1.0  # GPU memory growth from the first sample after warm-up to the last, at most
BENCH_CONTEXT_TOLERANCE = 0.1  # a bench point stands for a mix whose mean context is within this share of its own
BENCH_NEW_TOKENS = 64  # decode steps of the bench point a mix is compared with
SCALE_RUNS = ("today", "decode_heavy", "prefix_on", "prefix_off")
# scripts/engine_job.sh's names under its results folder (report_serve.py scale --results FOLDER)
SCALE_RESULTS = {"today": "serve_today", "decode_heavy": "serve_decode_heavy", "prefix_on": "serve_prefix_on",
                 "prefix_off": "serve_prefix_off", "bench": "serve_bench_decode_heavy.json",
                 "peer": "paged_peer.json", "attention": "paged_attention.json", "capacity": "serve_capacity",
                 "capacity_log": "server_capacity.log", "soak": "serve_soak", "soak_memory": "soak_gpu_memory.tsv",
                 "llama3_bench": "llama3_bench.json", "llama3_serve": "serve_llama3"}
# the load line of a paged engine (engine/paged_memory.pool_line)
POOL_LINE = re.compile(r"KV pool: (?P<blocks>\d+) blocks of (?P<block>\d+) tokens, [\d.]+ GiB, [\d,]+ tokens "
                       r"\((?P<per_token>[\d,]+) bytes a token; (?P<sequences>\d+) sequences of 8K\); "
                       r"(?P<free>[\d.]+) GiB free after the weights, (?P<kept>[\d.]+) GiB kept back")


def by_clients(folder: Path) -> tuple[dict, dict]:
    """A loadgen run's report and its points by client count."""
    report = read_json(folder / "loadgen.json")
    return report, {p["concurrency"]: p for p in report["points"]}


def level(points: dict, clients: int, run: str) -> dict:
    if clients not in points:
        raise FdppError(f"the {run} run has no {clients}-client level (it has {sorted(points)}); run loadgen with "
                        f"--clients {clients}")
    return points[clients]


def verdict(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[met]


def ratio_bar(value: float, base: float, at_least: float | None = None, at_most: float | None = None,
              **about) -> dict:
    """value / base against a floor (at_least) or a ceiling (at_most); `about`: title, ours, peer (table text)."""
    ratio = value / base if base else None
    met = ratio is not None and (ratio >= at_least if at_most is None else ratio <= at_most)
    return {"value": value, "base": base, "ratio": ratio,
            "bar": f">= {at_least}" if at_most is None else f"<= {at_most}", "met": met, **about}


def not_measured(title: str, why: str) -> dict:
    return {"title": title, "met": None, "note": why}


def tps(point: dict) -> str:
    """A level's or bench point's tokens/s, with a level's refused and failed requests when there are any."""
    lost = ", ".join(f"{point[key]} {key}" for key in ("refused", "failed") if point.get(key))
    return f"{point['tokens_per_s']:,.1f} tok/s" + (f" ({lost})" if lost else "")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def today_bars(points: dict) -> dict:
    sixteen = level(points, 16, "today")
    bars = {"today_16_clients_tokens_per_s": ratio_bar(
        sixteen["tokens_per_s"], TODAY_16_FLOOR, 1.0, title="today's mix, 16 clients (no regression)",
        ours=tps(sixteen), peer=f"{TODAY_16_FLOOR:,.0f} tok/s (the slot server, docs/benchmarks.md)")}
    for clients, factor in ((64, 1.6), (256, 2.0)):
        point = level(points, clients, "today")
        bars[f"today_{clients}_vs_16_clients"] = ratio_bar(
            point["tokens_per_s"], sixteen["tokens_per_s"], factor, title=f"today's mix, {clients} over 16 clients",
            ours=tps(point), peer=f"{tps(sixteen)} (16 clients, same server)")
    ttft = {str(c): {"p50": points[c]["ttft_p50_ms"], "p99": points[c]["ttft_p99_ms"]} for c in (16, 64, 256)
            if c in points}
    shown = "; ".join(f"{c}: {ms(t['p50'])} / {ms(t['p99'])} ms" for c, t in ttft.items())
    bars["today_ttft_ms"] = {**ttft, "title": "today's mix, time to first token p50 / p99", "ours": shown,
                             "bar": "reported", "met": len(ttft) == 3}
    return bars


def mean_context(report: dict) -> float:
    """A loadgen mix's mean decode context: its mean prompt (shared prefix included) + half its mean output."""
    prompts, outputs = report["prompt_lengths"], report["output_lengths"]
    return report.get("shared_prefix", 0) + sum(prompts) / len(prompts) + sum(outputs) / len(outputs) / 2


def decode_heavy_bench_args(report: dict) -> tuple[int, int]:
    """bench's --context and --new-tokens for batch 256 at a mix's mean context: BENCH_NEW_TOKENS new tokens around
    it (the mix's whole output, 512 new tokens on 256 rows, would not fit the pool that serves the mix)."""
    return round(mean_context(report) - BENCH_NEW_TOKENS / 2), BENCH_NEW_TOKENS


def bench_at(path: Path, batch: int, context: float) -> dict | None:
    """The fdpp point at `batch` whose mean decode context (context + new_tokens / 2) is nearest `context`, if
    within BENCH_CONTEXT_TOLERANCE of it."""
    points = bench_by_context(path, batch)
    point = min(points.values(), key=lambda p: abs(p["context"] + p.get("new_tokens", 0) / 2 - context))
    near = abs(point["context"] + point.get("new_tokens", 0) / 2 - context) <= BENCH_CONTEXT_TOLERANCE * context
    return point if near else None


def decode_heavy_bars(report: dict, points: dict, bench_path: Path | None) -> dict:
    top, sixteen = level(points, 256, "decode_heavy"), level(points, 16, "decode_heavy")
    bars = {"decode_heavy_256_vs_16_clients": ratio_bar(
        top["tokens_per_s"], sixteen["tokens_per_s"], 2.5, title="decode-heavy mix, 256 over 16 clients",
        ours=tps(top), peer=f"{tps(sixteen)} (16 clients, same server)")}
    titles = ("decode-heavy mix, 256 clients over bench batch 256 at the mix's mean context",
              "decode-heavy mix, 256 clients, p99 inter-token latency over that bench step")
    context = mean_context(report)
    point = bench_at(bench_path, 256, context) if bench_path is not None and bench_path.is_file() else None
    if point is None:
        why = (f"no bench at batch 256 near the mix's mean context {context:.0f} (bench --batch 256 --context "
               "{} --new-tokens {})".format(*decode_heavy_bench_args(report)))
        return {**bars, "decode_heavy_256_vs_bench": not_measured(titles[0], why),
                "decode_heavy_256_itl_p99_ms": not_measured(titles[1], why)}
    shown = f"bench batch 256, context {point['context']} + {point.get('new_tokens', 0)} new"
    bars["decode_heavy_256_vs_bench"] = {**ratio_bar(top["tokens_per_s"], point["tokens_per_s"], 0.75,
                                                     title=titles[0], ours=tps(top), peer=f"{tps(point)} ({shown})"),
                                         "bench_context": point["context"], "mix_mean_context": context}
    step = point["ms_per_step"]
    bars["decode_heavy_256_itl_p99_ms"] = {**ratio_bar(top["itl_p99_ms"], step, at_most=2.5, title=titles[1],
                                                       ours=f"{top['itl_p99_ms']:.2f} ms",
                                                       peer=f"{step:.2f} ms a step ({shown})"),
                                           "bench_step_ms": step}
    return bars


def prefix_bars(on_points: dict, off_points: dict) -> dict:
    on, off = level(on_points, 64, "prefix_on"), level(off_points, 64, "prefix_off")
    same = on["outputs_sha256"] == off["outputs_sha256"] and on["answered"] == on["requests"] == off["answered"]
    return {
        "prefix_cache_ttft_p50": ratio_bar(off["ttft_p50_ms"], on["ttft_p50_ms"], 4.0,
                                           title="prefix caching, 64 clients: p50 time to first token, off over on",
                                           ours=f"{on['ttft_p50_ms']:.1f} ms (on)",
                                           peer=f"{off['ttft_p50_ms']:.1f} ms (off, second server)"),
        "prefix_cache_tokens_per_s": ratio_bar(on["tokens_per_s"], off["tokens_per_s"], 1.0,
                                               title="prefix caching, 64 clients: tokens/s, on over off",
                                               ours=f"{tps(on)} (on)", peer=f"{tps(off)} (off)"),
        "prefix_cache_identical_outputs": {"title": "prefix caching: greedy outputs identical (outputs_sha256)",
                                           "met": same, "answered": [on["answered"], off["answered"]],
                                           "ours": f"{on['outputs_sha256'][:12]} ({on['answered']} answered"
                                                   f"{differing(on, off)})",
                                           "peer": f"{off['outputs_sha256'][:12]} ({off['answered']} answered)",
                                           "bar": "equal"},
    }


def differing(on: dict, off: dict) -> str:
    """', N of them differ' from the per-request digests both runs have (loadgen's output_digests), else ''."""
    a, b = on.get("output_digests"), off.get("output_digests")
    if not a or not b:
        return ""
    both = set(a) & set(b)
    return f", {sum(a[i] != b[i] for i in both)} of {len(both)} answered by both differ"


def peer_bars(path: Path) -> dict:
    """bench of the paged engine beside `--kernels torch` on a contiguous build (--torch-engine), one run."""
    report = read_json(path)
    points = {(p["kernels"], p["batch"], p["context"]): p for p in report["points"]}
    read = report.get("stream_read_bytes_per_s")
    bars = {}
    for batch in PEER_BATCHES:
        ours, torch = points.get(("fdpp", batch, PEER_CONTEXT)), points.get(("torch", batch, PEER_CONTEXT))
        where = f"batch {batch}, context {PEER_CONTEXT}"
        if ours is None or "roofline_pct" not in ours:
            bars[f"bench_roofline_b{batch}"] = not_measured(f"bench {where}: % of the memory roofline",
                                                            f"{path.name} has no fdpp point with a roofline there")
        else:
            bars[f"bench_roofline_b{batch}"] = {
                "title": f"bench {where}: % of the memory roofline", "value": ours["roofline_pct"],
                "bar": f">= {ROOFLINE_FLOOR_PCT}", "met": ours["roofline_pct"] >= ROOFLINE_FLOOR_PCT,
                "ours": f"{tps(ours)}, {ours['roofline_pct']:.1f}%",
                "peer": f"roofline {ours['roofline_ms']:.2f} ms a step at {(read or 0) / 1e12:.2f} TB/s read"}
        if ours is None or torch is None:
            bars[f"bench_vs_torch_b{batch}"] = not_measured(f"bench {where}: over --kernels torch",
                                                            f"{path.name} lacks the fdpp or torch point there")
        else:
            bars[f"bench_vs_torch_b{batch}"] = ratio_bar(
                ours["tokens_per_s"], torch["tokens_per_s"], PEER_FLOOR, title=f"bench {where}: over --kernels torch",
                ours=tps(ours), peer=f"{tps(torch)} (cuBLAS + SDPA, contiguous build, same run)")
    batch, context = FIRST_TOKEN_POINT
    ours, torch = points.get(("fdpp", batch, context)), points.get(("torch", batch, context))
    title = f"first token, bench batch {batch} x {context}-token prompts"
    if ours is None:
        bars["first_token_ms"] = not_measured(title, f"{path.name} has no fdpp point at batch {batch}, context "
                                                     f"{context}")
    else:
        bars["first_token_ms"] = {"title": title, "value": ours["first_token_ms"],
                                  "bar": f"<= {FIRST_TOKEN_CEILING_MS} ms",
                                  "met": ours["first_token_ms"] <= FIRST_TOKEN_CEILING_MS,
                                  "ours": f"{ours['first_token_ms']:.2f} ms",
                                  "peer": (f"{torch['first_token_ms']:.2f} ms (cuBLAS + SDPA, same run); "
                                           if torch else "") + "HF eager 63.4 ms (earlier lease)"}
    return bars


def attention_bars(path: Path) -> dict:
    """The worst timed point; points bench_paged_attention.py did not time (a skip note, no speed_ratio) are left
    out and counted."""
    title = "paged decode attention over contiguous, every point"
    every = read_json(path)["rows"]
    rows = [r for r in every if "speed_ratio" in r]
    untimed = len(every) - len(rows)
    if not rows:
        notes = sorted({r.get("note", "no speed_ratio") for r in every}) or ["no rows"]
        return {"paged_attention_vs_contiguous": not_measured(
            title, f"{path.name} has no timed point ({len(every)} rows untimed: {'; '.join(notes)[:200]})")}
    worst = min(rows, key=lambda r: r["speed_ratio"])
    below = sum(r["speed_ratio"] < ATTENTION_FLOOR for r in rows)
    return {"paged_attention_vs_contiguous": {
        "title": title, "value": worst["speed_ratio"],
        "bar": f">= {ATTENTION_FLOOR}", "met": below == 0, "points_below": below, "points": len(rows),
        "points_untimed": untimed,
        "ours": f"worst {worst['paged_us']:.1f} us (batch {worst['batch']}, {worst['heads']}/{worst['kv_heads']} "
                f"heads, context {worst['context']}); {below} of {len(rows)} points below"
                + (f"; {untimed} not timed (skipped)" if untimed else ""),
        "peer": f"contiguous {worst['contiguous_us']:.1f} us", "ratio": worst["speed_ratio"]}}


def pool_report(log: Path) -> dict:
    """The last KV pool line of a paged server's log."""
    try:
        found = list(POOL_LINE.finditer(log.read_text(errors="replace")))
    except OSError as exc:
        raise FdppError(f"cannot read {log}: {exc}") from None
    if not found:
        raise FdppError(f"{log} has no 'KV pool: ...' line; it is the log of a paged server (serve on an engine built "
                        "with --kv-memory)")
    values = {key: float(value.replace(",", "")) for key, value in found[-1].groupdict().items()}
    return {**values, "free_bytes": values["free"] * 2**30, "kept_back_bytes": values["kept"] * 2**30}


def capacity_bars(run: Path | None, log: Path, kv_fraction: float) -> dict:
    """Sequences of CAPACITY_TOKENS held at once (the peak of kv_slots_in_use while more were waiting, else the
    pool's own figure) against the pool's memory / the bytes of one such sequence."""
    pool = pool_report(log)
    sequence_bytes = pool["per_token"] * CAPACITY_TOKENS
    pool_bytes = pool["blocks"] * pool["block"] * pool["per_token"]
    expected = pool_bytes / sequence_bytes
    given = kv_fraction * pool["free_bytes"] / sequence_bytes  # before the kept-back reserve
    admitted, source = pool["sequences"], "the pool's load line"
    note = ""
    if run is not None and (run / "loadgen.json").is_file():
        report, points = by_clients(run)
        point = points[max(points)]
        peak = point.get("busy_metrics", {}).get("peak", {}).get("kv_slots_in_use")
        tokens = report["prompt_lengths"][0] + report["output_lengths"][0]
        if peak is None or tokens != CAPACITY_TOKENS or point["failed"]:
            note = f"{run.name} sampled no peak, its sequences are not {CAPACITY_TOKENS} tokens, or some failed"
        elif peak >= point["concurrency"]:
            note = f"every one of its {point['concurrency']} clients was admitted: raise --clients"
        else:
            admitted, source = int(peak), f"the most sequences the server held at once ({run.name})"
    return {"capacity_8k_sequences": {
        **ratio_bar(admitted, expected, 1 - CAPACITY_TOLERANCE), "bar": f"within {CAPACITY_TOLERANCE:.0%}",
        "met": abs(admitted / expected - 1) <= CAPACITY_TOLERANCE if not note else None,
        "title": f"capacity: {CAPACITY_TOKENS}-token sequences admitted with --kv-memory {kv_fraction:g}",
        "ours": f"{admitted} ({source})", "pool_line_sequences": pool["sequences"], "note": note,
        "peer": f"{expected:.1f} = KV memory {pool_bytes / 2**30:.2f} GiB / ({pool['per_token']:,.0f} B x "
                f"{CAPACITY_TOKENS}); of {kv_fraction:g} x the {pool['free']:.2f} GiB free after the weights "
                f"(before the {pool['kept']:.2f} GiB kept back): {given:.1f}",
        "given_sequences": given}}


def gpu_memory(path: Path) -> tuple[list[float], set]:
    """MiB samples of `time MiB [process|device]` lines (engine_job.sh's sampler of nvidia-smi: the server
    process's memory, or the whole GPU's), and which of the two they are."""
    try:
        lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
        samples = [float(fields[1]) for fields in lines]
    except (OSError, IndexError, ValueError) as exc:
        raise FdppError(f"cannot read GPU memory samples from {path}: {exc}") from None
    if len(samples) < 2:
        raise FdppError(f"{path} has {len(samples)} GPU memory sample(s); the soak needs at least two")
    return samples, {fields[2] for fields in lines if len(fields) > 2}


def soak_bars(run: Path, memory: Path | None) -> dict:
    report, points = by_clients(run)
    point = points[max(points)]
    idle = point["idle_metrics"]
    blocks = idle.get("kv_blocks_used")
    bars = {"soak_failed": {"title": f"soak: {point['requests']} requests, prompts {min(report['prompt_lengths'])}-"
                                     f"{max(report['prompt_lengths'])}, {report['cancel_fraction']:.0%} cancelled",
                            "value": point["failed"], "bar": "0 failed", "met": point["failed"] == 0,
                            "ours": f"{point['answered']} answered, {point['cancelled']} cancelled, "
                                    f"{point['refused']} refused, {point['failed']} failed"},
            "soak_idle_blocks": {"title": "soak: KV blocks in use once idle (/metrics kv_blocks_used)",
                                 "value": blocks, "bar": "0", "met": bool(idle["drained"]) and blocks == 0,
                                 "ours": f"{blocks} ({'drained' if idle['drained'] else 'still busy'})"}}
    title = "soak: GPU memory after warm-up, first sample against last"
    if memory is None or not memory.is_file():
        bars["soak_gpu_memory"] = not_measured(title, "no GPU memory samples beside the soak")
        return bars
    samples, sources = gpu_memory(memory)
    growth = 100 * (samples[-1] - samples[0]) / samples[0]
    bars["soak_gpu_memory"] = {"title": title, "value": growth, "bar": f"growth <= {MEMORY_FLAT_PCT}%",
                               "met": growth <= MEMORY_FLAT_PCT, "samples": len(samples),
                               "first_mib": samples[0], "last_mib": samples[-1], "max_mib": max(samples),
                               "of": sorted(sources),
                               "ours": f"{samples[0]:,.0f} -> {samples[-1]:,.0f} MiB ({growth:+.2f}%; max "
                                       f"{max(samples):,.0f}, {len(samples)} samples"
                                       + (f" of the {' and '.join(sorted(sources))}" if sources else "") + ")"}
    return bars


def llama3_bars(bench: Path | None, serve: Path | None, peer: Path | None, runs: dict) -> dict:
    """llama3-8b beside llama2-7b: bench at batch 256 (tokens/s, % of the roofline) and 256 served clients; met
    when both of llama3's are there, the serving lost no request, and a llama2 figure stands beside them."""
    def bench_text(points):
        return [f"bench b256 ctx {p['context']}: {tps(p)}, {p.get('roofline_pct', float('nan')):.1f}%"
                for p in points]
    ours, beside, served = [], [], None
    if bench is not None:
        ours += bench_text(bench_by_context(bench, 256).values())
    if serve is not None:
        served = level(by_clients(serve)[1], 256, "llama3")
        ours.append(f"serve 256 clients, prompts 1K-4K: {tps(served)}, TTFT p50 {ms(served['ttft_p50_ms'])} ms")
    if peer is not None:
        beside += bench_text(p for p in bench_by_context(peer, 256).values() if p["context"] == PEER_CONTEXT)
    for name in ("today", "decode_heavy"):
        if name in runs and 256 in runs[name][1]:
            beside.append(f"serve 256 clients, {runs[name][0]['mix']}: {tps(runs[name][1][256])}")
    title = "llama3-8b (GQA 32/8, 128K vocabulary) beside llama2-7b"
    if bench is None or served is None:
        missing = "bench (llama3_bench.json)" if bench is None else "serving (serve_llama3)"
        return {"llama3_beside_llama2": {**not_measured(title, f"no llama3 {missing}: run scripts/engine_job.sh "
                                                               "llama3"), "ours": "; ".join(ours)}}
    return {"llama3_beside_llama2": {"title": title, "bar": "reported", "met": bool(beside) and not served["failed"],
                                     "ours": "; ".join(ours), "peer": "llama2-7b: " + "; ".join(beside)}}


def scale_bars(runs: dict, bench_path: Path | None) -> dict:
    """The paged server's bars from the loadgen runs given (module docstring)."""
    bars = {}
    if "today" in runs:
        bars.update(today_bars(runs["today"][1]))
    if "decode_heavy" in runs:
        bars.update(decode_heavy_bars(*runs["decode_heavy"], bench_path))
    if "prefix_on" in runs and "prefix_off" in runs:
        bars.update(prefix_bars(runs["prefix_on"][1], runs["prefix_off"][1]))
    return bars


def markdown(bars: dict) -> str:
    """One row a bar: ours, the peer's or reference figure from the same run, the ratio, the bar, the verdict."""
    lines = ["| bar | ours | peer / reference | ratio | bar | verdict |", "| --- | --- | --- | --- | --- | --- |"]
    for bar in bars.values():
        ratio = f"{bar['ratio']:.3f}" if bar.get("ratio") is not None else "-"
        ours = bar.get("ours", "-") if bar["met"] is not None else bar.get("note", "-")
        lines.append(f"| {bar['title']} | {ours} | {bar.get('peer', '-')} | {ratio} | {bar.get('bar', '-')} | "
                     f"{verdict(bar['met'])} |")
    return "\n".join(lines) + "\n"


def present(paths: dict, everything: bool) -> dict:
    """The inputs to read: with --results (everything) only those that exist, else every one given."""
    def found(path):
        return path is not None and (path.is_file() or (path / "loadgen.json").is_file())
    return {name: path for name, path in paths.items() if (found(path) if everything else path is not None)}


def all_bars(paths: dict, runs: dict, kv_fraction: float, everything: bool) -> dict:
    """Every bar group whose inputs are present; with `everything`, a 'not measured' row for each one missing or
    unreadable, naming the engine_job.sh stage that makes it."""
    groups = (
        ("peer", "bench batch 64/128/256 x 512 (roofline, over --kernels torch) and the first token", "paged_peer",
         lambda: peer_bars(paths["peer"]), "peer" in paths),
        ("attention", "paged decode attention over contiguous", "paged",
         lambda: attention_bars(paths["attention"]), "attention" in paths),
        ("decode_heavy", "decode-heavy mix at 16 and 256 clients", "serve_paged",
         lambda: decode_heavy_bars(*runs["decode_heavy"], paths.get("bench")), "decode_heavy" in runs),
        ("today", "today's mix at 16, 64, 256 clients", "serve_paged", lambda: today_bars(runs["today"][1]),
         "today" in runs),
        ("prefix", "prefix caching on against off", "serve_paged",
         lambda: prefix_bars(runs["prefix_on"][1], runs["prefix_off"][1]),
         "prefix_on" in runs and "prefix_off" in runs),
        ("capacity", "capacity: 8K-token sequences admitted", "capacity",
         lambda: capacity_bars(paths.get("capacity"), paths["capacity_log"], kv_fraction), "capacity_log" in paths),
        ("soak", "soak: 2,000 requests of 128-8K prompts with cancellations", "soak_paged",
         lambda: soak_bars(paths["soak"], paths.get("soak_memory")), "soak" in paths),
        ("llama3", "llama3-8b beside llama2-7b", "llama3",
         lambda: llama3_bars(paths.get("llama3_bench"), paths.get("llama3_serve"), paths.get("peer"), runs),
         "llama3_bench" in paths or "llama3_serve" in paths),
    )
    bars = {}
    for name, title, stage, compute, available in groups:
        if not available:
            if everything:
                bars[name] = not_measured(title, f"no results: run scripts/engine_job.sh {stage}")
            continue
        try:
            bars.update(compute())
        except FdppError as exc:  # with --results, a stage cut short costs its own rows, not the table
            if not everything:
                raise
            bars[name] = not_measured(title, f"{exc} (scripts/engine_job.sh {stage})")
    return bars


def plot_scale(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (throughput, ttft) = plt.subplots(1, 2, figsize=(11, 4))
    clients = sorted({c for _, points in runs.values() for c in points})
    for name, (_, points) in runs.items():
        levels = sorted(points)
        throughput.plot(levels, [points[c]["tokens_per_s"] for c in levels], marker="o", label=name)
        for key, style in (("ttft_p50_ms", "-"), ("ttft_p99_ms", ":")):
            values = [points[c][key] if points[c][key] is not None else float("nan") for c in levels]
            ttft.plot(levels, values, style, marker="o", label=f"{name} {key[5:8]}")
    throughput.set(xlabel="clients", ylabel="output tokens/s", title="throughput", xscale="log")
    ttft.set(xlabel="clients", ylabel="ms", title="time to first token", xscale="log", yscale="log")
    for axes in (throughput, ttft):
        axes.set_xticks(clients, [str(c) for c in clients])
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")  # the temporary name has no .png suffix
    plt.close(figure)


PLOTTED_RUNS = SCALE_RUNS + ("llama3_serve",)


def scale_main(argv) -> int:
    parser = argparse.ArgumentParser(prog="report_serve.py scale", description="the paged server's bars (issue 39)")
    parser.add_argument("--results", type=Path, help="scripts/engine_job.sh's results folder: every input below "
                        "not given is read from its name there (SCALE_RESULTS), and every bar is listed")
    for run in SCALE_RUNS:
        parser.add_argument(f"--{run.replace('_', '-')}", type=Path, help="a loadgen -o folder")
    parser.add_argument("--bench", type=Path, help="bench JSON of the same engine with a batch 256 point at the "
                                                   "decode-heavy mix's mean context")
    parser.add_argument("--peer", type=Path, help="bench JSON of the paged engine with --kernels fdpp torch "
                                                  "--torch-engine (batch 16 x 128, 64/128/256 x 512)")
    parser.add_argument("--attention", type=Path, help="scripts/bench_paged_attention.py's JSON")
    parser.add_argument("--capacity", type=Path, help="loadgen -o folder of the 8k-sequences mix (--sample-interval)")
    parser.add_argument("--capacity-log", type=Path, help="the log of the capacity server (its KV pool line)")
    parser.add_argument("--kv-memory", type=float, default=0.9, help="the capacity engine's --kv-memory fraction")
    parser.add_argument("--soak", type=Path, help="the soak's loadgen -o folder")
    parser.add_argument("--soak-memory", type=Path, help="GPU memory samples over the soak (`time MiB` lines)")
    parser.add_argument("--llama3-bench", type=Path, help="bench JSON of the llama3-8b paged engine at batch 256")
    parser.add_argument("--llama3-serve", type=Path, help="loadgen -o folder of llama3-8b at 256 clients")
    parser.add_argument("--command", default="", help="how the run was made (recorded)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the JSON (the .md table and .png beside it)")
    args = parser.parse_args(argv)
    try:
        everything = args.results is not None
        if everything and not args.results.is_dir():
            raise FdppError(f"--results {args.results} is not a folder; pass scripts/engine_job.sh's results folder")
        paths = {name: getattr(args, name) for name in SCALE_RESULTS}
        if everything:
            paths = {name: path or args.results / SCALE_RESULTS[name] for name, path in paths.items()}
        paths = present(paths, everything)
        if not paths and not everything:
            raise FdppError("pass --results FOLDER, or at least one of --today, --decode-heavy, --prefix-on, "
                            "--prefix-off, --peer, --attention, --capacity-log, --soak, --llama3-bench")
        runs = {run: by_clients(paths[run]) for run in PLOTTED_RUNS if run in paths}
        bars = all_bars(paths, runs, args.kv_memory, everything)
        table = markdown(bars)
        print(table, end="")
        result = {"command": args.command, "inputs": {name: str(path) for name, path in paths.items()},
                  "bars": bars, "runs": {name: {"command": report["command"], "points": report["points"]}
                                         for name, (report, _) in runs.items()}}
        png, md = args.out.with_suffix(".png"), args.out.with_suffix(".md")
        with AtomicOutputs([png, md, args.out] if runs else [md, args.out], force=True, option="-o",
                           example="serve-paged.json") as outputs:
            if runs:
                plot_scale(runs, outputs.temp(png))
            outputs.temp(md).write_text(table)
            outputs.temp(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}, {md}" + (f" and {png}" if runs else ""))
        return 0
    except FdppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["scale"]:
        return scale_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=Path, nargs="+", required=True, help="loadgen -o folders, one per level")
    parser.add_argument("--sustained", type=Path,
                        help="a longer 16-client loadgen -o folder for the 16-client bars (default: the level's)")
    parser.add_argument("--soak", type=Path, required=True, help="the soak's loadgen -o folder")
    parser.add_argument("--bench-bs1", type=Path, required=True)
    parser.add_argument("--bench-bs16", type=Path, required=True)
    parser.add_argument("--memory-mib", type=float, nargs=2, metavar=("AFTER_WARMUP", "AFTER_SOAK"), required=True,
                        help="GPU memory used (nvidia-smi) after the warm-up and after the soak")
    parser.add_argument("--max-seq", type=int, default=8320, help="the engine's max sequence (caps the mix)")
    parser.add_argument("--command", default="", help="how the run was made (recorded)")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        loadgen = load_loadgen()
        levels = {}
        for folder in args.levels:
            report = read_json(folder / "loadgen.json")
            levels[report["points"][0]["concurrency"]] = (report, report["points"][0])
        soak_report = read_json(args.soak / "loadgen.json")
        soak = soak_report["points"][0]
        bs1 = bench_by_context(args.bench_bs1, 1)
        bs16 = bench_by_context(args.bench_bs16, 16)
        if 1 not in levels or 16 not in levels or 64 not in levels:
            raise FdppError("--levels must include the concurrencies 1, 16 and 64")

        one_report, one = levels[1]
        predicted = predicted_one_client(one_report, bs1, args.max_seq, loadgen)
        sixteen_report, sixteen = levels[16]
        if args.sustained is not None:
            sixteen_report = read_json(args.sustained / "loadgen.json")
            sixteen = sixteen_report["points"][0]
            if sixteen["concurrency"] != 16:
                raise FdppError(f"--sustained {args.sustained} ran {sixteen['concurrency']} clients, not 16")
        mean_prompt = sum(sixteen_report["prompt_lengths"]) / len(sixteen_report["prompt_lengths"])
        context = min(bs16, key=lambda c: abs(c - mean_prompt))
        step_ms = bs16[context]["ms_per_step"]
        sixty_four = levels[64][1]
        growth = args.memory_mib[1] - args.memory_mib[0]
        bars = {
            "one_client_tokens_per_s": {"server": one["tokens_per_s"], "bench_bs1_predicted": predicted,
                                        "ratio": one["tokens_per_s"] / predicted, "bar": ">= 0.95",
                                        "met": one["tokens_per_s"] / predicted >= 0.95},
            "sixteen_clients_tokens_per_s": {"server": sixteen["tokens_per_s"], "requests": sixteen["requests"],
                                             "short_run_server": levels[16][1]["tokens_per_s"],
                                             "short_run_requests": levels[16][1]["requests"],
                                             f"bench_bs16_context_{context}": bs16[context]["tokens_per_s"],
                                             "ratio": sixteen["tokens_per_s"] / bs16[context]["tokens_per_s"],
                                             "bar": ">= 0.80",
                                             "met": sixteen["tokens_per_s"] >= 0.8 * bs16[context]["tokens_per_s"]},
            "sixteen_clients_itl_p99_ms": {"server": sixteen["itl_p99_ms"],
                                           "short_run_server": levels[16][1]["itl_p99_ms"],
                                           "bench_bs16_step_ms": step_ms,
                                           "ratio": sixteen["itl_p99_ms"] / step_ms, "bar": "<= 2.0",
                                           "met": sixteen["itl_p99_ms"] <= 2 * step_ms},
            "sixty_four_clients": {"requests": sixty_four["requests"], "answered": sixty_four["answered"],
                                   "refused": sixty_four["refused"], "failed": sixty_four["failed"],
                                   "met": sixty_four["failed"] == 0},
            "soak": {"requests": soak["requests"], "answered": soak["answered"], "cancelled": soak["cancelled"],
                     "refused": soak["refused"], "failed": soak["failed"],
                     "kv_slots_in_use_idle": soak["idle_metrics"]["kv_slots_in_use"],
                     "gpu_memory_mib_after_warmup": args.memory_mib[0], "gpu_memory_mib_after_soak": args.memory_mib[1],
                     "gpu_memory_growth_pct": 100 * growth / args.memory_mib[0],
                     "met": soak["failed"] == 0 and soak["idle_metrics"]["kv_slots_in_use"] == 0},
        }
        result = {"command": args.command, "levels": [levels[c][1] for c in sorted(levels)],
                  "level_commands": [levels[c][0]["command"] for c in sorted(levels)],
                  "sixteen_clients_command": sixteen_report["command"],
                  "soak": soak, "soak_command": soak_report["command"], "bench_bs1": list(bs1.values()),
                  "bench_bs16": list(bs16.values()), "bars": bars}
        for name, bar in bars.items():
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in bar.items()}
            print(f"{name}: {shown}")
        png = args.out.with_suffix(".png")
        outputs = AtomicOutputs([png, args.out], force=True, option="-o", example="serve.json")
        loadgen.write_report(outputs, [levels[c][1] for c in sorted(levels)], result, args.out, png)
        return 0
    except FdppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
