"""`bench ENGINE [--batch 1 8 --context 128 --new-tokens 128]`: decode speed of an engine, measured as a user
sees it (sampling and the token readback included in every step).

Per (batch, context): random prompt ids (seed 0), one warm-up generation (it traces and captures the buckets the
run visits), then the timed generation. `--kernels fdpp torch` runs each point with this project's kernels and
then with the stock-torch baseline (ablations.TorchKernels: cuBLAS GEMMs with unfused epilogues, SDPA attention;
the same graph, norms, RoPE and CUDA graphs) and prints the ratios. `--ablate` also runs the engine once per ablation
(ablations.ABLATIONS: one technique switched back to its baseline, everything else unchanged) and prints what
each technique buys: fdpp's tokens/s over the ablated engine's, per point.

Reported: decode tokens/s (batch / mean step); ms per step (mean and median); first-token time (prefill of every
prompt + the first token; a paged engine prefills the batch as batched chunk rounds, engine.prefill_batch: 16
prompts of 128 tokens are one pass of 2,048); the memory roofline (weight bytes + KV bytes a step reads, over a
streaming read measured in the same run: torch.sum over --stream-gib of fp16 timed with CUDA events, median of
10, once before and once after the points, the faster of the two counting: the GPU's clocks vary between reads)
and its percent; kernel launches per decode step counted with torch.profiler over one replay of the step's CUDA
graph (and over one eager run of the same Program), per transformer layer. Weight bytes: every weight a step reads
whole (embedding tables read by Gather count one row per token).
"""

from __future__ import annotations

import collections
import json
import os
import random
import statistics
from pathlib import Path

import torch

from fdpp_rewrite.engine.buckets import pick
from fdpp_rewrite.errors import FdppError


def stream_read_bytes_per_s(gib: float) -> float:
    x = torch.randn(int(gib * (1 << 30)) // 2, dtype=torch.float16, device="cuda")
    out = torch.empty((), dtype=torch.float16, device="cuda")
    for _ in range(3):
        torch.sum(x, dim=0, out=out)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.sum(x, dim=0, out=out)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    nbytes = x.numel() * x.element_size()
    del x
    torch.cuda.empty_cache()
    return nbytes / statistics.median(times)


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


def add_roofline(points: list, bandwidth: float) -> None:
    """roofline_ms and roofline_pct of every point with its bytes: (weights + mean KV bytes) / bandwidth.
    Example: 13.2 GB + 0.1 GB at 4.2 TB/s -> 3.17 ms; at 3.80 ms a step, 83.4%."""
    for point in points:
        if "weight_bytes" in point:
            point["roofline_ms"] = (point["weight_bytes"] + point["kv_bytes_mean"]) / bandwidth * 1e3
            point["roofline_pct"] = 100 * point["roofline_ms"] / point["ms_per_step"]


def configurations(kernels: list, ablate: bool) -> list:
    """(label, Engine options) of each engine the bench runs, in order: fdpp, each ablation, torch."""
    from fdpp_rewrite.engine.ablations import ABLATIONS, TorchKernels

    runs = [("fdpp", {})] if "fdpp" in kernels or ablate else []
    if ablate:
        runs += [(f"-{name}", {"wrapper": wrapper}) for name, wrapper in ABLATIONS.items()]
    if "torch" in kernels or ablate:
        runs.append(("torch", {"wrapper": TorchKernels}))
    return runs


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
    header = f"{'kernels':>21} {'batch':>5} {'context':>7} {'tok/s':>9} {'ms/step':>8} {'median':>7} " \
             f"{'1st tok ms':>10} {'roofline ms':>11} {'roofline %':>10} {'launches/layer':>14}"
    print(header, file=stream)
    for p in points:
        roof = f"{p['roofline_ms']:>11.3f} {p['roofline_pct']:>10.1f}" if "roofline_ms" in p else f"{'-':>11} {'-':>10}"
        launches = f"{p['launches']['per_layer']:>14.2f}" if "launches" in p else f"{'-':>14}"
        print(f"{p['kernels']:>21} {p['batch']:>5} {p['context']:>7} {p['tokens_per_s']:>9.1f} "
              f"{p['ms_per_step']:>8.3f} {p['ms_per_step_median']:>7.3f} {p['first_token_ms']:>10.2f} "
              f"{roof} {launches}", file=stream)
    ours = {(p["batch"], p["context"]): p for p in points if p["kernels"] == "fdpp"}
    for p in points:
        mine = ours.get((p["batch"], p["context"]))
        if p["kernels"] == "torch" and mine:
            speedup = mine["tokens_per_s"] / p["tokens_per_s"]
            first = p["first_token_ms"] / mine["first_token_ms"]
            print(f"batch {p['batch']} context {p['context']}: fdpp kernels {speedup:.2f}x the torch baseline's "
                  f"decode tokens/s, first token {first:.2f}x", file=stream)


def bench_command(args, command: str) -> int:
    from fdpp_rewrite.engine.manifest import read_manifest
    from fdpp_rewrite.engine.runtime import Engine

    limits = read_manifest(args.engine)
    max_batch, max_seq = limits["max_batch"], limits["max_seq"]
    if args.ablate and (args.backend or limits["backend"]) != "cuda":
        raise FdppError("--ablate switches GPU kernels: it needs a cuda engine (build --backend cuda)")
    if min(args.batch) < 1 or min(args.context) < 1 or args.new_tokens < 2:
        raise FdppError("--batch and --context must be >= 1 and --new-tokens >= 2 (a decode step is timed after the "
                        f"first token); got --batch {args.batch} --context {args.context} "
                        f"--new-tokens {args.new_tokens}")
    for batch in args.batch:
        if batch > max_batch:
            raise FdppError(f"--batch {batch} exceeds the engine's max batch {max_batch}; rebuild with "
                            f"--max-batch {batch}")
    for context in args.context:
        if context + args.new_tokens > max_seq:
            raise FdppError(f"--context {context} + --new-tokens {args.new_tokens} exceed the engine's max sequence "
                            f"{max_seq}; rebuild with a larger --max-seq")
    points, reads = [], []
    for label, options in configurations(args.kernels, args.ablate):  # one engine at a time: weights on the GPU once
        engine = Engine(args.engine, backend=args.backend, use_graphs=not args.no_graphs, kv_memory=args.kv_memory,
                        **options)
        cuda = engine.backend.name == "cuda"
        if cuda and not reads:
            reads.append(stream_read_bytes_per_s(args.stream_gib))
        for context in args.context:
            for batch in args.batch:
                points.append(dict(kernels=label, **bench_point(engine, batch, context, args.new_tokens, cuda)))
        backend_name, graphs, manifest = engine.backend.name, engine.use_graphs, engine.manifest
        engine = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if reads:
        reads.append(stream_read_bytes_per_s(args.stream_gib))
    bandwidth = max(reads) if reads else None
    if bandwidth:
        add_roofline(points, bandwidth)
    print_table(points)
    print_ablation(points)
    if bandwidth:
        print(f"streaming read: {bandwidth / 1e12:.2f} TB/s (torch.sum over {args.stream_gib} GiB; the faster of "
              f"{' and '.join(f'{r / 1e12:.2f}' for r in reads)} TB/s, before and after the points)")
    if args.out:
        report = {"command": command, "engine": str(args.engine), "backend": backend_name,
                  "cuda_graphs": graphs, "gpu": manifest.get("gpu"),
                  "model": manifest.get("model"), "dtype": manifest["dtype"], "kv_cache": manifest.get("kv_cache"),
                  "stream_read_bytes_per_s": bandwidth, "stream_reads_bytes_per_s": reads, "points": points}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{args.out}.tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(tmp, args.out)
        print(f"wrote {args.out}")
    return 0
