"""A rewritten graph against its original on the CPU: the original in onnxruntime, the rewrite with the CPU
reference of the fdpp ops (ref_ops), both through polygraphy's Comparator on the steps compare_inputs derives."""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

from fdpp_rewrite.compare_graphs import (check_data_files, check_interfaces, check_order, graph_inputs, is_bfloat16,
                                         signature)
from fdpp_rewrite.compare_inputs import CACHE_INPUT, blank_padding, check_options, check_prefill, make_steps
from fdpp_rewrite.compare_report import CompareReport, accuracy_rows, session_tolerance
from fdpp_rewrite.errors import cannot_load
from fdpp_rewrite.onnx_files import load_structure
from fdpp_rewrite.progress import QUIET, Progress


def _runner_classes(progress: Progress, steps: int):
    """(onnxruntime runner, reference runner): polygraphy runners that report a progress stage each, from
    activation (session creation) to the last step."""
    from polygraphy.backend.base import BaseRunner
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.common import TensorMetadata
    from polygraphy.datatype import DataType

    def staged(cls, stage_name):
        class Staged(cls):
            def activate_impl(self):
                self._stage = progress.start(stage_name, total=steps, unit="step")
                super().activate_impl()

            def infer_impl(self, feed_dict):
                outputs = blank_padding(feed_dict, super().infer_impl(feed_dict))
                self._stage.update()
                return outputs

            def deactivate_impl(self):
                super().deactivate_impl()
                if self._stage.count == steps:
                    self._stage.finish()
                else:  # it failed: the error says why
                    self._stage.close()

        return Staged

    class ReferenceRunner(BaseRunner):
        """Polygraphy runner over fdpp_rewrite.ref_session.make_reference_session (the CPU reference ops)."""

        def __init__(self, model, name="fdpp-reference"):
            super().__init__(name=name)
            self._model = model
            self._session = None

        def activate_impl(self):
            from fdpp_rewrite.ref_session import make_reference_session

            self._session = make_reference_session(self._model)

        def get_input_metadata_impl(self):
            meta = TensorMetadata()
            for node in self._session.get_inputs():
                meta.add(node.name, dtype=DataType.from_dtype(node.type, "onnxruntime"), shape=node.shape)
            return meta

        def infer_impl(self, feed_dict):
            names = [o.name for o in self._session.get_outputs()]
            start = time.perf_counter()
            outputs = self._session.run(names, dict(feed_dict))
            self.inference_time = time.perf_counter() - start  # polygraphy sums these
            return OrderedDict(zip(names, outputs))

        def deactivate_impl(self):
            self._session = None

    return (staged(OnnxrtRunner, "original (onnxruntime)"),
            staged(ReferenceRunner, "rewritten (CPU reference ops)"))


def compare_models(original, rewritten, batch: int = 2, prefill: int = 6, seed: int = 0,
                   progress: Progress = QUIET) -> CompareReport:
    """Run both models on the same steps through polygraphy and check every output. `original` and
    `rewritten` are paths or onnx.ModelProto objects. Everything that can be checked without running a model
    (the files, the options, that the two graphs belong together) is checked first."""
    import onnx

    from fdpp_rewrite.quiet import quiet_onnxruntime, quiet_polygraphy, session_options
    from fdpp_rewrite.ref_ops import COUNTERS

    check_options(batch, prefill)
    is_proto = (isinstance(original, onnx.ModelProto), isinstance(rewritten, onnx.ModelProto))
    original_name = "the original model" if is_proto[0] else str(original)
    rewritten_name = "the rewritten model" if is_proto[1] else str(rewritten)
    with progress.stage("check models"):
        original_model = original if is_proto[0] else load_structure(original)
        rewritten_model = rewritten if is_proto[1] else load_structure(rewritten)
        check_order(original_model, rewritten_model)
        check_interfaces(original_model, rewritten_model, original_name, rewritten_name)
        caches = [v for v in graph_inputs(original_model) if CACHE_INPUT.match(v.name)]
        if caches:
            dims = signature(caches[0])[1] or []
            check_prefill(dims[2] if len(dims) == 4 else None, prefill)
        for path, model in ((original, original_model), (rewritten, rewritten_model)):
            if not isinstance(path, onnx.ModelProto):
                check_data_files(Path(path), model)

    note = ""
    if is_bfloat16(original_model):
        with progress.stage("widen bfloat16"):
            original_model, rewritten_model = (_widened(m, path) for m, path in ((original_model, original),
                                                                                 (rewritten_model, rewritten)))
        original, rewritten, is_proto = original_model, rewritten_model, (True, True)
        note = BFLOAT16_NOTE

    ort = quiet_onnxruntime()
    quiet_polygraphy()

    with progress.stage("inputs"):  # a prefill of the original fills the caches
        try:
            session = ort.InferenceSession(original_model.SerializeToString() if is_proto[0] else str(original),
                                           session_options(), providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types for corrupt models / missing data
            raise cannot_load(original_name, exc) from None
        step_names, steps = make_steps(session, original_model, batch, prefill, seed)
    dtype, atol, rtol = session_tolerance(session)

    COUNTERS.reset()
    reference_source = rewritten_model if is_proto[1] else str(rewritten)
    original_runner, reference_runner = _runner_classes(progress, len(steps))
    rows = accuracy_rows([original_runner(session, name="onnxruntime-original"), reference_runner(reference_source)],
                         step_names, steps, atol, rtol)
    return CompareReport(rows=rows, atol=atol, rtol=rtol, dtype=dtype, fallback_rows=COUNTERS.fallback_rows,
                         attention_rows=COUNTERS.attention_rows, gemm_impls=dict(COUNTERS.gemm_impls), note=note)


BFLOAT16_NOTE = ("bfloat16 graphs compared in float32 (weights widened exactly; onnxruntime's CPU kernels lack "
                 "bfloat16): the rewrite is checked, bfloat16 rounding is not; check that with the engine's tokens "
                 "or perplexity against the float32 export")


def _widened(model, path):
    """The float32 twin of a bfloat16 graph, its weights loaded (a ModelProto or a path)."""
    import onnx

    from fdpp_rewrite.onnx_graph import widen_bfloat16

    if not isinstance(path, onnx.ModelProto):
        try:
            model = onnx.load(str(path))
        except Exception as exc:  # noqa: BLE001 - protobuf and missing external data raise many kinds
            raise cannot_load(str(path), exc) from None
    return widen_bfloat16(model)
