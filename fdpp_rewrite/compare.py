"""`python -m fdpp_rewrite compare model.onnx model.fdpp.onnx`: run the original graph in onnxruntime and the
rewritten one with the CPU reference of the fdpp ops, on the same realistic inputs, through polygraphy's
Comparator; print each output's max absolute / relative error and PASS/FAIL against the op contracts'
tolerances; exit 1 on any mismatch.

Inputs (our exporter's interface): a prefill from empty caches (past_len 0), then a decode step and a chunked
step on the caches that prefill wrote, with a different past_len per sequence, and random values in every
cache slot past the written ones (they must stay invisible). Token ids are drawn from the vocabulary.
Hugging Face decode-with-cache graphs (past_key_values.N.key/value [batch, kv_heads, past, head_dim] in,
present.N.key/value out): the roles come from the declared names and shapes (attention_mask covers past + new
tokens, position_ids and cache_position the new ones); a prefill from empty caches, several decode steps on the
presents it returned, then the same on a left-padded batch. Hugging Face prefill graphs: one step and a left-padded
one. Outputs at padded positions are not compared (what a model computes for a pad token is a convention: the
original averages over nothing, the fdpp op gives 0). Other graphs: input_ids in the vocabulary, random floats
elsewhere.
"""

from __future__ import annotations

import re
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fdpp_rewrite.contracts import OP_NAMES, load_contract
from fdpp_rewrite.dtypes import numpy_dtype_name
from fdpp_rewrite.errors import FdppError, cannot_load
from fdpp_rewrite.generate import ORT_DTYPES
from fdpp_rewrite.onnx_files import load_structure
from fdpp_rewrite.progress import QUIET, Progress

if TYPE_CHECKING:  # onnx, onnxruntime and polygraphy are imported when a comparison runs, not for --help
    import onnx

CACHE_INPUT = re.compile(r"^(key|value)_cache\.(\d+)$")
PAST_INPUT = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")  # transformers' names, as the exporters keep them
HF_DECODE_STEPS, HF_PADDED_DECODE_STEPS = 3, 2


def add_arguments(parser) -> None:
    parser.add_argument("original", help="the exported model (standard ops)")
    parser.add_argument("rewritten", help="its rewrite (fdpp ops), e.g. model.fdpp.onnx, or an engine folder built "
                        "from it (`build`): then the engine's kernels are compared")
    parser.add_argument("--batch", type=int, default=2, help="sequences per step (default 2; at least 2)")
    parser.add_argument("--prefill", type=int, default=6, help="prompt length of the first step (default 6)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")


# --- inputs -------------------------------------------------------------------------------------------------

def vocab_size(model: onnx.ModelProto) -> int | None:
    """From the logits' last dim, else from the embedding table that input_ids index."""
    for output in model.graph.output:
        dims = output.type.tensor_type.shape.dim
        if output.name == "logits" and dims and dims[-1].HasField("dim_value"):
            return int(dims[-1].dim_value)
    initializers = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == "input_ids":
            table = initializers.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return None


def _concrete(shape, sizes: dict) -> list[int]:
    return [dim if isinstance(dim, int) and dim > 0 else sizes.get(dim, sizes["__other__"]) for dim in shape]


def check_prefill(max_cache, prefill: int) -> None:
    """The prefill and the 3 steps after it fit the cache (`max_cache` an int, or a symbol for a dynamic one)."""
    if prefill < 1:
        raise FdppError(f"--prefill must be at least 1, got {prefill}")
    if isinstance(max_cache, int) and max_cache > 0 and prefill + 3 > max_cache:
        raise FdppError(f"the caches hold {max_cache} tokens; pass --prefill at most {max_cache - 3}")


def exporter_steps(session, vocab: int, batch: int, prefill: int, rng) -> list[OrderedDict]:
    """Prefill, then decode and chunked steps on the caches the prefill wrote (our exporter's interface)."""
    inputs = {i.name: i for i in session.get_inputs()}
    caches = sorted((n for n in inputs if CACHE_INPUT.match(n)), key=lambda n: (int(CACHE_INPUT.match(n).group(2)), n))
    cache_meta = inputs[caches[0]]
    check_prefill(cache_meta.shape[2], prefill)
    # a dynamic cache (exported with --max-cache 0) is made long enough for the prefill and the 3 steps after it
    max_cache = cache_meta.shape[2] if isinstance(cache_meta.shape[2], int) else max(32, prefill + 3)
    cache_dtype = ORT_DTYPES[cache_meta.type]
    shape = [batch] + [d if isinstance(d, int) else max_cache for d in cache_meta.shape[1:]]
    shape[2] = max_cache

    def step(seq, past_len, cache_values):
        feed = OrderedDict(input_ids=rng.integers(0, vocab, (batch, seq)).astype(np.int64),
                           past_len=np.asarray(past_len, dtype=np.int64))
        feed.update((name, cache_values[name]) for name in caches)
        return feed

    first = step(prefill, [0] * batch, {name: np.zeros(shape, cache_dtype) for name in caches})
    out_names = [name.replace("_cache.", "_cache_out.") for name in caches]
    filled = dict(zip(caches, session.run(out_names, dict(first))))
    for name, values in filled.items():  # slots never written hold noise: a correct mask never reads them
        values[:, :, prefill:] = rng.standard_normal(values[:, :, prefill:].shape).astype(cache_dtype)
    decode_past = [max(prefill - 2 * (b % 3), 1) for b in range(batch)]          # e.g. [6, 4, 2, 6, ...]
    chunk_past = [max(prefill - 3 * (b % 2) - 1, 0) for b in range(batch)]       # e.g. [5, 2, 5, ...]
    return [first, step(1, decode_past, filled), step(3, chunk_past, filled)]


def generic_steps(session, vocab: int | None, batch: int, seq: int, rng) -> list[OrderedDict]:
    """One step for graphs with other inputs (Hugging Face exports and the like)."""
    feed = OrderedDict()
    sizes = {"__other__": seq}
    for meta in session.get_inputs():
        dtype = ORT_DTYPES.get(meta.type)
        if dtype is None:
            raise FdppError(f"input '{meta.name}' has type {meta.type}; compare feeds float and int64 inputs only")
        if meta.shape and not isinstance(meta.shape[0], int):
            sizes.setdefault(meta.shape[0], batch)
        shape = _concrete(meta.shape, sizes)
        if dtype in (np.int64, np.int32):
            if "input_ids" in meta.name:
                if vocab is None:
                    raise FdppError("cannot tell the vocabulary size (no static logits dim, no embedding Gather)")
                feed[meta.name] = rng.integers(0, vocab, shape).astype(dtype)
            elif "attention_mask" in meta.name:
                feed[meta.name] = np.ones(shape, dtype)
            elif "position_ids" in meta.name:
                feed[meta.name] = np.broadcast_to(np.arange(shape[-1]), shape).astype(dtype)
            else:
                raise FdppError(f"do not know how to feed the integer input '{meta.name}'; compare knows input_ids, "
                                "past_len, attention_mask and position_ids")
        else:
            feed[meta.name] = (0.5 * rng.standard_normal(shape)).astype(dtype)
    return [feed]


def present_name(past_name: str) -> str:
    """past_key_values.3.key -> present.3.key (the output a decode graph returns for that input)."""
    layer, kind = PAST_INPUT.match(past_name).groups()
    return f"present.{layer}.{kind}"


def hf_cache_layout(inputs: list, outputs: list) -> tuple[list, list, np.dtype]:
    """(past input names in layer order, [kv_heads, head_dim], cache dtype) of a decode-with-cache graph, from the
    declared shapes; one-line FdppError when the interface does not fit together."""
    past = sorted((i for i in inputs if PAST_INPUT.match(i.name)),
                  key=lambda i: (int(PAST_INPUT.match(i.name).group(1)), i.name))
    names = {o.name for o in outputs}
    missing = [present_name(i.name) for i in past if present_name(i.name) not in names]
    if missing:
        raise FdppError(f"the graph takes {past[0].name} but returns no {missing[0]}; compare feeds each step the "
                        "presents of the step before (export with use_cache=True)")
    first = past[0]
    if len(first.shape) != 4 or not all(isinstance(d, int) for d in (first.shape[1], first.shape[3])):
        raise FdppError(f"{first.name} is declared {first.shape}; compare needs [batch, kv_heads, past, head_dim] "
                        "with static kv_heads and head_dim")
    if isinstance(first.shape[2], int):
        raise FdppError(f"{first.name} has a fixed past length {first.shape[2]}; compare needs a dynamic one "
                        "(it starts from empty caches)")
    dtype = ORT_DTYPES.get(first.type)
    if dtype not in (np.float32, np.float16):
        raise FdppError(f"{first.name} is {first.type}; compare feeds float32 and float16 caches")
    return [i.name for i in past], [first.shape[1], first.shape[3]], dtype


def _hf_feed(metas: list, ids: np.ndarray, mask: np.ndarray, past: dict) -> OrderedDict:
    """One step's inputs: `mask` [batch, past + seq] covers the cached and the new tokens."""
    seq = ids.shape[1]
    past_len = mask.shape[1] - seq
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, past_len:]  # left padding shifts the positions
    feed = OrderedDict()
    for meta in metas:
        dtype = ORT_DTYPES.get(meta.type)
        if meta.name == "input_ids":
            value = ids
        elif meta.name == "attention_mask":
            value = mask
        elif meta.name == "position_ids":
            value = positions
        elif meta.name == "cache_position":
            value = np.arange(past_len, past_len + seq)
        elif meta.name in past:
            value = past[meta.name]
        else:
            raise FdppError(f"do not know how to feed the input '{meta.name}' of this Hugging Face graph; compare "
                            "feeds input_ids, attention_mask, position_ids, cache_position and past_key_values.N.*")
        feed[meta.name] = np.asarray(value).astype(dtype)
    return feed


def _run_original(session, names, feed, step: str) -> list:
    try:
        return session.run(names, dict(feed))
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types; the message says what failed
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FdppError(f"onnxruntime could not run the original model on the {step} inputs compare derived from "
                        f"its declared shapes ({detail[:300]}); check its input names and dims") from None


def hf_steps(session, vocab: int | None, batch: int, prefill: int, rng) -> tuple[list, list]:
    """(step names, feeds) for a Hugging Face graph: with caches, a prefill from empty caches and decode steps on
    the presents each step returned, then the same for a left-padded batch; without, a step and a left-padded
    one. Sequence b > 0 of the padded batch starts with 1 or 2 pad tokens."""
    if vocab is None:
        raise FdppError("cannot tell the vocabulary size (no static logits dim, no embedding Gather)")
    metas, outputs = session.get_inputs(), session.get_outputs()
    cached = any(PAST_INPUT.match(m.name) for m in metas)
    pads = np.array([0] + [1 + b % 2 for b in range(1, batch)])
    if prefill <= pads.max():  # every padded sequence keeps a real token
        raise FdppError(f"--prefill must be at least {pads.max() + 1} for the left-padded batch, got {prefill}")
    ids = rng.integers(0, vocab, (batch, prefill))
    full = np.ones((batch, prefill), np.int64)
    padded = (np.arange(prefill)[None, :] >= pads[:, None]).astype(np.int64)
    if not cached:
        return ["prefill", "padded"], [_hf_feed(metas, ids, full, {}), _hf_feed(metas, ids, padded, {})]
    past_names, (kv_heads, head_dim), dtype = hf_cache_layout(metas, outputs)
    out_names = [present_name(name) for name in past_names]
    names, feeds = [], []
    for label, mask, steps in (("", full, HF_DECODE_STEPS), ("padded-", padded, HF_PADDED_DECODE_STEPS)):
        past = {name: np.zeros((batch, kv_heads, 0, head_dim), dtype) for name in past_names}
        step_ids = ids
        for step in range(steps + 1):
            step_name = f"{label}{'prefill' if step == 0 else f'decode{step}'}"
            feed = _hf_feed(metas, step_ids, mask, past)
            names.append(step_name)
            feeds.append(feed)
            past = dict(zip(past_names, _run_original(session, out_names, feed, step_name)))
            step_ids = rng.integers(0, vocab, (batch, 1))
            mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
    return names, feeds


def is_hf_graph(names: set) -> bool:
    return "input_ids" in names and "attention_mask" in names and "past_len" not in names


def make_steps(session, model: onnx.ModelProto, batch: int, prefill: int, seed: int) -> tuple[list, list]:
    """(step names, feeds) for the original model's interface."""
    if batch < 2:
        raise FdppError("--batch must be at least 2 (sequences with different past_len are part of the check)")
    if prefill < 1:
        raise FdppError(f"--prefill must be at least 1, got {prefill}")
    rng = np.random.default_rng(seed)
    names = {i.name for i in session.get_inputs()}
    vocab = vocab_size(model)
    if {"input_ids", "past_len"} <= names and any(CACHE_INPUT.match(n) for n in names):
        if vocab is None:
            raise FdppError("cannot tell the vocabulary size of the original model (no static logits dim)")
        return ["prefill", "decode", "chunk"], exporter_steps(session, vocab, batch, prefill, rng)
    if is_hf_graph(names):
        return hf_steps(session, vocab, batch, prefill, rng)
    steps = generic_steps(session, vocab, batch, prefill, rng)
    return [f"step{i}" for i in range(len(steps))], steps


def blank_padding(feed: dict, outputs: dict) -> dict:
    """Zero what a model computed at padded positions (attention_mask 0), identically for both runners: logits
    [batch, seq, ...] along the new tokens, present.* [batch, heads, past + seq, ...] along all of them."""
    mask = feed.get("attention_mask")
    if mask is None or mask.all():
        return outputs
    pads = np.asarray(mask) == 0
    blanked = OrderedDict()
    for name, value in outputs.items():
        value = np.asarray(value)
        if name == "logits" and value.ndim >= 2 and value.shape[1] <= pads.shape[1]:
            value = np.where(pads[:, -value.shape[1]:].reshape(pads.shape[0], -1, *[1] * (value.ndim - 2)), 0, value)
        elif name.startswith("present.") and value.ndim == 4 and value.shape[2] == pads.shape[1]:
            value = np.where(pads[:, None, :, None], 0, value)
        blanked[name] = value.astype(np.asarray(outputs[name]).dtype, copy=False)
    return blanked


# --- do the two graphs belong together? ---------------------------------------------------------------------

def _graph_inputs(model: onnx.ModelProto) -> list:
    initializers = {init.name for init in model.graph.initializer}  # old IR versions list them as inputs
    return [value for value in model.graph.input if value.name not in initializers]


def _signature(value) -> tuple[int, list | None]:
    """(element type, dims) of a graph input or output; a dim is an int, a symbol name, or None."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return tensor.elem_type, None
    return tensor.elem_type, [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                              for d in tensor.shape.dim]


def _describe(signature) -> str:
    import onnx

    elem_type, dims = signature
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type).name if elem_type else "untyped"  # e.g. float32
    return dtype if dims is None else f"{dtype} [{', '.join('?' if d is None else str(d) for d in dims)}]"


def _same(a, b) -> bool:
    """Same element type and rank, and equal sizes wherever both dims are static."""
    (type_a, dims_a), (type_b, dims_b) = a, b
    if type_a and type_b and type_a != type_b:
        return False
    if dims_a is None or dims_b is None:
        return True
    return len(dims_a) == len(dims_b) and all(
        not (isinstance(x, int) and isinstance(y, int)) or x == y for x, y in zip(dims_a, dims_b))


def check_interfaces(original: onnx.ModelProto, rewritten: onnx.ModelProto, original_name: str = "the original",
                     rewritten_name: str = "the rewrite") -> None:
    """One-line FdppError unless both graphs take the same inputs and give the same outputs (names, dtypes and
    static sizes): a rewrite of another model (another family, size or cache length) is refused before anything
    runs. e.g. "... input key_cache.0 is float32 [batch, 3, 32, 64] in a.onnx but float32 [batch, 1, 32, 64]
    in b.fdpp.onnx ..." """
    fix = f"compare a model with its own rewrite (python -m fdpp_rewrite rewrite {original_name})"
    for kind, ours, theirs in (("input", _graph_inputs(original), _graph_inputs(rewritten)),
                               ("output", original.graph.output, rewritten.graph.output)):
        a, b = {v.name: _signature(v) for v in ours}, {v.name: _signature(v) for v in theirs}
        only_a, only_b = [n for n in a if n not in b], [n for n in b if n not in a]
        if only_a or only_b:
            parts = [f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''} only in {where}"
                     for names, where in ((only_a, original_name), (only_b, rewritten_name)) if names]
            raise FdppError(f"{rewritten_name} does not belong to {original_name}: their {kind}s differ "
                            f"({'; '.join(parts)}); {fix}")
        for name, signature in a.items():
            if not _same(signature, b[name]):
                raise FdppError(f"{rewritten_name} does not belong to {original_name}: {kind} {name} is "
                                f"{_describe(signature)} in {original_name} but {_describe(b[name])} in "
                                f"{rewritten_name}; {fix}")


# --- runners ------------------------------------------------------------------------------------------------

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
        """Polygraphy runner over fdpp_rewrite.ref_ops.make_reference_session (the CPU reference ops)."""

        def __init__(self, model, name="fdpp-reference"):
            super().__init__(name=name)
            self._model = model
            self._session = None

        def activate_impl(self):
            from fdpp_rewrite.ref_ops import make_reference_session

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


# --- the comparison -----------------------------------------------------------------------------------------

@dataclass
class CompareRow:
    step: str
    output: str
    max_abs: float
    max_rel: float
    passed: bool


@dataclass
class CompareReport:
    rows: list = field(default_factory=list)
    atol: float = 0.0
    rtol: float = 0.0
    dtype: str = ""
    fallback_rows: int = 0
    attention_rows: int = 0
    gemm_impls: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(row.passed for row in self.rows)


def contract_tolerance(dtype: str) -> tuple[float, float]:
    """The loosest whole-model (atol, rtol) of the op contracts for `dtype`: a model mixes both ops."""
    pairs = [load_contract(op).tolerance(dtype, scope="model") for op in OP_NAMES]
    return max(a for a, _ in pairs), max(r for _, r in pairs)


def compare_models(original, rewritten, batch: int = 2, prefill: int = 6, seed: int = 0,
                   progress: Progress = QUIET) -> CompareReport:
    """Run both models on the same steps through polygraphy and check every output. `original` and
    `rewritten` are paths or onnx.ModelProto objects. Everything that can be checked without running a model
    (the files, the options, that the two graphs belong together) is checked first."""
    import onnx

    from fdpp_rewrite.quiet import quiet_onnxruntime, quiet_polygraphy, session_options
    from fdpp_rewrite.ref_ops import COUNTERS

    if batch < 2:
        raise FdppError("--batch must be at least 2 (sequences with different past_len are part of the check)")
    check_prefill(None, prefill)
    is_proto = (isinstance(original, onnx.ModelProto), isinstance(rewritten, onnx.ModelProto))
    original_name = "the original model" if is_proto[0] else str(original)
    rewritten_name = "the rewritten model" if is_proto[1] else str(rewritten)
    with progress.stage("check models"):
        original_model = original if is_proto[0] else load_structure(original)
        rewritten_model = rewritten if is_proto[1] else load_structure(rewritten)
        if not any(node.domain == "fdpp" for node in rewritten_model.graph.node):
            raise FdppError("the second model has no fdpp nodes; pass the rewritten model (model.fdpp.onnx) second")
        if any(node.domain == "fdpp" for node in original_model.graph.node):
            raise FdppError("the first model has fdpp nodes; pass the exported model (model.onnx) first")
        check_interfaces(original_model, rewritten_model, original_name, rewritten_name)
        caches = [v for v in _graph_inputs(original_model) if CACHE_INPUT.match(v.name)]
        if caches:
            dims = _signature(caches[0])[1] or []
            check_prefill(dims[2] if len(dims) == 4 else None, prefill)
        for path, model in ((original, original_model), (rewritten, rewritten_model)):
            if not isinstance(path, onnx.ModelProto):
                _check_data_files(Path(path), model)

    ort = quiet_onnxruntime()
    quiet_polygraphy()
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    with progress.stage("inputs"):  # a prefill of the original fills the caches
        try:
            session = ort.InferenceSession(original_model.SerializeToString() if is_proto[0] else str(original),
                                           session_options(), providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types for corrupt models / missing data
            raise cannot_load(original_name, exc) from None
        step_names, steps = make_steps(session, original_model, batch, prefill, seed)
    output_type = session.get_outputs()[0].type
    dtype = numpy_dtype_name(ORT_DTYPES.get(output_type), "float32")
    atol, rtol = contract_tolerance(dtype)

    COUNTERS.reset()
    reference_source = rewritten_model if is_proto[1] else str(rewritten)
    original_runner, reference_runner = _runner_classes(progress, len(steps))
    results = Comparator.run([original_runner(session, name="onnxruntime-original"),
                              reference_runner(reference_source)], data_loader=steps)
    accuracy = Comparator.compare_accuracy(
        results, compare_func=SimpleCompareFunc(atol=atol, rtol=rtol, check_error_stat="elemwise"))
    report = CompareReport(atol=atol, rtol=rtol, dtype=dtype, fallback_rows=COUNTERS.fallback_rows,
                           attention_rows=COUNTERS.attention_rows, gemm_impls=dict(COUNTERS.gemm_impls))
    for per_iteration in accuracy[0].values():
        for step, outputs in zip(step_names, per_iteration):
            for name, result in outputs.items():
                report.rows.append(CompareRow(step, name, result.max_absdiff, result.max_reldiff, bool(result)))
    return report


def _check_data_files(path: Path, model: onnx.ModelProto) -> None:
    """The external data files the model names exist beside it."""
    import onnx

    locations = {entry.value for init in model.graph.initializer if init.data_location == onnx.TensorProto.EXTERNAL
                 for entry in init.external_data if entry.key == "location"}
    for location in sorted(locations):
        if not (path.parent / location).is_file():
            raise FdppError(f"cannot load {path}: its weights file {path.parent / location} is missing; "
                            "re-export or re-run rewrite")


def print_report(report: CompareReport, stream=None) -> None:
    stream = stream or sys.stdout
    width = max([len(row.output) for row in report.rows] + [6])
    step_width = max([len(row.step) for row in report.rows] + [8])
    print(f"{'step':{step_width}} {'output':{width}} {'max abs err':>12} {'max rel err':>12}  result", file=stream)
    for row in report.rows:
        print(f"{row.step:{step_width}} {row.output:{width}} {row.max_abs:12.3e} {row.max_rel:12.3e}  "
              f"{'PASS' if row.passed else 'FAIL'}", file=stream)
    failed = sum(not row.passed for row in report.rows)
    impls = ", ".join(f"{impl} x{count}" for impl, count in sorted(report.gemm_impls.items())) or "none"
    print(f"attention rows: {report.attention_rows}, exact fallback taken by {report.fallback_rows}; "
          f"FlatGemm calls by Impl: {impls}", file=stream)
    verdict = "PASS" if report.passed else f"FAIL ({failed} of {len(report.rows)} outputs)"
    print(f"{verdict}: tolerance {report.dtype} atol {report.atol:g} rtol {report.rtol:g} "
          "(elementwise |a - b| <= atol or <= rtol * |b|; model_tolerances of the op contracts)", file=stream)


def run(args) -> int:
    from fdpp_rewrite.engine.compare_engine import compare_engine, is_engine_folder

    if is_engine_folder(args.rewritten):  # an engine folder from `build`: its kernels against the original graph
        report = compare_engine(args.original, args.rewritten, batch=args.batch, prefill=args.prefill,
                                seed=args.seed, progress=Progress())
    else:
        report = compare_models(args.original, args.rewritten, batch=args.batch, prefill=args.prefill,
                                seed=args.seed, progress=Progress())
    print_report(report)
    return 0 if report.passed else 1
