"""`bench ENGINE [--batch 1 8 --context 128 --new-tokens 128]`: decode speed of an engine, measured as a user
sees it (sampling and the token readback included in every step).

Per (batch, context): random prompt ids (seed 0), one warm-up generation (it traces and captures the buckets the
run visits), then the timed generation. `--kernels fdpp torch` runs each point with this project's kernels and
then with the stock-torch baseline (ablations.TorchKernels: cuBLAS GEMMs with unfused epilogues, SDPA attention;
the same graph, norms, RoPE and CUDA graphs) and prints the ratios. `--ablate` also runs the engine once per ablation
(ablations.ABLATIONS: one technique switched back to its baseline, everything else unchanged) and prints what
each technique buys: fdpp's tokens/s over the ablated engine's, per point.

`--kernels gptfast` also runs gpt-fast's torch.compile decode recipe (gptfast_peer.py) on the engine's model
shapes with random weights, timed the same way, after the engines (cuda, llama layouts).

A paged engine's torch peer runs on a contiguous build of the same model (--torch-engine FOLDER): SDPA on a paged
engine would read a gathered copy of every page each step, so bench refuses --kernels torch there without one,
and --ablate skips the ablations that would gather (GATHERING_ABLATIONS).

Reported: decode tokens/s (batch / mean step); ms per step (mean and median); first-token time (prefill of every
prompt + the first token; a paged engine prefills the batch as batched chunk rounds, engine.prefill_batch: 16
prompts of 128 tokens are one pass of 2,048); the memory roofline: weight bytes + KV bytes a step reads, over the
attainable read (StreamReads: the fastest of torch.sum over --stream-gib of fp16, over a quarter of it and a copy
of half of it, each before and after the points, as the GPU's clocks vary between reads) as `% read`, and over
the spec sheet's bandwidth (gpu/device.py) as `% spec`, which no point can exceed; kernel launches per decode step
counted with torch.profiler over one replay of the step's CUDA graph (and over one eager run of the same Program),
per transformer layer. Weight bytes: every weight a step reads whole (embedding tables read by Gather count one row
per token).
"""

from __future__ import annotations

import collections
import gc
import json
import os
import random
import statistics
from pathlib import Path

import torch

from fdpp_rewrite.engine.buckets import pick
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.gpu.device import spec_memory_bandwidth


MIN_READ_BYTES = 256 << 20  # a smaller read would partly hit the L2 cache (60 MB on an H200) between repeats


class StreamReads:
    """The streaming reads the roofline divides by, on one buffer of `gib` GiB of fp16 allocated before any engine
    loads (so a paged engine's KV pool is sized around it): torch.sum over all of it and over a quarter, and a copy
    of its first half over its second (read + written bytes); each read of at least MIN_READ_BYTES, timed with CUDA
    events, median of 10. measure() runs them all (before and after the points); best() is the fastest of every
    read: the attainable rate."""

    def __init__(self, gib: float):
        self.x = torch.randn(int(gib * (1 << 30)) // 2, dtype=torch.float16, device="cuda")
        self.out = torch.empty((), dtype=torch.float16, device="cuda")
        self.results = []  # {"read", "when", "bytes_per_s"}
        self.gib = gib

    def reads(self) -> list:
        """(name, fn, bytes it moves) of each read."""
        x, half, quarter = self.x, self.x.numel() // 2, self.x.numel() // 4
        size = x.element_size()
        reads = [("sum", lambda: torch.sum(x, dim=0, out=self.out), x.numel() * size),
                 ("sum of a quarter", lambda: torch.sum(x[:quarter], dim=0, out=self.out), quarter * size),
                 ("copy", lambda: x[half:2 * half].copy_(x[:half]), 2 * half * size)]
        return [read for read in reads if read[2] >= MIN_READ_BYTES]

    def measure(self, when: str) -> None:
        for name, fn, nbytes in self.reads():
            self.results.append({"read": name, "when": when, "bytes_per_s": nbytes / median_seconds(fn)})

    def best(self) -> float:
        return max(r["bytes_per_s"] for r in self.results)

    def close(self) -> None:
        self.x = self.out = None
        torch.cuda.empty_cache()


def median_seconds(fn, warmup: int = 3, repeats: int = 10) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def weight_bytes_per_step(engine, batch: int) -> int:
    """Bytes of weights one decode step reads: whole tensors, except Gather tables (one row per token). For a
    tensor-parallel engine these are rank 0's: every GPU streams its own shard at once, so one GPU's roofline is the
    step's."""
    gathered = {n["inputs"][0] for n in engine.plan["nodes"]
                if n["op"] == "Gather" and n["inputs"][0] in engine.weights}
    total = 0
    for name, tensor in engine.weights.items():
        if name in gathered:
            total += batch * tensor[0].numel() * tensor.element_size()
        else:
            total += tensor.numel() * tensor.element_size()
    return total


def kv_bytes_per_step(engine, batch: int, mean_len: float) -> float:
    element = torch.finfo(engine.dtype).bits // 8
    return 2 * engine.num_layers * batch * engine.plan["num_kv_heads"] * mean_len * engine.plan["head_dim"] * element


def count_kernels(engine, batch: int) -> dict:
    """Kernel launches of the current decode bucket: one graph replay and one eager run of its Program."""
    from torch.profiler import ProfilerActivity, profile

    def kernels(fn) -> list:
        """(name, microseconds) of each kernel fn launches."""
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return [(e.name, e.time_range.elapsed_us()) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]

    program, feeds, graph = decode_step(engine, batch)
    eager = kernels(lambda: program.run(feeds))
    counts = {"eager": len(eager)}
    launched = eager
    if graph is not None:
        launched = kernels(graph.replay)
        counts["graph"] = len(launched)
    counts["per_layer"] = round(counts.get("graph") or counts["eager"]) / engine.num_layers
    # which kernels a step launches, by name (shortened), and their summed time in that one run (profiler clock):
    # what to look at when per_layer exceeds its budget or a peer's step is faster
    short = [(name.replace("(anonymous namespace)::", "").split("(")[0][:90], us) for name, us in launched]
    counts["kernel_names"] = dict(collections.Counter(name for name, _ in short).most_common())
    times = collections.defaultdict(float)
    for name, us in short:
        times[name] += us
    counts["kernel_us"] = {name: round(us, 1) for name, us in sorted(times.items(), key=lambda item: -item[1])}
    counts["op_counts_per_step"] = dict(sorted(program.op_counts.items()))
    return counts


def decode_step(engine, batch: int) -> tuple:
    """(Program, its feeds, its CUDA graph or None) of the last decode bucket a run of `batch` used."""
    bucket_batch = pick(batch, engine.batch_buckets)
    if engine.paged:  # paged step keys: (B, P, C, kv bucket); a decode step has P = 0
        key = max((k for k in engine.paged_steps if k[:3] == (bucket_batch, 0, 0)), key=lambda k: k[3])
        buffers = engine.step_buffers[key]
        feeds = {"input_ids": buffers.ids, "past_len": buffers.past, **engine.kv.views()}
        runner, out = engine.paged_steps[key]
        return engine.programs[key], feeds, runner if out is not None else None
    kv_len = max(k[1] for k in engine.programs if k[0] == (bucket_batch, 1))  # the last bucket the run used
    feeds = engine.feeds(engine.step_ids[:bucket_batch], engine.past_len[:bucket_batch], slice(0, bucket_batch), kv_len)
    graph = engine.graphs.get((bucket_batch, kv_len))
    return engine.programs[(tuple(feeds["input_ids"].shape), kv_len)], feeds, None if graph is None else graph[0]


def decode_kv_buckets(engine, batch: int) -> list[int]:
    """The KV buckets the decode steps of `batch` rows ran as."""
    bucket_batch = pick(batch, engine.batch_buckets)
    if engine.paged:
        return sorted({k[3] for k in engine.paged_steps if k[:3] == (bucket_batch, 0, 0)})
    return sorted({k[1] for k in engine.graphs if k[0] == bucket_batch})


def bench_point(engine, batch: int, context: int, new_tokens: int, roofline: bool) -> dict:
    from fdpp_rewrite.engine.sampling import Sampler

    vocab = engine.vocab_size or 1000
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(context)] for _ in range(batch)]
    engine.generate(prompts, new_tokens, Sampler())  # warm-up: traces and captures every bucket it visits
    result = engine.generate(prompts, new_tokens, Sampler())
    steps = result.step_s  # new_tokens - 1 of them: bench_command checks new_tokens >= 2
    mean_s = statistics.fmean(steps)
    point = {"batch": batch, "context": context, "new_tokens": new_tokens, "decode_steps": len(steps),
             "tokens_per_s": batch / mean_s, "ms_per_step": mean_s * 1e3,
             "ms_per_step_median": statistics.median(steps) * 1e3,
             "ms_per_step_p90": sorted(steps)[int(0.9 * (len(steps) - 1))] * 1e3, "ms_per_step_max": max(steps) * 1e3,
             "first_token_ms": result.first_token_s * 1e3,
             "kv_buckets": decode_kv_buckets(engine, batch)}
    if roofline:
        mean_len = context + new_tokens / 2
        point.update(weight_bytes=weight_bytes_per_step(engine, batch),
                     kv_bytes_mean=kv_bytes_per_step(engine, batch, mean_len))
        if engine.leader is None or engine.manifest.get("tensor_parallel", 1) == 1:
            # the profiler replays a step on rank 0 alone: the other ranks would wait in its all-reduce
            point["launches"] = count_kernels(engine, batch)
    return point


def add_roofline(points: list, bandwidth: float, spec: float | None = None) -> None:
    """roofline_ms and roofline_pct of every point with its bytes: (weights + mean KV bytes) / bandwidth (the
    attainable read), and roofline_spec_pct against the spec sheet's bandwidth when it is known.
    Example: 13.2 GB + 0.1 GB at 4.2 TB/s -> 3.17 ms; at 3.80 ms a step, 83.4% (73.0% of 4.8 TB/s)."""
    for point in points:
        if "weight_bytes" in point:
            nbytes = point["weight_bytes"] + point["kv_bytes_mean"]
            point["roofline_ms"] = nbytes / bandwidth * 1e3
            point["roofline_pct"] = 100 * point["roofline_ms"] / point["ms_per_step"]
            if spec:
                point["roofline_spec_pct"] = 100 * nbytes / spec * 1e3 / point["ms_per_step"]


PEER_NAMES = {"torch": "torch baseline", "gptfast": "gpt-fast recipe"}  # the peers print_table compares against

# ablations that read a paged cache by gathering its pages into a contiguous copy in every call: no fair peer
GATHERING_ABLATIONS = ("sdpa-attention",)


def configurations(kernels: list, ablate: bool, paged: bool = False) -> list:
    """(label, Engine options) of each engine the bench runs, in order: fdpp, each ablation, torch. A paged engine
    skips the ablations that gather pages; its torch peer runs on --torch-engine (check_peer)."""
    from fdpp_rewrite.engine.ablations import ABLATIONS, TorchKernels

    runs = [("fdpp", {})] if "fdpp" in kernels or ablate else []
    if ablate:
        runs += [(f"-{name}", {"wrapper": wrapper}) for name, wrapper in ABLATIONS.items()
                 if not (paged and name in GATHERING_ABLATIONS)]
    if "torch" in kernels or (ablate and not paged):
        runs.append(("torch", {"wrapper": TorchKernels}))
    return runs


def is_paged(manifest: dict, kv_memory) -> bool:
    return bool(manifest.get("kv_cache")) or kv_memory is not None


def check_peer(args, paged: bool) -> None:
    """The torch peer's engine is contiguous: on a paged one SDPA would read a gathered copy of every page each
    step, a peer no one would write. A paged ENGINE's peer runs on --torch-engine, a contiguous build."""
    from fdpp_rewrite.engine.manifest import read_manifest

    if "torch" not in args.kernels:
        return
    if args.torch_engine is None and paged:
        raise FdppError("--kernels torch on a paged engine would gather every KV page for SDPA in each step; build "
                        "the same model without --kv-memory (contiguous, --max-batch and --max-seq covering the "
                        "grid) and pass it as --torch-engine, or drop torch")
    if args.torch_engine is not None and read_manifest(args.torch_engine).get("kv_cache"):
        raise FdppError(f"--torch-engine {args.torch_engine} is a paged build; build it without --kv-memory")


def gptfast_config(manifest: dict, cuda: bool):
    """The engine's model config for the gpt-fast peer, with the engine's layer count; refused in one line where the
    peer cannot run."""
    from dataclasses import replace

    from fdpp_rewrite.engine.gptfast_peer import checked_config
    from fdpp_rewrite.models.config import ModelConfig

    if not cuda:
        raise FdppError("--kernels gptfast runs gpt-fast's recipe on the GPU: it needs a cuda engine and a GPU")
    config = (manifest.get("model") or {}).get("config")
    if not config:
        raise FdppError("this engine's manifest has no model config (built from an ONNX file without fdpp "
                        "metadata): --kernels gptfast needs the model's shapes; run scripts/bench_gptfast.py "
                        "--preset NAME instead")
    config = replace(ModelConfig.from_dict(config), num_layers=manifest["num_layers"])
    return checked_config(config, f"the engine's model ({config.family})")


def gptfast_points(args, manifest: dict) -> list:
    from fdpp_rewrite.engine.gptfast_peer import run_points

    config = gptfast_config(manifest, True)
    return run_points(config, args.batch, args.context, args.new_tokens, progress=lambda line: print(line, flush=True))


def print_ablation(points: list, stream=None) -> None:
    """What each technique buys: fdpp tokens/s over the tokens/s with that technique switched off."""
    from fdpp_rewrite.engine.ablations import ABLATIONS

    ours = {(p["batch"], p["context"]): p for p in points if p["kernels"] == "fdpp"}
    ablated = [p for p in points if p["kernels"].startswith("-") and (p["batch"], p["context"]) in ours]
    if not ablated:
        return
    print("ablation (fdpp tokens/s over the engine with one technique switched to its baseline):", file=stream)
    for p in ablated:
        mine = ours[(p["batch"], p["context"])]
        name = p["kernels"][1:]
        buys = mine["tokens_per_s"] / p["tokens_per_s"]
        print(f"  batch {p['batch']:>2} context {p['context']:>5}  {name:<20} {buys:.3f}x  "
              f"({ABLATIONS[name].description})", file=stream)


def print_table(points: list, stream=None) -> None:
    """One row a point; `% read`: the roofline over the best streaming read of the run, `% spec`: over the spec
    sheet's bandwidth (never above 100)."""
    header = f"{'kernels':>21} {'batch':>5} {'context':>7} {'tok/s':>9} {'ms/step':>8} {'median':>7} " \
             f"{'1st tok ms':>10} {'roofline ms':>11} {'% read':>6} {'% spec':>6} {'launches/layer':>14}"
    print(header, file=stream)
    for p in points:
        roof = f"{p['roofline_ms']:>11.3f} {p['roofline_pct']:>6.1f}" if "roofline_ms" in p else f"{'-':>11} {'-':>6}"
        spec = f"{p['roofline_spec_pct']:>6.1f}" if "roofline_spec_pct" in p else f"{'-':>6}"
        launches = f"{p['launches']['per_layer']:>14.2f}" if "launches" in p else f"{'-':>14}"
        print(f"{p['kernels']:>21} {p['batch']:>5} {p['context']:>7} {p['tokens_per_s']:>9.1f} "
              f"{p['ms_per_step']:>8.3f} {p['ms_per_step_median']:>7.3f} {p['first_token_ms']:>10.2f} "
              f"{roof} {spec} {launches}", file=stream)
    ours = {(p["batch"], p["context"]): p for p in points if p["kernels"] == "fdpp"}
    for p in points:
        mine = ours.get((p["batch"], p["context"]))
        if p["kernels"] in PEER_NAMES and mine:
            speedup = mine["tokens_per_s"] / p["tokens_per_s"]
            first = p["first_token_ms"] / mine["first_token_ms"]
            print(f"batch {p['batch']} context {p['context']}: fdpp kernels {speedup:.2f}x the "
                  f"{PEER_NAMES[p['kernels']]}'s decode tokens/s, first token {first:.2f}x", file=stream)


def check_limits(args, folder, manifest: dict) -> None:
    """Every point fits the engine in `folder`: batch within its max batch, context + new tokens its max seq."""
    for batch in args.batch:
        if batch > manifest["max_batch"]:
            raise FdppError(f"--batch {batch} exceeds the max batch {manifest['max_batch']} of {folder}; rebuild "
                            f"with --max-batch {batch}")
    for context in args.context:
        if context + args.new_tokens > manifest["max_seq"]:
            raise FdppError(f"--context {context} + --new-tokens {args.new_tokens} exceed the max sequence "
                            f"{manifest['max_seq']} of {folder}; rebuild with a larger --max-seq")


def bench_command(args, command: str) -> int:
    from fdpp_rewrite.engine.manifest import read_manifest
    from fdpp_rewrite.engine.runtime import Engine

    if args.stream_gib * (1 << 30) < MIN_READ_BYTES:
        raise FdppError(f"--stream-gib {args.stream_gib} is too small to stream past the L2 cache; give at least "
                        f"{MIN_READ_BYTES / (1 << 30):g}")
    limits = read_manifest(args.engine)
    if args.ablate and (args.backend or limits["backend"]) != "cuda":
        raise FdppError("--ablate switches GPU kernels: it needs a cuda engine (build --backend cuda)")
    if "gptfast" in args.kernels:
        gptfast_config(limits, (args.backend or limits["backend"]) == "cuda")  # refused before any engine runs
    if min(args.batch) < 1 or min(args.context) < 1 or args.new_tokens < 2:
        raise FdppError("--batch and --context must be >= 1 and --new-tokens >= 2 (a decode step is timed after the "
                        f"first token); got --batch {args.batch} --context {args.context} "
                        f"--new-tokens {args.new_tokens}")
    folders = [args.engine] + ([args.torch_engine] if args.torch_engine and "torch" in args.kernels else [])
    for folder in folders:
        check_limits(args, folder, read_manifest(folder))
    paged = is_paged(limits, args.kv_memory)
    check_peer(args, paged)
    cuda = (args.backend or limits["backend"]) == "cuda"
    reads = StreamReads(args.stream_gib) if cuda else None  # before any engine: the KV pool is sized around it
    if reads:
        reads.measure("before")
    points, backend_name, graphs = [], None, None  # None: no engine of ours ran (--kernels gptfast alone)
    for label, options in configurations(args.kernels, args.ablate, paged):  # one engine at a time
        folder = args.torch_engine if label == "torch" and args.torch_engine else args.engine
        kv_memory = None if folder != args.engine else args.kv_memory
        engine = Engine(folder, backend=args.backend, use_graphs=not args.no_graphs, kv_memory=kv_memory, **options)
        for context in args.context:
            for batch in args.batch:
                points.append(dict(kernels=label, **bench_point(engine, batch, context, args.new_tokens,
                                                               engine.backend.name == "cuda")))
        backend_name, graphs = engine.backend.name, engine.use_graphs
        engine = None
        gc.collect()  # an engine in a reference cycle would keep its pool and graphs past empty_cache
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if "gptfast" in args.kernels:
        points += gptfast_points(args, limits)
    bandwidth = spec = None
    if reads:
        reads.measure("after")
        bandwidth = reads.best()
        spec = spec_memory_bandwidth(torch.cuda.get_device_name())
        reads.close()
        add_roofline(points, bandwidth, spec)
    print_table(points)
    print_ablation(points)
    if reads:
        print(f"attainable read: {bandwidth / 1e12:.2f} TB/s, the fastest of {len(reads.results)} streaming reads "
              f"over {args.stream_gib} GiB before and after the points ("
              + ", ".join(f"{r['read']} {r['when']} {r['bytes_per_s'] / 1e12:.2f}" for r in reads.results) + ")"
              + (f"; spec {spec / 1e12:.2f} TB/s" if spec else "; no spec bandwidth known for this GPU"))
    if args.out:
        report = {"command": command, "engine": str(args.engine), "backend": backend_name,
                  "torch_engine": str(args.torch_engine) if args.torch_engine else None,
                  "cuda_graphs": graphs, "gpu": limits.get("gpu"),
                  "model": limits.get("model"), "dtype": limits["dtype"], "kv_cache": limits.get("kv_cache"),
                  "stream_read_bytes_per_s": bandwidth, "stream_reads": reads.results if reads else [],
                  "spec_bytes_per_s": spec, "points": points}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{args.out}.tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(tmp, args.out)
        print(f"wrote {args.out}")
    return 0
