"""Checks of `export` against transformers: a tiny transformers model saved as a checkpoint folder, and the
exported graph's logits over prefill and decode steps (tests/fdpp_rewrite/test_export_families.py and
test_export_hf_families.py)."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from fdpp_rewrite.errors import FdppError


def checkpoint(folder, model_class, config):
    """A transformers model whose every parameter is moved off its init (biases off zero, norms off one, so
    a weight read in the wrong place shows), saved with save_pretrained. Returns the model."""
    torch.manual_seed(0)
    config._attn_implementation = "eager"
    model = model_class(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model.save_pretrained(folder)
    return model


def exported_logits(onnx_path, ids, chunks):
    """Logits [B, S, V] of the exported graph run in onnxruntime over `ids` [B, S] in chunks (prefill, then
    decode steps), each step on the caches the previous one wrote."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    caches = {i.name: np.zeros([ids.shape[0] if d == "batch" else d for d in i.shape], np.float32)
              for i in session.get_inputs() if "cache" in i.name}
    logits, start = [], 0
    for length in chunks:
        feeds = {"input_ids": ids[:, start:start + length].numpy(),
                 "past_len": np.full(ids.shape[0], start, np.int64), **caches}
        outputs = dict(zip(names, session.run(None, feeds)))
        logits.append(outputs["logits"])
        caches = {name: outputs[name.replace("_cache.", "_cache_out.")] for name in caches}
        start += length
    return np.concatenate(logits, axis=1)


def one_line_error(callable_, match):
    """callable_() raises an FdppError matching `match`, in one line."""
    with pytest.raises(FdppError, match=match) as info:
        callable_()
    assert "\n" not in str(info.value)


def edit_config(folder, **changes):
    """Change fields of a checkpoint folder's config.json."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
