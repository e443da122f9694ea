"""Per-kernel time against bytes for one transformer layer of an engine's decode step (issue 43: what costs time at
batch 1-16 before anything is fused): kernel, bytes, us, TB/s and the gap to the kernel before it, per --batch.

    python scripts/kernel_table.py ENGINE --batch 1 16 [--context 128] [--out kernel_table.json]

Per batch: a warm-up generation of --new-tokens from random prompts of --context tokens (it traces and captures the
decode bucket, as `bench` does), then
- one eager run of the bucket's Program, each step synchronized inside a profiler range, gives which kernels each
  graph node launches (counted by their launch calls) and the bytes it moves (from its tensors, below);
- --replays replays of the step's CUDA graph under torch.profiler give each kernel's time and its start and end;
  per kernel the median over the replays and over the layers is reported (the layers are the same kernels);
- CUDA events around 20 more replays give the step's wall time.
Bytes: what a node reads and writes once: its input and output tensors, except the attention (K and V rows up to
each sequence's length, not the cache bucket), RopeAppend (q rotated in place, the new K/V rows written into the
caches) and Gather (one table row per index). gap_us: this kernel's start minus the previous kernel's end (< 0: they
overlapped, programmatic dependent launch). The wall time of the layer over its bytes is the layer's TB/s.
Writes --out (JSON, with the command) and the same tables as markdown beside it (.md); prints the markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as python scripts/kernel_table.py

from fdpp_rewrite.errors import FdppError, require_gpu, run_script  # noqa: E402

LABEL = "fdpp_step_"  # profiler range names of the eager run: LABEL + step index
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel")  # ...Ex, ...ExC included
WALL_REPLAYS = 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # optional for argparse only, so that a machine without a GPU says that first; main() asks for it
    p.add_argument("engine", type=Path, nargs="?", help="an engine folder (fdpp_rewrite build -o ENGINE); required")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--context", type=int, default=128, help="prompt tokens before the decode steps")
    p.add_argument("--new-tokens", type=int, default=8, help="tokens of the warm-up generation (>= 2)")
    p.add_argument("--layer", type=int, help="the layer whose kernels the markdown lists (default: the middle one)")
    p.add_argument("--replays", type=int, default=5, help="profiled graph replays per batch")
    p.add_argument("--out", type=Path, default=Path("kernel_table.json"), help="JSON path (markdown beside it)")
    return p.parse_args(argv)


# ---- pure logic (no GPU): the CPU tests use these ------------------------------------------------------------------

def short_name(name: str) -> str:
    """A kernel's name without argument lists and anonymous namespaces, at most 70 characters."""
    return name.replace("(anonymous namespace)::", "").split("(")[0][:70]


def op_name(key: str) -> str:
    """A Program step's op without its domain: 'fdpp::FlatGemm' -> 'FlatGemm', 'Gather' -> 'Gather'."""
    return key.split("::")[-1]


def node_bytes(op: str, inputs: list, outputs: list, kv_lens: list) -> int:
    """Bytes a node moves once, from its device tensors (objects with .nbytes, .shape and .element_size(); None for
    an absent or host input). kv_lens: each sequence row's keys, for the attention (the cache bucket holds more rows
    than it reads). Nodes that write rows into a cache count those rows, not the cache:
        RopeAppend(q, k, v, k_cache, v_cache, past_len, ...): q read and written, k and v read and written once more
        ScatterND(data, indices, updates), CacheAppend(new, buffer, write_pos): the updates read and written
        Gather(table, indices): one table row per index read, and written"""
    def size(t) -> int:
        return t.nbytes if t is not None else 0

    if op == "AsyncSoftmaxAttention":
        query, key = inputs[0], inputs[1]
        row_bytes = key.shape[1] * key.shape[3] * key.element_size()  # one position of all KV heads
        return size(query) + sum(map(size, outputs)) + 2 * row_bytes * sum(kv_lens[:query.shape[0]])
    if op == "RopeAppend":
        query, k_new, v_new = inputs[:3]
        return 2 * (size(query) + size(k_new) + size(v_new)) + sum(map(size, inputs[5:]))
    if op == "ScatterND":
        return size(inputs[1]) + 2 * size(inputs[2])
    if op == "CacheAppend":
        return 2 * size(inputs[0]) + size(inputs[2])
    if op == "Gather":
        return size(inputs[1]) + 2 * sum(map(size, outputs))
    return sum(map(size, inputs)) + sum(map(size, outputs))


def layer_span(ops: list, num_layers: int) -> tuple[int, int]:
    """(first step of layer 0, steps per layer) of a step list that repeats one layer num_layers times: the longest
    period, then the earliest start, of a window of num_layers equal pieces holding a FlatGemm (the longest: a layer
    holds runs of equal ops, gate_up then down, that repeat with a short period too). Example: ops
    [Gather, N, G, G, N, G, G, N, G] with 2 layers -> (1, 3)."""
    n = len(ops)
    for period in range(n // num_layers, 0, -1):
        span = num_layers * period
        for head in range(n - span + 1):
            window = ops[head:head + span]
            if "FlatGemm" in window[:period] and all(window[i] == window[i + period] for i in range(span - period)):
                return head, period
    raise FdppError(f"the decode step's {n} nodes do not repeat one layer {num_layers} times; is this a decoder "
                    "engine built by fdpp_rewrite build?")


def split_counts(items: list, counts: list) -> list:
    """items cut into consecutive pieces of the given lengths."""
    pieces, at = [], 0
    for count in counts:
        pieces.append(items[at:at + count])
        at += count
    return pieces


def tb_per_s(nbytes: float, us: float) -> float | None:
    return nbytes / us / 1e6 if us > 0 else None


def rows_table(rows: list) -> list:
    """Markdown lines of kernel rows."""
    lines = ["| step | node | kernel | bytes | us | TB/s | gap us |",
             "| ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        rate = f"{r['tb_s']:.2f}" if r["tb_s"] is not None else "-"
        lines.append(f"| {r['step']} | {r['op']} | `{r['kernel']}` | {r['bytes']:,} | {r['us']:.2f} | {rate} | "
                     f"{r['gap_us']:.2f} |")
    return lines


def markdown(report: dict) -> str:
    lines = [f"# Decode-step kernels: {report['model']} ({report['dtype']}) on {report['gpu']}", "",
             f"`{report['command']}`", ""]
    for point in report["points"]:
        layer = point["layer_summary"]
        lines += [f"## batch {point['batch']}, {point['kv_len_mean']:.0f} keys per sequence", "",
                  f"Step: {point['step_us']:.1f} us wall (CUDA events over {WALL_REPLAYS} replays), "
                  f"{point['kernels_per_step']} kernels summing {point['kernel_us_sum']:.1f} us, "
                  f"{point['step_bytes'] / 1e9:.3f} GB = {point['step_tb_s']:.2f} TB/s over the wall time.", "",
                  f"Layer {point['layer']} (kernel times: median over the replays and the {point['layers']} layers): "
                  f"{layer['kernels']} kernels, {layer['bytes'] / 1e6:.2f} MB, {layer['wall_us']:.2f} us from the "
                  f"previous layer's last end to its own = {layer['tb_s']:.2f} TB/s; kernel times sum to "
                  f"{layer['us_sum']:.2f} us.", ""]
        lines += rows_table(point["layer_rows"])
        lines += ["", "Before the first layer and after the last (sampling runs outside the graph):", ""]
        lines += rows_table(point["head_rows"] + point["tail_rows"])
        lines.append("")
    return "\n".join(lines)


# ---- measurement (GPU) -----------------------------------------------------------------------------------------------

def eager_steps(program, feeds: dict, kv_lens: list) -> list:
    """One eager run of the Program, each step synchronized in its own profiler range: per step (op, kernel count,
    bytes)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from fdpp_rewrite.engine.interpreter import Program

    seen = {}

    def labelled(index, step):
        def run(*inputs):
            with record_function(f"{LABEL}{index}"):
                result = step.fn(*inputs)
                torch.cuda.synchronize()
            outputs = result if isinstance(result, tuple) else (result,)
            tensors = [t if isinstance(t, torch.Tensor) and t.is_cuda else None for t in inputs]
            outs = [t for t in outputs if isinstance(t, torch.Tensor) and t.is_cuda]
            seen[index] = node_bytes(op_name(step.op), tensors, outs, kv_lens)
            return result
        return run

    steps = [dataclasses.replace(step, fn=labelled(i, step)) for i, step in enumerate(program.steps)]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        Program(steps, program.constants, program.output_names, program.op_counts).run(feeds)
        torch.cuda.synchronize()
    events = prof.events()
    ranges = [(e.time_range.start, e.time_range.end, int(e.name[len(LABEL):])) for e in events
              if e.name.startswith(LABEL) and e.device_type == torch.autograd.DeviceType.CPU]
    kernels = [e.time_range.start for e in events if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset", LABEL))]
    # the launch calls in each range (host clock, like the ranges); where the profiler did not see them all (a
    # library launching through the driver API), the kernels whose start falls in the range (the GPU clock as the
    # profiler maps it to the host's: each range ends after its kernels, synchronized)
    launches = [e.time_range.start for e in events if e.name.startswith(LAUNCH_CALLS)]
    if len(launches) != len(kernels):
        launches = kernels
    counts = {index: sum(start <= t <= end for t in launches) for start, end, index in ranges}
    return [{"op": op_name(step.op), "kernels": counts.get(i, 0), "bytes": seen.get(i, 0)}
            for i, step in enumerate(program.steps)]


def graph_kernels(graph, replays: int) -> list:
    """Per kernel of one replay, in order: name, and the medians over `replays` of its duration, its start and end
    (us from the replay's first kernel start)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
            torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")))
    if not kernels or len(kernels) % replays:
        raise FdppError(f"the profiler saw {len(kernels)} kernels over {replays} replays; run again on an idle GPU")
    per = len(kernels) // replays
    runs = [kernels[r * per:(r + 1) * per] for r in range(replays)]
    out = []
    for k in range(per):
        starts = [run[k][0] - run[0][0] for run in runs]
        ends = [run[k][1] - run[0][0] for run in runs]
        out.append({"kernel": short_name(runs[0][k][2]), "start": statistics.median(starts),
                    "end": statistics.median(ends),
                    "us": statistics.median(run[k][1] - run[k][0] for run in runs)})
    return out


def replay_wall_us(graph) -> float:
    import torch

    times = []
    for _ in range(WALL_REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def step_rows(steps: list, kernels: list) -> list:
    """One row per node that launched kernels: its kernels' names joined, their summed time, the node's bytes and the
    gap from the previous node's last kernel end to its first start."""
    if sum(s["kernels"] for s in steps) != len(kernels):
        raise FdppError(f"the eager run launched {sum(s['kernels'] for s in steps)} kernels and the graph replay "
                        f"{len(kernels)}; the step is not the same program (rebuild the engine, run again)")
    rows, previous_end = [], None
    for index, (step, mine) in enumerate(zip(steps, split_counts(kernels, [s["kernels"] for s in steps]))):
        if not mine:
            continue
        us = sum(k["us"] for k in mine)
        gap = mine[0]["start"] - previous_end if previous_end is not None else 0.0
        previous_end = mine[-1]["end"]
        rows.append({"step": index, "op": step["op"], "kernel": " + ".join(k["kernel"] for k in mine),
                     "bytes": step["bytes"], "us": us, "tb_s": tb_per_s(step["bytes"], us), "gap_us": gap,
                     "start": mine[0]["start"], "end": mine[-1]["end"]})
    return rows


def layer_rows(rows: list, head: int, period: int, layers: int, layer: int) -> tuple[list, dict]:
    """The rows of `layer` with us and gap_us as medians over all layers, and the layer's summary."""
    by_layer = [[r for r in rows if head + i * period <= r["step"] < head + (i + 1) * period] for i in range(layers)]
    mine = [dict(r) for r in by_layer[layer]]
    for position, row in enumerate(mine):
        same = [group[position] for group in by_layer if len(group) == len(mine)]
        row["us"] = statistics.median(r["us"] for r in same)
        row["gap_us"] = statistics.median(r["gap_us"] for r in same)
        row["tb_s"] = tb_per_s(row["bytes"], row["us"])
    nbytes = sum(r["bytes"] for r in mine)
    wall = statistics.median(group[-1]["end"] - group[0]["start"] + group[0]["gap_us"]
                             for group in by_layer if group)
    summary = {"kernels": len(mine), "bytes": nbytes, "us_sum": sum(r["us"] for r in mine), "wall_us": wall,
               "tb_s": tb_per_s(nbytes, wall)}
    return mine, summary


def measure(engine, batch: int, context: int, new_tokens: int, layer: int, replays: int) -> dict:
    from fdpp_rewrite.engine.bench import decode_step
    from fdpp_rewrite.engine.sampling import Sampler

    rng = random.Random(0)
    vocab = engine.vocab_size or 1000
    prompts = [[rng.randrange(vocab) for _ in range(context)] for _ in range(batch)]
    engine.generate(prompts, new_tokens, Sampler())  # traces and captures the decode bucket
    program, feeds, graph = decode_step(engine, batch)
    if graph is None:
        raise FdppError("the decode step has no CUDA graph; load the engine with graphs (a cuda engine)")
    kv_lens = [int(n) + 1 for n in feeds["past_len"].tolist()]  # each row's keys after this step's append
    steps = eager_steps(program, feeds, kv_lens)
    rows = step_rows(steps, graph_kernels(graph, replays))
    head, period = layer_span([s["op"] for s in steps], engine.num_layers)
    mine, summary = layer_rows(rows, head, period, engine.num_layers, layer)
    wall = replay_wall_us(graph)
    step_bytes = sum(s["bytes"] for s in steps)
    return {"batch": batch, "context": context, "kv_len_mean": statistics.fmean(kv_lens[:batch]), "step_us": wall,
            "kernels_per_step": sum(s["kernels"] for s in steps), "kernel_us_sum": sum(r["us"] for r in rows),
            "step_bytes": step_bytes, "step_tb_s": tb_per_s(step_bytes, wall), "layers": engine.num_layers,
            "layer": layer, "layer_summary": summary, "layer_rows": mine,
            "head_rows": [r for r in rows if r["step"] < head],
            "tail_rows": [r for r in rows if r["step"] >= head + engine.num_layers * period], "all_rows": rows}


def main(argv=None) -> int:
    args = parse_args(argv)
    require_gpu("kernel_table.py")
    if args.engine is None:
        raise FdppError("pass an engine folder: python scripts/kernel_table.py ENGINE --batch 1 16")
    from fdpp_rewrite.engine.manifest import read_manifest
    from fdpp_rewrite.engine.runtime import Engine

    limits = read_manifest(args.engine)
    if args.new_tokens < 2 or args.context < 1 or args.replays < 1 or min(args.batch) < 1:
        raise FdppError("--batch, --context and --replays must be >= 1 and --new-tokens >= 2")
    if max(args.batch) > limits["max_batch"] or args.context + args.new_tokens > limits["max_seq"]:
        raise FdppError(f"the engine takes batch <= {limits['max_batch']} and context + new tokens <= "
                        f"{limits['max_seq']}; pass smaller --batch / --context or rebuild it")
    engine = Engine(args.engine, backend="cuda")
    layer = engine.num_layers // 2 if args.layer is None else args.layer
    if not 0 <= layer < engine.num_layers:
        raise FdppError(f"--layer {layer} is not a layer of this engine (0 .. {engine.num_layers - 1})")
    points = [measure(engine, b, args.context, args.new_tokens, layer, args.replays) for b in args.batch]
    import torch

    model = (engine.manifest.get("model") or {}).get("source") or args.engine.name
    argv = sys.argv[1:] if argv is None else argv  # the arguments this run took, also when called from Python
    report = {"command": shlex.join([sys.executable, __file__, *argv]), "engine": str(args.engine),
              "gpu": torch.cuda.get_device_name(), "model": model, "dtype": engine.plan["dtype"], "points": points}
    text = markdown(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for path, content in ((args.out, json.dumps(report, indent=1) + "\n"), (args.out.with_suffix(".md"), text + "\n")):
        tmp = Path(f"{path}.tmp")
        tmp.write_text(content)
        os.replace(tmp, path)
    print(text)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    run_script(main)
