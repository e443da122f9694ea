"""Timing GEMMs on the GPU for the profiler and the benchmark.

Two ways, both with CUDA events:
- `flushed`: each launch alone, L2 flushed before it by reading a buffer four times the L2 (reads leave clean
  lines, so the kernel does not pay for writing back a flush's dirty data); median over repetitions. This is
  what the profiler uses: one GEMM as it runs after unrelated work.
- `graph`: `iters` launches back to back inside one CUDA graph, cycling over enough copies of the weight that
  none is in L2 when it is read again; time per launch = replay time / iters. This is a decode step's situation
  (layer after layer of different weights) without launch gaps.
"""

from __future__ import annotations

import statistics

from fdpp_rewrite.errors import FdppError


class Timer:
    def __init__(self, reps: int = 20, warmup: int = 3, flush_bytes: int | None = None):
        import torch

        self.torch = torch
        self.reps, self.warmup = reps, warmup
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = getattr(props, "L2_cache_size", 64 << 20) or (64 << 20)
        flush_bytes = flush_bytes or 4 * l2
        # Random data, not zeros: reading zeros can be faster than real data on some parts.
        self.flush_buf = torch.rand(flush_bytes // 4, device="cuda", dtype=torch.float32)
        self.flush_out = torch.empty((), device="cuda", dtype=torch.float32)
        self.l2_bytes = l2

    def flush(self) -> None:
        self.torch.sum(self.flush_buf, dim=0, out=self.flush_out)

    def flushed_us(self, fn) -> float:
        """Median microseconds of fn() with L2 flushed before each launch."""
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for i in range(self.reps):
            self.flush()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))

    def flushed_many_us(self, fns: dict) -> dict:
        """{name: median microseconds} for several launch functions timed in interleaved order (each
        repetition runs every function once, L2 flushed before each), so clock or thermal drift during the
        measurement affects all of them alike. A function whose warm-up raises FdppError maps to None."""
        torch = self.torch
        live = {}
        for name, fn in fns.items():
            try:
                for _ in range(self.warmup):
                    fn()
                live[name] = fn
            except FdppError:
                pass
        events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                         for _ in range(self.reps)] for name in live}
        for i in range(self.reps):
            for name, fn in live.items():
                self.flush()
                events[name][i][0].record()
                fn()
                events[name][i][1].record()
        torch.cuda.synchronize()
        out = {name: None for name in fns}
        for name in live:
            out[name] = statistics.median(s.elapsed_time(e) * 1000.0 for s, e in events[name])
        return out

    def graph_us(self, fns: list, iters: int = 60, replays: int = 10) -> float:
        """Microseconds per launch of fns[i % len(fns)], i < iters, replayed as one CUDA graph (median of
        replays). Each fn must be capturable (no allocation, no sync)."""
        return self.replay_many_us({"graph": capture_graph(fns, iters)}, iters=iters, replays=replays)["graph"]

    def replay_many_us(self, graphs: dict, iters: int = 60, replays: int = 10) -> dict:
        """{name: microseconds per launch} for CUDA graphs of `iters` launches each (capture_graph), replayed in
        interleaved order: each round replays every graph once, L2 flushed before each; the median over the
        rounds counts. Timed one after another instead, the same call drifts with the clocks: on the H200 one
        cuBLASLt GEMM (qkv, M = 64) took 28.04 us timed first and 27.39 three graphs later, 2.4% apart."""
        torch = self.torch
        for graph in graphs.values():
            graph.replay()
        torch.cuda.synchronize()
        events = {name: [] for name in graphs}
        for _ in range(replays):
            for name, graph in graphs.items():
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                self.flush()
                start.record()
                graph.replay()
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize()
        return {name: statistics.median(s.elapsed_time(e) * 1000.0 / iters for s, e in pairs)
                for name, pairs in events.items()}


def capture_graph(fns: list, iters: int):
    """A CUDA graph of `iters` launches of fns[i % len(fns)], each fn run once outside the capture first (cuBLAS
    plans, lazy module loads). Each fn must be capturable (no allocation, no sync)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(iters):
            fns[i % len(fns)]()
    return graph


def safe_time(timer_call, *args, **kwargs) -> float | None:
    """timer_call(*args) or None when the implementation rejects the problem (FdppError)."""
    try:
        return timer_call(*args, **kwargs)
    except FdppError:
        return None
