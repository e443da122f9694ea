"""Traced Programs per step shape and the CUDA graphs captured from them (plan once, replay many).

A step's first run at a shape is traced (interpreter.trace: it runs and records a Program); the Program is kept
per ((batch, seq), KV view length) and, where graphs apply, recorded once into a CUDA graph that later steps of
that shape replay. Graphs share one memory pool. Which shapes exist and what their static inputs are is the
Engine's business; this module only keeps the traced and captured work.
"""

from __future__ import annotations

import torch

from fdpp_rewrite.engine.interpreter import trace


class ProgramCache:
    def __init__(self, nodes: list, weights: dict, host_values: dict, use_graphs: bool):
        self.nodes, self.weights, self.host_values = nodes, weights, host_values
        self.use_graphs = use_graphs
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self.programs = {}        # ((batch, seq), kv_len) -> Program, for decode and prompt passes
        self.decode_graphs = {}   # (batch bucket, kv bucket) -> (CUDAGraph, logits tensor it writes)
        self.prefill_graphs = {}  # (slot, prefill bucket, kv bucket) -> (CUDAGraph, [1, V] logits of the last token)
        self.mixed_steps = {}     # (batch bucket, chunk, slot, kv bucket) -> (CUDAGraph or Program, output rows)
        self.paged_steps = {}     # (B bucket, P bucket, C, kv bucket) -> (CUDAGraph, output rows) or (Program, None)

    def forward(self, key: tuple, feeds: dict, backend, keep: bool):
        """logits for these feeds: the Program kept for `key` when there is one, else a trace (kept if `keep`)."""
        program = self.programs.get(key)
        if program is not None:
            return program.run(feeds)["logits"]
        outputs, program = self.trace(feeds, backend)
        if keep:
            self.programs[key] = program
        return outputs["logits"]

    def trace(self, feeds: dict, backend, layout=None):
        """(outputs, Program) of one traced run of the graph's logits."""
        return trace(self.nodes, ["logits"], feeds, self.weights, self.host_values, backend, layout=layout)

    def capture(self, program, feeds: dict, select=None):
        """(CUDAGraph, the logits it writes, or select(logits)) of `program` on `feeds`. Recording runs nothing:
        the step has already run eagerly when its shape was traced."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = program.run(feeds)["logits"]
            out = logits if select is None else select(logits)
        return graph, out
