"""`compare model.onnx ENGINE_DIR`: the original graph in onnxruntime (CPU) against a built engine (its GPU
kernels, or the cpu backend), through polygraphy's Comparator, on the steps `compare` feeds two graphs
(fdpp_rewrite.compare_inputs.make_steps: a prefill, a decode step with a different past_len per sequence, a chunk),
with the op contracts' tolerances.

The engine runs each step as a runtime does: the step's caches are copied into the engine's KV cache slots, the
step's Program runs on the cache views of its bucket (the kernels write the new rows in place), and the outputs
are the logits and the caches read back (rows past the engine's bucket are the step's own: nothing writes them).

An engine of a Hugging Face graph (plan "interface": "hf", hf_interface.py) is compared on the steps `compare`
derives for such graphs (fdpp_rewrite.compare_inputs.hf_steps): the past_key_values.N.* of a step fill the slots' rows
[0, past), and the engine makes its own attention_mask and positions: a prefill runs each sequence in its slot
(batch 1, as Engine.prefill_chunk), a decode step the whole batch at once (as Engine.decode, the mask hiding the
rows past each sequence). Its presents are the cache views [0, past + seq). The left-padded steps are skipped:
the engine holds every sequence from row 0 of its slot, so a batch never carries padding.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from fdpp_rewrite.compare_graphs import check_order
from fdpp_rewrite.compare_inputs import MIN_BATCH, check_options, make_steps
from fdpp_rewrite.compare_report import CompareReport, accuracy_rows, session_tolerance
from fdpp_rewrite.errors import FdppError, cannot_load
from fdpp_rewrite.hf_graph import present_name
from fdpp_rewrite.progress import QUIET, Progress


def is_engine_folder(path) -> bool:
    return Path(path).is_dir() and (Path(path) / "manifest.json").is_file()


def _engine_runner(engine, session, progress: Progress, steps: int):
    import torch
    from polygraphy.backend.base import BaseRunner

    from fdpp_rewrite.engine.runtime import pick

    class EngineRunner(BaseRunner):
        def __init__(self):
            super().__init__(name=f"fdpp-engine-{engine.backend.name}")

        def activate_impl(self):
            self._stage = progress.start(f"engine ({engine.backend.name} backend)", total=steps, unit="step")

        def get_input_metadata_impl(self):  # the original graph's interface, which the engine's graph shares
            from polygraphy.common import TensorMetadata
            from polygraphy.datatype import DataType

            meta = TensorMetadata()
            for node in session.get_inputs():
                meta.add(node.name, dtype=DataType.from_dtype(node.type, "onnxruntime"), shape=node.shape)
            return meta

        def infer_impl(self, feed_dict):
            start = time.perf_counter()
            outputs = infer_hf(feed_dict) if engine.hf_feeds is not None else infer_exporter(feed_dict)
            if engine.device.type == "cuda":
                torch.cuda.synchronize()
            self.inference_time = time.perf_counter() - start
            self._stage.update()
            return outputs

        def deactivate_impl(self):
            if self._stage.count == steps:
                self._stage.finish()
            else:
                self._stage.close()

    def check_fits(batch: int, longest: int) -> None:
        if batch > engine.max_batch:
            fix = (f"pass --batch {engine.max_batch} or less" if engine.max_batch >= MIN_BATCH else
                   f"build the engine with --max-batch {MIN_BATCH} or more to compare it")
            raise FdppError(f"the comparison feeds {batch} sequences, the engine takes {engine.max_batch}; {fix}")
        if longest > engine.max_seq:
            raise FdppError(f"the comparison needs {longest} positions, the engine holds {engine.max_seq}; "
                            "pass a smaller --prefill")

    def infer_exporter(feed_dict):
        ids = torch.from_numpy(np.ascontiguousarray(feed_dict["input_ids"])).to(engine.device)
        past = torch.from_numpy(np.ascontiguousarray(feed_dict["past_len"])).to(engine.device)
        batch, seq = ids.shape
        longest = int(feed_dict["past_len"].max()) + seq
        check_fits(batch, longest)
        kv_len = pick(longest, engine.kv_buckets)
        for name, cache in zip(engine.cache_names, engine.caches):
            values = torch.from_numpy(np.ascontiguousarray(feed_dict[name][:, :, :kv_len]))
            cache[:batch, :, :kv_len].copy_(values.to(device=engine.device, dtype=cache.dtype))
        logits = engine.forward(engine.feeds(ids, past, slice(0, batch), kv_len), cache_program=False)
        outputs = OrderedDict(logits=logits.float().cpu().numpy().astype(feed_dict[engine.cache_names[0]].dtype))
        for name, cache in zip(engine.cache_names, engine.caches):
            full = np.array(feed_dict[name], copy=True)
            full[:, :, :kv_len] = cache[:batch, :, :kv_len].float().cpu().numpy()
            outputs[name.replace("_cache.", "_cache_out.")] = full
        return outputs

    def infer_hf(feed_dict):
        ids = torch.from_numpy(np.ascontiguousarray(feed_dict["input_ids"])).to(engine.device)
        batch, seq = ids.shape
        past = feed_dict[engine.cache_names[0]].shape[2]  # every sequence of an unpadded step holds `past` rows
        check_fits(batch, past + seq)
        for name, cache in zip(engine.cache_names, engine.caches):
            values = torch.from_numpy(np.ascontiguousarray(feed_dict[name]))
            cache[:batch, :, :past].copy_(values.to(device=engine.device, dtype=cache.dtype))
        lengths = torch.full((batch,), past, dtype=torch.int64, device=engine.device)
        if seq == 1:
            kv_len = pick(past + 1, engine.kv_buckets)
            logits = engine.forward(engine.feeds(ids, lengths, slice(0, batch), kv_len), cache_program=False)
        else:
            logits = torch.cat([engine.forward(engine.feeds(ids[b:b + 1], lengths[b:b + 1], slice(b, b + 1), 0,
                                                            start=past), cache_program=False)
                                for b in range(batch)])
        dtype = feed_dict[engine.cache_names[0]].dtype
        outputs = OrderedDict(logits=logits[:, -seq:].float().cpu().numpy().astype(dtype))
        for name, cache in zip(engine.cache_names, engine.caches):
            outputs[present_name(name)] = cache[:batch, :, :past + seq].float().cpu().numpy().astype(dtype)
        return outputs

    return EngineRunner()


def drop_padded_steps(step_names: list, steps: list, stream=None) -> tuple[list, list]:
    """The steps of a Hugging Face graph without its left-padded batch (module docstring says why), with a note."""
    kept = [(name, step) for name, step in zip(step_names, steps) if not name.startswith("padded-")]
    if len(kept) < len(steps):
        print(f"note: {len(steps) - len(kept)} left-padded steps skipped: the engine holds each sequence from row 0 "
              "of its own slot, so its batches are never padded", file=stream or sys.stderr)
    return [name for name, _ in kept], [step for _, step in kept]


def compare_engine(original, engine_dir, batch: int = 2, prefill: int = 6, seed: int = 0, backend: str | None = None,
                   progress: Progress = QUIET):
    """CompareReport of the original graph (onnxruntime) against the engine on the same steps."""
    import onnx

    from fdpp_rewrite.compare_graphs import is_bfloat16
    from fdpp_rewrite.compare_report import contract_tolerance
    from fdpp_rewrite.engine.runtime import Engine
    from fdpp_rewrite.onnx_files import load_structure
    from fdpp_rewrite.onnx_graph import widen_bfloat16
    from fdpp_rewrite.quiet import quiet_onnxruntime, quiet_polygraphy, session_options

    check_options(batch, prefill)
    with progress.stage("load engine"):
        engine = Engine(engine_dir, backend=backend, use_graphs=False)
    model = load_structure(original)
    check_order(model)
    inputs = {value.name: value for value in model.graph.input}
    interface = ["attention_mask"] if engine.hf_feeds is not None else ["past_len"]
    missing = [n for n in ["input_ids", *interface, *engine.cache_names] if n not in inputs]
    dims = [d.dim_value for d in inputs[engine.cache_names[0]].type.tensor_type.shape.dim] if not missing else []
    if missing or dims[1] != engine.plan["num_kv_heads"] or dims[3] != engine.plan["head_dim"]:
        raise FdppError(f"{original} is not the graph {engine_dir} was built from (its inputs differ); pass the "
                        "model.onnx the engine's model.fdpp.onnx was rewritten from")
    ort = quiet_onnxruntime()
    quiet_polygraphy()
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from fdpp_rewrite.gpu import attention as gpu_attention

    with progress.stage("inputs"):
        try:
            source = str(original)
            if is_bfloat16(model):  # onnxruntime's CPU kernels lack bfloat16: its float32 twin, weights widened exactly
                source = widen_bfloat16(onnx.load(source)).SerializeToString()
            session = ort.InferenceSession(source, session_options(), providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types for corrupt models / missing data
            raise cannot_load(str(original), exc) from None
        step_names, steps = make_steps(session, model, batch, prefill, seed)
        if engine.hf_feeds is not None:
            step_names, steps = drop_padded_steps(step_names, steps)
    dtype, atol, rtol = session_tolerance(session)
    if engine.plan["dtype"] == "bfloat16":  # the engine rounds to bfloat16 where the widened original does not
        dtype, (atol, rtol) = "bfloat16", contract_tolerance("bfloat16")
    on_gpu = engine.device.type == "cuda"
    if on_gpu:
        gpu_attention.read_library_counters(reset=True)
    runners = [OnnxrtRunner(session, name="onnxruntime-original"), _engine_runner(engine, session, progress,
                                                                                    len(steps))]
    report_rows = accuracy_rows(runners, step_names, steps, atol, rtol)
    fallback = gpu_attention.read_library_counters()[0] if on_gpu else 0
    heads = sum(int(n["attrs"]["num_heads"]) for n in engine.plan["nodes"] if n["op"] == "AsyncSoftmaxAttention")
    rows = sum(heads * step["input_ids"].size for step in steps)  # one row per query head and position
    return CompareReport(rows=report_rows, atol=atol, rtol=rtol, dtype=dtype, fallback_rows=fallback,
                         attention_rows=rows)
