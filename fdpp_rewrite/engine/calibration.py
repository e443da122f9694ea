"""Calibration through the engine: the model's rewritten graph runs on the engine (cuda: the plugin library's
kernels in float16; cpu: the reference semantics in float32), and a backend wrapper hands every
AsyncSoftmaxAttention step's real inputs (query after RoPE, the cache view, past_len) to calibrate's
ScoreCollector (fdpp_rewrite/calibration/stats.py) before the kernel runs. The scores are computed with torch on the
engine's device, so on a GPU the statistics stay on the GPU beside the kernels.

The collection is outside the engine's hot path: only `calibrate` wraps a backend, an Engine it did not wrap
runs exactly as before. Each prompt is one Engine.prefill at slot 0 (past_len 0), the same windows the CPU path
runs through the reference model, so both give one calibration JSON (schema, phi and verdicts; numbers within
float tolerance, float16 rounding on the GPU).
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

from fdpp_rewrite.errors import FdppError


class CollectingBackend:
    """An engine backend whose attention steps first report their scores to `collector(layer, scores, mask)`.

    `collector` may be swapped between runs (calibration text, then held-out text); `valid_rows` is the prompt's
    real length, so the rows of the prefill bucket's right padding are not counted."""

    def __init__(self, inner, layer_of: dict[str, int]):
        self.inner = inner
        self.layer_of = layer_of  # attention node name -> layer (attention_layers)
        self.collector = None
        self.valid_rows: int | None = None

    def __getattr__(self, name):  # name, device, gemm_plans...: the wrapped backend's
        return getattr(self.inner, name)

    def lower(self, op_type: str, attrs: dict, name: str):
        fn = self.inner.lower(op_type, attrs, name)
        if op_type != "AsyncSoftmaxAttention":
            return fn
        if attrs.get("mask_mode") != "past_len":
            raise FdppError(f"attention node {name} has mask_mode {attrs.get('mask_mode')!r}; calibration through "
                            "the engine takes our exporter's graphs (mask_mode past_len): export the model with "
                            "python -m fdpp_rewrite export")
        from fdpp_rewrite.engine.backends import node_score_options

        layer, scale = self.layer_of[name], float(attrs["scale"])
        score_options = node_score_options(attrs)  # the scores the kernels see: soft-capped, windowed

        def attention(query, key, value, past_len):
            if self.collector is not None:
                scores, mask = visible_scores(query, key, past_len, scale, self.valid_rows, **score_options)
                self.collector(layer, scores, mask)
            return fn(query, key, value, past_len)
        return attention


def visible_scores(query, key, past_len, scale: float, valid_rows: int | None = None, softcap: float = 0.0,
                   window: int = 0):
    """A batch-1 step's scaled scores [1, Hq, S, past + S] in float32 (key heads repeated for GQA; soft-capped to
    softcap * tanh(s / softcap) where softcap > 0) and the additive causal mask [1, 1, S, past + S] (key j visible
    to query row i iff j <= past + i, and past + i - j < window where window > 0), S = valid_rows."""
    import torch

    if query.shape[0] != 1:
        raise FdppError("calibration collects one prompt at a time (batch 1)")
    rows = query.shape[2] if valid_rows is None else valid_rows
    past = int(past_len.reshape(-1)[0])
    q = query[:, :, :rows].float()
    k = key[:, :, :past + rows].float()
    if q.shape[1] != k.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    last_visible = past + torch.arange(rows, device=q.device).reshape(rows, 1)
    keys = torch.arange(past + rows, device=q.device).reshape(1, -1)
    hidden = keys > last_visible
    if window > 0:
        hidden |= last_visible - keys >= window
    mask = torch.zeros(hidden.shape, device=q.device).masked_fill(hidden, -torch.inf)
    return scores, mask.reshape(1, 1, rows, past + rows)


def attention_layers(nodes: list) -> dict[str, int]:
    """AsyncSoftmaxAttention node name -> layer, by the calibration's one numbering (calibration.settings)."""
    from fdpp_rewrite.calibration.settings import attention_nodes

    return {node["name"]: layer for layer, node in enumerate(attention_nodes(nodes))}


class EngineCollector:
    """The model (a calibrate source: preset, checkpoint or .gguf) exported, rewritten and built into an engine in a
    temporary folder, or the engine the user built from it, with a CollectingBackend; `run(chunks, collector)`
    prefills each prompt through it."""

    def __init__(self, source: str, backend: str, max_prompt: int, num_layers: int | None = None,
                 engine: Path | None = None):
        from fdpp_rewrite.engine.runtime import Engine

        self._folder = None
        if engine is None:
            engine = self._build(source, backend, max_prompt, num_layers)
        self.engine = Engine(engine, backend=backend, use_graphs=False)
        if self.engine.max_seq < max_prompt:
            raise FdppError(f"engine {engine} holds {self.engine.max_seq} tokens, under the {max_prompt}-token "
                            "prompts; pass a smaller --chunk or an engine built with a larger --max-seq")
        self.wrapper = CollectingBackend(self.engine.backend, attention_layers(self.engine.nodes))
        self.engine.backend = self.wrapper

    def _build(self, source: str, backend: str, max_prompt: int, num_layers: int | None) -> Path:
        """The source exported, rewritten and built into an engine in a temporary folder."""
        from fdpp_rewrite.engine.build import build_engine
        from fdpp_rewrite.export import export_model
        from fdpp_rewrite.rewrite import rewrite_file

        self._folder = tempfile.TemporaryDirectory(prefix="fdpp-calibrate-")
        folder = Path(self._folder.name)
        dtype = "float16" if backend == "cuda" else "float32"
        onnx_path = folder / "model.onnx"
        export_model(source, onnx_path, dtype=dtype, max_cache=max_prompt, num_layers=num_layers, progress=False)
        rewritten = rewrite_file(onnx_path, stream=io.StringIO())
        build_engine(rewritten, folder / "engine", backend=backend, max_batch=1, max_seq=max_prompt,
                     stream=io.StringIO())
        return folder / "engine"

    def run(self, chunks: list[list[int]], collector, desc: str = "forward", progress=None) -> None:
        import torch

        from fdpp_rewrite.progress import Progress

        self.wrapper.collector = collector
        with torch.no_grad(), (progress or Progress()).stage(desc, total=len(chunks), unit="prompt") as stage:
            for ids in chunks:
                self.engine.reset()
                self.wrapper.valid_rows = len(ids)
                self.engine.prefill(0, ids)
                stage.update()
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize()
        self.wrapper.collector = None

    def close(self) -> None:
        if self._folder is not None:
            self._folder.cleanup()
