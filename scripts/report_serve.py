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
                              report["prompt_lengths"], report["output_lengths"])
    seconds = tokens = 0.0
    for request in mix:
        point = bench.get(len(request["prompt"]))
        if point is None:
            raise FdppError(f"bench has no bs1 point at context {len(request['prompt'])}; bench every prompt length")
        seconds += (point["first_token_ms"] + (request["max_tokens"] - 1) * point["ms_per_step"]) / 1e3
        tokens += request["max_tokens"]
    return tokens / seconds


def main(argv=None) -> int:
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
