"""Load generator for `serve`: a fixed, seeded mix of prompt and output lengths at several client counts.

    python scripts/loadgen.py --url http://127.0.0.1:8000 --clients 1 16 64 256 --requests 512 -o loadgen/
    python scripts/loadgen.py --clients 16 64 256 --mix today --requests 512 -o today/
    python scripts/loadgen.py --clients 16 256 --mix decode-heavy --requests 512 -o decode_heavy/
    python scripts/loadgen.py --clients 64 --mix shared-prefix --requests 256 -o shared_prefix/
    python scripts/loadgen.py --clients 16 --duration 60 -o loadgen/
    python scripts/loadgen.py --clients 64 --requests 2000 --cancel-fraction 0.2 --stop-fraction 0.3 -o soak/
    python scripts/loadgen.py --clients 16 64 256 --requests 480 640 1024 --mix today -o today/
    python scripts/loadgen.py --clients 48 --requests 48 --mix 8k-sequences --sample-interval 0.5 -o capacity/

Mixes (--mix): `lengths` (the default) draws each prompt's length from --prompt-lengths and its max_tokens from
--output-lengths; the named mixes fix both (MIXES): `today` (prompts 128/256/512/1024, 128 out: the mix of the
16-client serving bars), `decode-heavy` (prompts 128/256/512, 512 out), `shared-prefix` (every prompt is one seeded
1,024-token system prompt + 128 tokens of its own, 128 out: what a prefix cache saves), `long-prompts` (prompts
1K-4K, 128 out: the llama3-8b serving point), `soak` (prompts 128-8K, 16-256 out) and `8k-sequences` (prompts of
8,128 tokens, 64 out: every request ends at 8,192 tokens, 128 KV blocks; the capacity check). A mix caps a prompt
at half the server's max sequence: 8K prompts need a server of 16K+. The shared prefix is never capped: where the
prefix + its own prompt + the output exceed the server's max sequence (1,280 > 512), loadgen refuses.

Per client count C (--clients, or its old name --concurrency), C clients send streamed greedy completions back to
back (prompts as token ids, so engines
with and without a tokenizer take the same mix) until --requests are done (one count for every level, or one per
level) or --duration seconds have passed.
Measured per request: time to first token (request sent -> first text chunk), inter-token latency (time between
text chunks; one chunk is one token except where a chunk was held back for a stop string or a partial character),
and the completion tokens from the usage of the last chunk. Reported per C: output tokens/s (all completion tokens
over the wall time), p50 / p99 of both latencies, answered, refused (HTTP 4xx/503) and failed (anything else), and
a digest of the answered texts by mix index (outputs_sha256: equal digests, identical outputs). A
soak (--cancel-fraction, --stop-fraction) also has requests that close their stream after a random number of
tokens (cancelled, their own count) and requests with a random stop string; after each level the server's /metrics
are read once it is idle, and the KV slots (and, paged, KV blocks) still held are reported (0 unless one leaked),
with a paged server's preemptions and prefix-cache hit rate. --sample-interval S also reads /metrics every S
seconds while a level runs and reports each gauge's peak (busy_metrics: e.g. the most sequences the server held
at once). A server started with
an API key takes it from $FDPP_API_KEY. Writes loadgen.json and loadgen.png (throughput and latency against
concurrency) in -o, after every level (a run cut short keeps the levels it finished). Loopback servers only: this
measures the server, not a network.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import ipaddress
import json
import os
import random
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fdpp_rewrite.atomic import AtomicOutputs  # noqa: E402
from fdpp_rewrite.errors import FdppError  # noqa: E402
from fdpp_rewrite.serve import metrics  # noqa: E402
from fdpp_rewrite.serve.guard import API_KEY_ENV  # noqa: E402

PROMPT_LENGTHS = (16, 64, 256, 1024)
OUTPUT_LENGTHS = (16, 64, 128, 256)
STOP_STRINGS = ("42", "7,1", "the", "00", ".")  # short enough to turn up in ids (comma-separated) and in text
IDLE_WAIT_S = 30.0  # how long to wait for the server to drain after a level before reading its KV slots
TOKEN_IDS = range(10, 250)  # inside every engine's vocabulary
MAX_CONCURRENCY = 256
SHARED_PREFIX = 1024  # the shared-prefix mix's system prompt: 16 whole 64-token KV blocks
# name -> (prompt lengths, output lengths, shared prefix tokens)
MIXES = {"today": ((128, 256, 512, 1024), (128,), 0), "decode-heavy": ((128, 256, 512), (512,), 0),
         "shared-prefix": ((128,), (128,), SHARED_PREFIX), "long-prompts": ((1024, 2048, 3072, 4096), (128,), 0),
         "soak": ((128, 256, 512, 1024, 2048, 4096, 8192), (16, 64, 128, 256), 0),
         "8k-sequences": ((8192 - 64,), (64,), 0)}
# the server's gauges read once it is idle (those of a paged server are absent on one with KV slots)
IDLE_GAUGES = ("kv_slots_in_use", "kv_slots_total", "kv_blocks_used", "kv_blocks_total", "preemptions_total",
               "prefix_cache_hit_rate")
BUSY_GAUGES = ("running_sequences", "prefilling_sequences", "queue_depth")
# the gauges --sample-interval follows while a level runs (their peaks are reported)
SAMPLED_GAUGES = ("kv_slots_in_use", "kv_blocks_used") + BUSY_GAUGES


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server (loopback only)")
    parser.add_argument("--model", help="the model id (default: the server's one model)")
    parser.add_argument("--clients", "--concurrency", dest="concurrency", type=int, nargs="+", default=[1, 8, 32, 64],
                        help=f"client counts, one level each (1 to {MAX_CONCURRENCY} each)")
    parser.add_argument("--mix", choices=["lengths", *MIXES], default="lengths",
                        help="the request mix: lengths (from --prompt-lengths / --output-lengths) or a named one")
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument("--requests", type=int, nargs="+",
                        help="requests per client count: one for every level or one per --clients value (default 100)")
    amount.add_argument("--duration", type=float, help="seconds per concurrency instead of a count")
    parser.add_argument("--seed", type=int, default=0, help="seed of the request mix")
    parser.add_argument("--max-output", type=int, help="cap on the mix's output lengths (default: none)")
    parser.add_argument("--prompt-lengths", type=int, nargs="+",
                        help=f"prompt lengths the lengths mix draws from (default: {list(PROMPT_LENGTHS)})")
    parser.add_argument("--output-lengths", type=int, nargs="+",
                        help=f"max_tokens values the lengths mix draws from (default: {list(OUTPUT_LENGTHS)})")
    parser.add_argument("--cancel-fraction", type=float, default=0.0,
                        help="share of requests that disconnect after a random number of tokens (soak)")
    parser.add_argument("--stop-fraction", type=float, default=0.0,
                        help="share of requests that carry a random stop string (soak)")
    parser.add_argument("--sample-interval", type=float,
                        help="read /metrics every this many seconds while a level runs; report each gauge's peak")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    parser.add_argument("-o", "--out", type=Path, default=Path("loadgen"), help="folder for the JSON and PNG")
    parser.add_argument("--force", action="store_true", help="overwrite loadgen.json / loadgen.png there")
    args = parser.parse_args(argv)
    if args.requests is None and args.duration is None:
        args.requests = [100]
    if args.requests is not None and len(args.requests) not in (1, len(args.concurrency)):
        raise FdppError(f"--requests takes one count or one per --clients value ({len(args.concurrency)}), got "
                        f"{args.requests}")
    if any(not 1 <= c <= MAX_CONCURRENCY for c in args.concurrency):
        raise FdppError(f"--clients takes values from 1 to {MAX_CONCURRENCY}, got {args.concurrency}")
    if args.mix != "lengths":
        if args.prompt_lengths or args.output_lengths:
            raise FdppError(f"--mix {args.mix} fixes the lengths; drop --prompt-lengths / --output-lengths or use "
                            "--mix lengths")
        args.prompt_lengths, args.output_lengths, args.shared_prefix = map(list_or_int, MIXES[args.mix])
    else:
        args.prompt_lengths = args.prompt_lengths or list(PROMPT_LENGTHS)
        args.output_lengths = args.output_lengths or list(OUTPUT_LENGTHS)
        args.shared_prefix = 0
    if (args.requests is not None and min(args.requests) < 1) or (args.duration is not None and args.duration <= 0):
        raise FdppError("--requests must be at least 1 and --duration positive")
    if args.sample_interval is not None and args.sample_interval <= 0:
        raise FdppError(f"--sample-interval takes a positive number of seconds, got {args.sample_interval}")
    if min(args.prompt_lengths) < 1 or min(args.output_lengths) < 1:
        raise FdppError("--prompt-lengths and --output-lengths take positive token counts")
    if not (0 <= args.cancel_fraction <= 1 and 0 <= args.stop_fraction <= 1):
        raise FdppError("--cancel-fraction and --stop-fraction take shares from 0 to 1")
    check_loopback(args.url)
    return args


def list_or_int(value):
    return list(value) if isinstance(value, tuple) else value


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


def check_prefix_fits(shared_prefix: int, max_len: int, max_output: int | None, prompt_lengths,
                      output_lengths) -> None:
    """A shared prefix + the longest own prompt + the longest output must fit the server's max sequence."""
    if not shared_prefix:
        return
    output = min(max(output_lengths), max_output or max(output_lengths))
    needed = shared_prefix + max(prompt_lengths) + output
    if needed > max_len:
        raise FdppError(f"the {shared_prefix}-token shared prefix + {max(prompt_lengths)}-token prompts + {output} "
                        f"tokens out need {needed} tokens a sequence, the server's max is {max_len}: serve an engine "
                        f"built with --max-seq {needed} or more (loadgen never shrinks the prefix)")


def request_mix(seed: int, count: int, max_len: int, max_output: int | None, prompt_lengths=PROMPT_LENGTHS,
                output_lengths=OUTPUT_LENGTHS, cancel_fraction: float = 0.0, stop_fraction: float = 0.0,
                shared_prefix: int = 0) -> list:
    """Requests as dicts (prompt ids, max_tokens, cancel_after: a token count or None, stop: a list), the same
    for a seed; lengths capped to fit the model's max sequence (a prompt at half of it). shared_prefix: every
    prompt starts with the same that many ids (drawn first), then its own prompt_lengths ids, uncapped: a prefix
    that does not fit with the longest own prompt and output is refused, never shrunk (the report says the prefix
    it asked for)."""
    check_prefix_fits(shared_prefix, max_len, max_output, prompt_lengths, output_lengths)
    rng = random.Random(seed)
    system = [rng.choice(TOKEN_IDS) for _ in range(shared_prefix)]
    mix = []
    for _ in range(count):
        own = rng.choice(prompt_lengths)
        prompt_len = len(system) + own if system else min(own, max_len // 2)
        output = min(rng.choice(output_lengths), max_len - prompt_len, max_output or max_len)
        prompt = system + [rng.choice(TOKEN_IDS) for _ in range(prompt_len - len(system))]
        cancel_after = rng.randint(1, max(1, output - 1)) if rng.random() < cancel_fraction else None
        stop = [rng.choice(STOP_STRINGS)] if rng.random() < stop_fraction else []
        mix.append({"prompt": prompt, "max_tokens": output, "cancel_after": cancel_after, "stop": stop})
    return mix


async def one_request(client, url: str, model: str, request: dict) -> dict:
    body = {"model": model, "prompt": request["prompt"], "max_tokens": request["max_tokens"], "temperature": 0,
            "stream": True}
    if request["stop"]:
        body["stop"] = request["stop"]
    sent = time.perf_counter()
    stamps, tokens, text = [], 0, []
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                body = await response.aread()
                refused = response.status_code < 500 or response.status_code == 503
                return {"outcome": "refused" if refused else "failed",
                        "reason": f"HTTP {response.status_code}: {error_message(body)}"}
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return {"outcome": "failed", "reason": f"stream error: {chunk['error'].get('message', '?')}"}
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    stamps.append(time.perf_counter())
                    text.append(chunk["choices"][0]["text"])
                    if request["cancel_after"] is not None and len(stamps) >= request["cancel_after"]:
                        return {"outcome": "cancelled"}  # leaving the block closes the connection
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    except Exception as exc:  # noqa: BLE001 - a broken connection is a failed request, counted, not a crash
        return {"outcome": "failed", "reason": f"{type(exc).__name__}: {exc}"[:200]}
    return {"outcome": "answered", "tokens": tokens, "text": "".join(text),
            "ttft": stamps[0] - sent if stamps else None,
            "itl": [b - a for a, b in zip(stamps, stamps[1:])]}


async def run_level(url: str, model: str, mix: list, concurrency: int, requests: int | None,
                    duration: float | None, timeout: float, sample_interval: float | None = None) -> dict:
    import httpx

    results, next_index = [], 0
    done = asyncio.Event()
    sampler = asyncio.create_task(sample_gauges(url, sample_interval, done)) if sample_interval else None
    started = time.perf_counter()
    deadline = started + duration if duration else None

    async def worker(client):
        nonlocal next_index
        while True:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            if deadline is None and next_index >= requests:
                return
            index, next_index = next_index, next_index + 1
            results.append({"index": index, **await one_request(client, url, model, mix[index % len(mix)])})

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=auth_headers()) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    wall = time.perf_counter() - started
    point = summarize(concurrency, results, wall)
    if sampler is not None:
        done.set()
        point["busy_metrics"] = {"interval_s": sample_interval, **await sampler}
    point["idle_metrics"] = await idle_metrics(url)
    return point


async def sample_gauges(url: str, interval: float, done: asyncio.Event) -> dict:
    """Reads /metrics every `interval` seconds until `done`: {"samples": count, "peak": {gauge: highest value}}."""
    import httpx

    peak, count = {}, 0
    async with httpx.AsyncClient(timeout=10) as client:
        while not done.is_set():
            try:
                samples = metrics.parse((await client.get(f"{url}/metrics")).text)
            except httpx.HTTPError:  # a read the busy server did not answer in time: the next one counts
                samples = {}
            count += bool(samples)
            for key in SAMPLED_GAUGES:
                if f"fdpp_{key}" in samples:
                    peak[key] = max(peak.get(key, 0.0), samples[f"fdpp_{key}"])
            try:
                await asyncio.wait_for(done.wait(), interval)
            except asyncio.TimeoutError:
                pass
    return {"samples": count, "peak": peak}


async def idle_metrics(url: str) -> dict:
    """The server's gauges once nothing runs, prefills or waits (drained False if that does not happen within
    IDLE_WAIT_S): the KV slots and KV blocks in use must then be 0."""
    import httpx

    deadline = time.perf_counter() + IDLE_WAIT_S
    async with httpx.AsyncClient(timeout=10) as client:
        while True:
            samples = metrics.parse((await client.get(f"{url}/metrics")).text)
            busy = sum(samples.get(f"fdpp_{key}", 0) for key in BUSY_GAUGES)
            if not busy or time.perf_counter() >= deadline:
                return {"drained": not busy, **{key: samples.get(f"fdpp_{key}") for key in IDLE_GAUGES + BUSY_GAUGES}}
            await asyncio.sleep(0.2)


def percentile(values: list, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]  # nearest rank


def error_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, else the body's start."""
    try:
        return str(json.loads(body)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def summarize(concurrency: int, results: list, wall: float) -> dict:
    answered = [r for r in results if r["outcome"] == "answered"]
    ttft = [r["ttft"] for r in answered if r["ttft"] is not None]
    itl = [gap for r in answered for gap in r["itl"]]
    tokens = sum(r["tokens"] for r in answered)

    def ms(value):
        return None if value is None else value * 1e3
    return {"concurrency": concurrency, "requests": len(results), "answered": len(answered),
            "cancelled": sum(r["outcome"] == "cancelled" for r in results),
            "refused": sum(r["outcome"] == "refused" for r in results),
            "failed": sum(r["outcome"] == "failed" for r in results), "completion_tokens": tokens,
            "wall_s": wall, "tokens_per_s": tokens / wall if wall else 0.0,
            "ttft_p50_ms": ms(percentile(ttft, 50)), "ttft_p99_ms": ms(percentile(ttft, 99)),
            "itl_p50_ms": ms(percentile(itl, 50)), "itl_p99_ms": ms(percentile(itl, 99)),
            "outputs_sha256": outputs_digest(answered),
            "output_digests": {str(r["index"]): text_digest(r["text"]) for r in answered},
            "failure_reasons": dict(Counter(r["reason"] for r in results if r.get("reason")).most_common())}


def text_digest(text: str) -> str:
    """A request's output, short: two runs' outputs are compared request by request (prefix caching on and off)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def outputs_digest(answered: list) -> str:
    """One digest of the answered requests' texts by their index in the mix: two runs of the same --requests, all
    answered, got identical greedy outputs when their digests are equal (prefix caching on against off)."""
    texts = sorted((r["index"], r["text"]) for r in answered)
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()


def auth_headers() -> dict:
    """The API key of a server started with one (serve --api-key, or $FDPP_API_KEY)."""
    key = os.environ.get(API_KEY_ENV)
    return {"authorization": f"Bearer {key}"} if key else {}


def server_model(url: str, model: str | None) -> tuple[str, int]:
    import httpx

    try:
        listed = httpx.get(f"{url}/v1/models", timeout=10, headers=auth_headers()).json()["data"]
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


def write_report(outputs: AtomicOutputs, points: list, report: dict, json_path: Path, png_path: Path) -> None:
    """The JSON and the throughput/latency plot of these points, both or neither (atomically)."""
    with outputs:
        plot(points, outputs.temp(png_path))
        outputs.temp(json_path).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {json_path} and {png_path}")


def print_table(points: list) -> None:
    def cell(value):
        return f"{value:>9.1f}" if value is not None else f"{'-':>9}"
    print(f"{'clients':>7} {'tok/s':>9} {'ttft p50':>9} {'ttft p99':>9} {'itl p50':>9} {'itl p99':>9} "
          f"{'answered':>8} {'cancelled':>9} {'refused':>7} {'failed':>6} {'idle KV slots/blocks':>20} "
          f"{'preempted':>9} {'prefix hits':>11}")
    for p in points:
        idle = p["idle_metrics"]
        held = f"{idle['kv_slots_in_use']:.0f}"
        if idle.get("kv_blocks_used") is not None:
            held += f"/{idle['kv_blocks_used']:.0f}"
        held += "" if idle["drained"] else " (busy)"
        preempted, hits = idle.get("preemptions_total"), idle.get("prefix_cache_hit_rate")
        print(f"{p['concurrency']:>7} {p['tokens_per_s']:>9.1f} {cell(p['ttft_p50_ms'])} {cell(p['ttft_p99_ms'])} "
              f"{cell(p['itl_p50_ms'])} {cell(p['itl_p99_ms'])} {p['answered']:>8} {p['cancelled']:>9} "
              f"{p['refused']:>7} {p['failed']:>6} {held:>20} {'-' if preempted is None else f'{preempted:.0f}':>9} "
              f"{'-' if hits is None else f'{hits:.1%}':>11}")
        for reason, count in p.get("failure_reasons", {}).items():  # why requests were refused or failed
            print(f"{'':>7} {count} x {reason}")
        if "busy_metrics" in p:
            busy = p["busy_metrics"]
            print(f"{'':>7} peaks over {busy['samples']} reads of /metrics: "
                  + ", ".join(f"{key} {value:.0f}" for key, value in busy["peak"].items()))


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        url = args.url.rstrip("/")
        json_path, png_path = args.out / "loadgen.json", args.out / "loadgen.png"
        outputs = AtomicOutputs([png_path, json_path], force=args.force, option="-o", example="loadgen/")
        outputs.check()
        model, max_len = server_model(url, args.model)
        counts = (args.requests * len(args.concurrency) if len(args.requests) == 1 else args.requests) \
            if args.requests else [None] * len(args.concurrency)
        # one mix for every level: its first n requests are those of a mix of n (request_mix draws in order)
        mix = request_mix(args.seed, max(counts) if args.requests else 1000, max_len, args.max_output,
                          args.prompt_lengths, args.output_lengths, args.cancel_fraction, args.stop_fraction,
                          args.shared_prefix)
        report = {"url": url, "model": model, "seed": args.seed,
                  "requests": args.requests[0] if args.requests and len(args.requests) == 1 else args.requests,
                  "duration_s": args.duration, "mix": args.mix,
                  "shared_prefix": args.shared_prefix,  # as asked: request_mix refuses a prefix it cannot fit
                  "max_len": max_len,
                  "prompt_lengths": args.prompt_lengths,
                  "output_lengths": args.output_lengths, "max_output": args.max_output,
                  "cancel_fraction": args.cancel_fraction, "stop_fraction": args.stop_fraction,
                  "command": "python scripts/loadgen.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  "points": []}
        for concurrency, count in zip(args.concurrency, counts):
            report["points"].append(asyncio.run(run_level(url, model, mix, concurrency, count, args.duration,
                                                          args.timeout, args.sample_interval)))
            # after every level, so a run cut short keeps what it measured (the first write checked --force)
            outputs = AtomicOutputs([png_path, json_path], force=True)
            write_report(outputs, report["points"], report, json_path, png_path)
        print_table(report["points"])
        return 0
    except FdppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
