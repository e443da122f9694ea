"""Load generator for `serve`: a fixed, seeded mix of prompt and output lengths at several concurrencies.

    python scripts/loadgen.py --url http://127.0.0.1:8000 --concurrency 1 8 32 64 --requests 200 -o loadgen/
    python scripts/loadgen.py --concurrency 16 --duration 60 -o loadgen/

Per concurrency C, C clients send streamed greedy completions back to back (prompts as token ids, so engines
with and without a tokenizer take the same mix) until --requests are done or --duration seconds have passed.
Measured per request: time to first token (request sent -> first text chunk), inter-token latency (time between
text chunks; one chunk is one token except where a chunk was held back for a stop string or a partial
character), and the completion tokens from the usage of the last chunk. Reported per C: output tokens/s (all
completion tokens over the wall time), p50 / p99 of both latencies, answered, refused (HTTP 4xx/503) and failed
(anything else). Writes loadgen.json and loadgen.png (throughput and latency against concurrency) in -o. Loopback
servers only: this measures the server, not a network.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import random
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fdpp_rewrite.atomic import AtomicOutputs  # noqa: E402
from fdpp_rewrite.errors import FdppError  # noqa: E402

PROMPT_LENGTHS = (16, 64, 256, 1024)
OUTPUT_LENGTHS = (16, 64, 128, 256)
TOKEN_IDS = range(10, 250)  # inside every engine's vocabulary
MAX_CONCURRENCY = 64


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server (loopback only)")
    parser.add_argument("--model", help="the model id (default: the server's one model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64], help="1 to 64 each")
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument("--requests", type=int, help="requests per concurrency (default 100)")
    amount.add_argument("--duration", type=float, help="seconds per concurrency instead of a count")
    parser.add_argument("--seed", type=int, default=0, help="seed of the request mix")
    parser.add_argument("--max-output", type=int, help="cap on the mix's output lengths (default: none)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    parser.add_argument("-o", "--out", type=Path, default=Path("loadgen"), help="folder for the JSON and PNG")
    parser.add_argument("--force", action="store_true", help="overwrite loadgen.json / loadgen.png there")
    args = parser.parse_args(argv)
    if args.requests is None and args.duration is None:
        args.requests = 100
    if any(not 1 <= c <= MAX_CONCURRENCY for c in args.concurrency):
        raise FdppError(f"--concurrency takes values from 1 to {MAX_CONCURRENCY}, got {args.concurrency}")
    if (args.requests is not None and args.requests < 1) or (args.duration is not None and args.duration <= 0):
        raise FdppError("--requests must be at least 1 and --duration positive")
    check_loopback(args.url)
    return args


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname
    if not host:
        raise FdppError(f"--url {url!r} has no host; pass e.g. http://127.0.0.1:8000")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        raise FdppError(f"cannot resolve {host!r}; pass a loopback --url such as http://127.0.0.1:8000") from None
    if not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise FdppError(f"{host} is not a loopback address; loadgen measures a server on this machine only")


def request_mix(seed: int, count: int, max_len: int, max_output: int | None) -> list[tuple[list, int]]:
    """(prompt ids, max_tokens) pairs, the same for a seed; lengths capped to fit the model's max sequence."""
    rng = random.Random(seed)
    mix = []
    for _ in range(count):
        prompt_len = min(rng.choice(PROMPT_LENGTHS), max_len // 2)
        output = min(rng.choice(OUTPUT_LENGTHS), max_len - prompt_len, max_output or max_len)
        mix.append(([rng.choice(TOKEN_IDS) for _ in range(prompt_len)], output))
    return mix


async def one_request(client, url: str, model: str, prompt: list, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    sent = time.perf_counter()
    stamps, tokens = [], 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                refused = response.status_code < 500 or response.status_code == 503
                return {"outcome": "refused" if refused else "failed"}
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return {"outcome": "failed"}
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    stamps.append(time.perf_counter())
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    except Exception:  # noqa: BLE001 - a broken connection is a failed request, counted, not a crash
        return {"outcome": "failed"}
    return {"outcome": "answered", "tokens": tokens, "ttft": stamps[0] - sent if stamps else None,
            "itl": [b - a for a, b in zip(stamps, stamps[1:])]}


async def run_level(url: str, model: str, mix: list, concurrency: int, requests: int | None,
                    duration: float | None, timeout: float) -> dict:
    import httpx

    results, next_index = [], 0
    started = time.perf_counter()
    deadline = started + duration if duration else None

    async def worker(client):
        nonlocal next_index
        while True:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            if deadline is None and next_index >= requests:
                return
            prompt, max_tokens = mix[next_index % len(mix)]
            next_index += 1
            results.append(await one_request(client, url, model, prompt, max_tokens))

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return summarize(concurrency, results, wall)


def percentile(values: list, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]  # nearest rank


def summarize(concurrency: int, results: list, wall: float) -> dict:
    answered = [r for r in results if r["outcome"] == "answered"]
    ttft = [r["ttft"] for r in answered if r["ttft"] is not None]
    itl = [gap for r in answered for gap in r["itl"]]
    tokens = sum(r["tokens"] for r in answered)

    def ms(value):
        return None if value is None else value * 1e3
    return {"concurrency": concurrency, "requests": len(results), "answered": len(answered),
            "refused": sum(r["outcome"] == "refused" for r in results),
            "failed": sum(r["outcome"] == "failed" for r in results), "completion_tokens": tokens,
            "wall_s": wall, "tokens_per_s": tokens / wall if wall else 0.0,
            "ttft_p50_ms": ms(percentile(ttft, 50)), "ttft_p99_ms": ms(percentile(ttft, 99)),
            "itl_p50_ms": ms(percentile(itl, 50)), "itl_p99_ms": ms(percentile(itl, 99))}


def server_model(url: str, model: str | None) -> tuple[str, int]:
    import httpx

    try:
        listed = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    except (httpx.HTTPError, KeyError, ValueError):
        raise FdppError(f"no fdpp server answers at {url}; start one with `python -m fdpp_rewrite serve ENGINE`") \
            from None
    entry = next((m for m in listed if model in (None, m["id"])), None)
    if entry is None:
        raise FdppError(f"the server has no model {model!r} (it has {[m['id'] for m in listed]})")
    return entry["id"], int(entry.get("max_model_len") or 2048)


def plot(points: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [p["concurrency"] for p in points]
    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(11, 4))
    throughput.plot(levels, [p["tokens_per_s"] for p in points], marker="o")
    throughput.set(xlabel="concurrency", ylabel="output tokens/s", title="throughput", xscale="log")
    for key, label in (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"), ("itl_p50_ms", "ITL p50"),
                       ("itl_p99_ms", "ITL p99")):
        latency.plot(levels, [p[key] if p[key] is not None else float("nan") for p in points], marker="o",
                     label=label)
    latency.set(xlabel="concurrency", ylabel="ms", title="latency", xscale="log", yscale="log")
    latency.legend()
    for axes in (throughput, latency):
        axes.set_xticks(levels, [str(c) for c in levels])
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")  # the temporary name has no .png suffix
    plt.close(figure)


def print_table(points: list) -> None:
    def cell(value):
        return f"{value:>9.1f}" if value is not None else f"{'-':>9}"
    print(f"{'conc':>4} {'tok/s':>9} {'ttft p50':>9} {'ttft p99':>9} {'itl p50':>9} {'itl p99':>9} "
          f"{'answered':>8} {'refused':>7} {'failed':>6}")
    for p in points:
        print(f"{p['concurrency']:>4} {p['tokens_per_s']:>9.1f} {cell(p['ttft_p50_ms'])} {cell(p['ttft_p99_ms'])} "
              f"{cell(p['itl_p50_ms'])} {cell(p['itl_p99_ms'])} {p['answered']:>8} {p['refused']:>7} "
              f"{p['failed']:>6}")


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        url = args.url.rstrip("/")
        json_path, png_path = args.out / "loadgen.json", args.out / "loadgen.png"
        outputs = AtomicOutputs([png_path, json_path], force=args.force, option="-o", example="loadgen/")
        outputs.check()
        model, max_len = server_model(url, args.model)
        mix = request_mix(args.seed, args.requests or 1000, max_len, args.max_output)
        points = [asyncio.run(run_level(url, model, mix, c, args.requests, args.duration, args.timeout))
                  for c in args.concurrency]
        print_table(points)
        report = {"url": url, "model": model, "seed": args.seed, "requests": args.requests,
                  "duration_s": args.duration, "prompt_lengths": PROMPT_LENGTHS, "output_lengths": OUTPUT_LENGTHS,
                  "max_output": args.max_output, "points": points}
        with outputs:
            plot(points, outputs.temp(png_path))
            outputs.temp(json_path).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {json_path} and {png_path}")
        return 0
    except FdppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
