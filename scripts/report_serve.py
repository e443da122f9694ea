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

The paged server's bars (issue 39), from loadgen runs of several client counts each:

    python scripts/report_serve.py scale --today today --decode-heavy decode_heavy --prefix-on prefix_on \
        --prefix-off prefix_off --bench bench_paged.json -o docs/benchmarks/serve-paged-llama2-7b-h200.json

--today (--mix today at 16, 64, 256 clients): 16 clients >= TODAY_16_FLOOR tokens/s, 64 >= 1.6x and 256 >= 2x
the 16-client figure, time to first token p50/p99 at each. --decode-heavy (16 and 256 clients): 256 >= 2.5x 16;
with --bench (bench of the same engine at batch 256) also 256 clients >= 75% of bench at the context nearest the
mix's mean (its mean prompt + half its output) and p99 inter-token latency <= 2.5x that bench step.
--prefix-on / --prefix-off (--mix shared-prefix at 64 clients, serve with and without --no-prefix-cache): p50 time
to first token >= 4x lower with the cache, tokens/s not lower, identical outputs (equal outputs_sha256). Each bar is
computed from what is given. Writes the JSON and a PNG of tokens/s and time to first token against clients, a line
per run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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
    mix = loadgen.request_mix(report["seed"], report["requests"], max_len, report["max_output"],
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


TODAY_16_FLOOR = 2409.0  # tokens/s of 16 clients on today's mix before the paged cache (docs/benchmarks.md)
SCALE_RUNS = ("today", "decode_heavy", "prefix_on", "prefix_off")


def by_clients(folder: Path) -> tuple[dict, dict]:
    """A loadgen run's report and its points by client count."""
    report = read_json(folder / "loadgen.json")
    return report, {p["concurrency"]: p for p in report["points"]}


def level(points: dict, clients: int, run: str) -> dict:
    if clients not in points:
        raise FdppError(f"the {run} run has no {clients}-client level (it has {sorted(points)}); run loadgen with "
                        f"--clients {clients}")
    return points[clients]


def ratio_bar(value: float, base: float, at_least: float) -> dict:
    return {"value": value, "base": base, "ratio": value / base if base else None, "bar": f">= {at_least}",
            "met": bool(base) and value >= at_least * base}


def scale_bars(runs: dict, bench_path: Path | None) -> dict:
    """The paged server's bars from the runs given (module docstring)."""
    bars = {}
    if "today" in runs:
        points = runs["today"][1]
        sixteen = level(points, 16, "today")
        bars["today_16_clients_tokens_per_s"] = ratio_bar(sixteen["tokens_per_s"], TODAY_16_FLOOR, 1.0)
        for clients, factor in ((64, 1.6), (256, 2.0)):
            bars[f"today_{clients}_vs_16_clients"] = ratio_bar(level(points, clients, "today")["tokens_per_s"],
                                                               sixteen["tokens_per_s"], factor)
        bars["today_ttft_ms"] = {str(c): {"p50": points[c]["ttft_p50_ms"], "p99": points[c]["ttft_p99_ms"]}
                                 for c in (16, 64, 256) if c in points}
    if "decode_heavy" in runs:
        report, points = runs["decode_heavy"]
        top = level(points, 256, "decode_heavy")
        bars["decode_heavy_256_vs_16_clients"] = ratio_bar(top["tokens_per_s"],
                                                           level(points, 16, "decode_heavy")["tokens_per_s"], 2.5)
        if bench_path is not None:
            bench = bench_by_context(bench_path, 256)
            mean = (sum(report["prompt_lengths"]) / len(report["prompt_lengths"])
                    + sum(report["output_lengths"]) / len(report["output_lengths"]) / 2)
            context = min(bench, key=lambda c: abs(c - mean))
            bars["decode_heavy_256_vs_bench"] = {**ratio_bar(top["tokens_per_s"], bench[context]["tokens_per_s"],
                                                             0.75), "bench_context": context}
            step = bench[context]["ms_per_step"]
            bars["decode_heavy_256_itl_p99_ms"] = {"value": top["itl_p99_ms"], "bench_step_ms": step,
                                                   "ratio": top["itl_p99_ms"] / step, "bar": "<= 2.5",
                                                   "met": top["itl_p99_ms"] <= 2.5 * step}
    if "prefix_on" in runs and "prefix_off" in runs:
        on, off = level(runs["prefix_on"][1], 64, "prefix_on"), level(runs["prefix_off"][1], 64, "prefix_off")
        bars["prefix_cache_ttft_p50"] = ratio_bar(off["ttft_p50_ms"], on["ttft_p50_ms"], 4.0)
        bars["prefix_cache_tokens_per_s"] = ratio_bar(on["tokens_per_s"], off["tokens_per_s"], 1.0)
        same = on["outputs_sha256"] == off["outputs_sha256"] and on["answered"] == on["requests"] == off["answered"]
        bars["prefix_cache_identical_outputs"] = {"met": same, "answered": [on["answered"], off["answered"]]}
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


def scale_main(argv) -> int:
    parser = argparse.ArgumentParser(prog="report_serve.py scale", description="the paged server's bars")
    for run in SCALE_RUNS:
        parser.add_argument(f"--{run.replace('_', '-')}", type=Path, help="a loadgen -o folder")
    parser.add_argument("--bench", type=Path, help="bench JSON of the same engine with batch 256 points")
    parser.add_argument("--command", default="", help="how the run was made (recorded)")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        runs = {run: by_clients(getattr(args, run)) for run in SCALE_RUNS if getattr(args, run) is not None}
        if not runs:
            raise FdppError("pass at least one of --today, --decode-heavy, --prefix-on, --prefix-off")
        bars = scale_bars(runs, args.bench)
        for name, bar in bars.items():
            print(f"{name}: {bar}")
        result = {"command": args.command, "bars": bars,
                  "runs": {name: {"command": report["command"], "points": report["points"]}
                           for name, (report, _) in runs.items()}}
        png = args.out.with_suffix(".png")
        with AtomicOutputs([png, args.out], force=True, option="-o", example="serve-paged.json") as outputs:
            plot_scale(runs, outputs.temp(png))
            outputs.temp(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out} and {png}")
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
