"""`export` of Hugging Face checkpoints of each family, written by transformers itself (its config classes and
save_pretrained): the exported graph gives transformers' logits in float32, through prefill and decode steps on
its own caches, and its rewrite passes `compare`. The refusals are one line naming what is supported."""

import io
import json

import numpy as np
import pytest
import torch
from export_checks import checkpoint, edit_config, exported_logits, one_line_error

from fdpp_rewrite.compare_onnx import compare_models
from fdpp_rewrite.export import export_model
from fdpp_rewrite.models import load_model
from fdpp_rewrite.rewrite import rewrite_file

transformers = pytest.importorskip("transformers")

VOCAB = 211
MAX_CACHE = 32
# Llama 3.1's scaling with a short original context, so that head_dim 64's wavelengths fall in all three bands.
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 500000.0}


def _llama(rope=None):
    rope = rope or {"rope_type": "default", "rope_theta": 10000.0}
    return transformers.LlamaForCausalLM, transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=128, rope_parameters=rope)


def _qwen2():
    # Qwen2 derives head_dim from hidden_size: 2 heads of 64
    return transformers.Qwen2ForCausalLM, transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, rope_parameters={"rope_type": "default",
                                                                              "rope_theta": 1000000.0})


def _mistral(window=64):
    return transformers.MistralForCausalLM, transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=128, sliding_window=window)


def _gpt2(activation="gelu_new"):
    return transformers.GPT2LMHeadModel, transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=128, n_layer=2, n_head=2, n_inner=96, n_positions=128,
        activation_function=activation)


ARCHITECTURES = {
    "qwen2": (_qwen2, "qwen2"),
    "mistral": (_mistral, "mistral"),
    "llama3": (lambda: _llama(LLAMA3_ROPE), "llama"),
    "llama-linear": (lambda: _llama({"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}), "llama"),
    "llama-dynamic": (lambda: _llama({"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}), "llama"),
    "gpt2": (_gpt2, "gpt2"),
}


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_checkpoint_exports_to_transformers_logits_and_rewrites(tmp_path, architecture):
    make, family = ARCHITECTURES[architecture]
    model_class, config = make()
    hf = checkpoint(tmp_path / "ckpt", model_class, config)
    result = export_model(str(tmp_path / "ckpt"), tmp_path / "model.onnx", dtype="float32", max_cache=MAX_CACHE,
                          progress=False)
    assert json.loads(result.metadata_path.read_text())["config"]["family"] == family

    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(ids).logits.numpy()
    got = exported_logits(result.onnx_path, ids, [6, 1, 2])
    assert np.abs(expected).max() > 0.5
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)

    output = rewrite_file(result.onnx_path, stream=io.StringIO())
    report = compare_models(result.onnx_path, output)
    assert report.passed, [(row.output, row.max_abs) for row in report.rows]


@pytest.mark.parametrize("rope, differs", [(LLAMA3_ROPE, True),
                                           ({"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}, True),
                                           ({"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}, False)])
def test_rope_scaling_is_what_changes_the_logits(tmp_path, rope, differs):
    """The scaled checkpoints above match transformers for the right reason: plain RoPE on the same weights gives
    other logits (llama3, linear); dynamic NTK is plain RoPE within max_position_embeddings, where exports stop."""
    model_class, config = _llama(rope)
    scaled = checkpoint(tmp_path / "ckpt", model_class, config)
    plain = model_class(_llama()[1]).eval()
    plain.load_state_dict(scaled.state_dict())
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        gap = (scaled(ids).logits - plain(ids).logits).abs().max().item()
    assert (gap > 1e-3) if differs else (gap < 1e-5), gap
    loaded = load_model(str(tmp_path / "ckpt")).config
    assert (loaded.rope_type, loaded.rope_factor, loaded.max_position) == (rope["rope_type"], rope["factor"], 128)


def test_mistral_beyond_its_window_is_refused(tmp_path):
    checkpoint(tmp_path / "ckpt", *_mistral(window=48))
    assert load_model(str(tmp_path / "ckpt")).config.max_position == 48  # max_position_embeddings 128, cut
    for max_cache in (49, 0):
        one_line_error(lambda: export_model(str(tmp_path / "ckpt"), tmp_path / "m.onnx", dtype="float32",
                                             max_cache=max_cache, progress=False),
                        "sliding window of 48 tokens, which the exported graph does not mask")
    result = export_model(str(tmp_path / "ckpt"), tmp_path / "m.onnx", dtype="float32", progress=False)
    assert json.loads(result.metadata_path.read_text())["max_cache"] == 48  # the default stays inside


def test_dynamic_rope_beyond_max_position_is_refused(tmp_path):
    checkpoint(tmp_path / "ckpt", *_llama({"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}))
    one_line_error(lambda: export_model(str(tmp_path / "ckpt"), tmp_path / "m.onnx", max_cache=129,
                                         progress=False),
                    r"exceeds the 128 positions .*dynamic NTK RoPE is plain RoPE up to 128 positions")


def test_unsupported_rope_type_and_activation_name_the_supported_ones(tmp_path):
    checkpoint(tmp_path / "llama", *_llama())
    edit_config(tmp_path / "llama", rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})
    one_line_error(lambda: load_model(str(tmp_path / "llama")),
                    r"rope scaling type 'yarn' is not supported \(supported: default, linear, llama3, dynamic\)")
    edit_config(tmp_path / "llama", rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4})
    one_line_error(lambda: load_model(str(tmp_path / "llama")), "llama3 rope scaling lacks 'low_freq_factor'")
    edit_config(tmp_path / "llama", rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                      "partial_rotary_factor": 0.5})
    one_line_error(lambda: load_model(str(tmp_path / "llama")), "partial_rotary_factor 0.5 is not supported")

    checkpoint(tmp_path / "gpt2", *_gpt2())
    edit_config(tmp_path / "gpt2", activation_function="relu")
    one_line_error(lambda: load_model(str(tmp_path / "gpt2")),
                    r"activation_function 'relu' is not supported \(supported: gelu_new, gelu_pytorch_tanh\)")


def test_gpt2_checkpoint_without_the_transformer_prefix(tmp_path):
    """The original gpt2 files were saved from GPT2Model: 'h.0.attn.c_attn.weight', 'wte.weight'."""
    from safetensors.torch import load_file, save_file

    hf = checkpoint(tmp_path / "ckpt", *_gpt2())
    (shard,) = (tmp_path / "ckpt").glob("*.safetensors")
    state = load_file(str(shard))
    save_file({name.removeprefix("transformer."): tensor for name, tensor in state.items()}, str(shard))
    model = load_model(str(tmp_path / "ckpt"))
    c_attn = hf.transformer.h[1].attn.c_attn.weight  # Conv1D: [in, out], q | k | v along out
    assert torch.equal(model.weights["layers.1.attn.k.weight"], c_attn[:, 128:256].T)
    assert torch.equal(model.weights["pos_embed.weight"], hf.transformer.wpe.weight)
