"""The inputs `compare` feeds both runners, derived from the original graph's declared interface (the `compare`
command's docstring describes the steps), and the blanking of outputs at padded positions.

Our exporter's graphs: a prefill from empty caches, then a decode step and a chunked step on the caches it wrote.
Hugging Face graphs (hf_graph.py names their interface): a prefill and decode steps on the presents each step
returned, then a left-padded batch. Other graphs: one step of input_ids in the vocabulary and random floats.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.generate import ORT_DTYPES
from fdpp_rewrite.hf_graph import is_hf_interface, past_names, present_name

if TYPE_CHECKING:  # onnx is imported when a comparison runs, not for --help
    import onnx

CACHE_INPUT = re.compile(r"^(key|value)_cache\.(\d+)$")  # our exporter's cache inputs
HF_DECODE_STEPS, HF_PADDED_DECODE_STEPS = 3, 2


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


MIN_BATCH = 2  # sequences with different past_len are part of the check


def check_options(batch: int, prefill: int) -> None:
    """What --batch and --prefill must be whatever the graph (checked before any model is loaded)."""
    if batch < MIN_BATCH:
        raise FdppError(f"--batch must be at least {MIN_BATCH} (sequences with different past_len are part of the "
                        "check)")
    check_prefill(None, prefill)


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


def hf_cache_layout(inputs: list, outputs: list) -> tuple[list, list, np.dtype]:
    """(past input names in layer order, [kv_heads, head_dim], cache dtype) of a decode-with-cache graph, from the
    declared shapes; one-line FdppError when the interface does not fit together."""
    by_name = {i.name: i for i in inputs}
    past = [by_name[name] for name in past_names(by_name)]
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
    cached = bool(past_names(m.name for m in metas))
    pads = np.array([0] + [1 + b % 2 for b in range(1, batch)])
    if prefill <= pads.max():  # every padded sequence keeps a real token
        raise FdppError(f"--prefill must be at least {pads.max() + 1} for the left-padded batch, got {prefill}")
    ids = rng.integers(0, vocab, (batch, prefill))
    full = np.ones((batch, prefill), np.int64)
    padded = (np.arange(prefill)[None, :] >= pads[:, None]).astype(np.int64)
    if not cached:
        return ["prefill", "padded"], [_hf_feed(metas, ids, full, {}), _hf_feed(metas, ids, padded, {})]
    past_inputs, (kv_heads, head_dim), dtype = hf_cache_layout(metas, outputs)
    out_names = [present_name(name) for name in past_inputs]
    names, feeds = [], []
    for label, mask, steps in (("", full, HF_DECODE_STEPS), ("padded-", padded, HF_PADDED_DECODE_STEPS)):
        past = {name: np.zeros((batch, kv_heads, 0, head_dim), dtype) for name in past_inputs}
        step_ids = ids
        for step in range(steps + 1):
            step_name = f"{label}{'prefill' if step == 0 else f'decode{step}'}"
            feed = _hf_feed(metas, step_ids, mask, past)
            names.append(step_name)
            feeds.append(feed)
            past = dict(zip(past_inputs, _run_original(session, out_names, feed, step_name)))
            step_ids = rng.integers(0, vocab, (batch, 1))
            mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
    return names, feeds


def make_steps(session, model: onnx.ModelProto, batch: int, prefill: int, seed: int) -> tuple[list, list]:
    """(step names, feeds) for the original model's interface."""
    check_options(batch, prefill)
    rng = np.random.default_rng(seed)
    names = {i.name for i in session.get_inputs()}
    vocab = vocab_size(model)
    if {"input_ids", "past_len"} <= names and any(CACHE_INPUT.match(n) for n in names):
        if vocab is None:
            raise FdppError("cannot tell the vocabulary size of the original model (no static logits dim)")
        return ["prefill", "decode", "chunk"], exporter_steps(session, vocab, batch, prefill, rng)
    if is_hf_interface(names):
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
