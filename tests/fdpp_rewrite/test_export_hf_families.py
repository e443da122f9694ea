"""`export` of Hugging Face checkpoints of the families issue 41 adds (Gemma 1/2/3, Phi-3, Qwen3, StableLM,
GPT-NeoX), each a tiny transformers model saved with save_pretrained: the exported graph gives transformers' own
logits in float32 through a prefill and decode steps on its caches, with sequences longer than the sliding windows
(so the masked windows, the soft caps, the local rope base and the parallel residual all take part), and the
rewrite of each passes `compare`."""

import io
import json
import re

import numpy as np
import pytest
import torch
from export_checks import checkpoint, edit_config, exported_logits, one_line_error

from fdpp_rewrite.compare_onnx import compare_models
from fdpp_rewrite.export import export_model
from fdpp_rewrite.models import load_model
from fdpp_rewrite.models.hf import hf_state_dict
from fdpp_rewrite.models.hf_config import CONFIG_READERS
from fdpp_rewrite.rewrite import rewrite_file

transformers = pytest.importorskip("transformers")

VOCAB = 211
MAX_CACHE = 32
CHUNKS = [8, 1, 2, 2]  # a prefill, then decode steps: 13 tokens, past every window below
WINDOW = 4


def _gemma():
    return transformers.GemmaForCausalLM, transformers.GemmaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=128)


def _gemma2():
    # caps small enough to bend the scores and logits of a tiny model
    return transformers.Gemma2ForCausalLM, transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=128, sliding_window=WINDOW,
        query_pre_attn_scalar=48, attn_logit_softcapping=3.0, final_logit_softcapping=2.0)


def _gemma3():
    return transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=128, sliding_window=WINDOW,
        query_pre_attn_scalar=48, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})


def _phi3():
    # hidden 192 over 2 heads: Phi-3-mini's head_dim 96; fused qkv with GQA
    return transformers.Phi3ForCausalLM, transformers.Phi3Config(
        vocab_size=VOCAB, hidden_size=192, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, sliding_window=WINDOW + 1, pad_token_id=0,
        eos_token_id=1, bos_token_id=2)


def _qwen3():
    return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=128, max_position_embeddings=128)


def _stablelm():
    return transformers.StableLmForCausalLM, transformers.StableLmConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, use_qkv_bias=True)


def _gpt_neox(parallel=True, act="gelu"):
    return transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=128, use_parallel_residual=parallel, hidden_act=act)


ARCHITECTURES = {
    "gemma": (_gemma, "gemma"),
    "gemma2": (_gemma2, "gemma2"),
    "gemma3": (_gemma3, "gemma3"),
    "phi3": (_phi3, "phi3"),
    "qwen3": (_qwen3, "qwen3"),
    "stablelm": (_stablelm, "stablelm"),
    "gpt_neox": (_gpt_neox, "gpt_neox"),
    "gpt_neox-sequential": (lambda: _gpt_neox(parallel=False, act="gelu_new"), "gpt_neox"),
}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def exported(request, tmp_path_factory):
    """(architecture, transformers model, ExportResult), one export per architecture for the whole module."""
    make, _ = ARCHITECTURES[request.param]
    folder = tmp_path_factory.mktemp(request.param.replace("_", "-"))
    hf = checkpoint(folder / "ckpt", *make())
    result = export_model(str(folder / "ckpt"), folder / "model.onnx", dtype="float32", max_cache=MAX_CACHE,
                          progress=False)
    return request.param, hf, result


def test_exports_give_transformers_logits_through_prefill_and_decode(exported):
    architecture, hf, result = exported
    metadata = json.loads(result.metadata_path.read_text())
    assert metadata["config"]["family"] == ARCHITECTURES[architecture][1]
    ids = torch.randint(0, VOCAB, (2, sum(CHUNKS)), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(ids).logits.numpy()
    got = exported_logits(result.onnx_path, ids, CHUNKS)
    assert np.abs(expected).max() > 0.5
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_rewrite_replaces_every_attention_and_gemm_and_passes_compare(exported):
    """Head sizes 256 (gemma), 96 (phi3) and 128 (qwen3), soft caps and sliding windows (a bias mask): the kernels
    serve them all since contract 4."""
    _, _, result = exported
    stream = io.StringIO()
    output = rewrite_file(result.onnx_path, stream=stream, require=("attention", "gemm"))
    assert re.search(r"^gemm: \d+ replaced, 0 left$", stream.getvalue(), re.M), stream.getvalue()
    assert re.search(r"^attention: [1-9]\d* replaced, 0 left$", stream.getvalue(), re.M), stream.getvalue()
    report = compare_models(result.onnx_path, output)
    assert report.passed, [(row.output, row.max_abs) for row in report.rows]


def test_each_feature_is_read_from_the_config():
    """What the tiny checkpoints above turn into (so that a match is for the right reason)."""
    cases = {
        "gemma": dict(activation="geglu", scale_embeddings=True, tie_embeddings=True, head_dim=256, layer_types=()),
        "gemma2": dict(post_norms=True, attn_softcap=3.0, final_softcap=2.0, attn_scale=48 ** -0.5,
                       layer_types=("sliding_attention", "full_attention"), sliding_window=WINDOW),
        "gemma3": dict(qk_norm=True, rope_theta=1e6, rope_local_theta=1e4, attn_softcap=0.0, post_norms=True),
        "phi3": dict(head_dim=96, num_kv_heads=1, layer_types=("sliding_attention",) * 2, sliding_window=WINDOW + 1),
        "qwen3": dict(qk_norm=True, head_dim=128, qkv_bias=False),
        "stablelm": dict(norm="layernorm", rotary_dim=16, qkv_bias=True, linear_bias=False),
        "gpt_neox": dict(parallel_residual=True, activation="gelu", rotary_dim=16, linear_bias=True),
    }
    for name, expected in cases.items():
        _, config = ARCHITECTURES[name][0]()
        from fdpp_rewrite.models.hf_config import config_from_hf

        ours = config_from_hf(config.to_dict())
        assert {key: getattr(ours, key) for key in expected} == expected, name


@pytest.mark.parametrize("architecture", ["gemma2", "gpt_neox"])
def test_checkpoint_names_roundtrip(tmp_path, architecture):
    """hf_state_dict inverts the loader: Gemma's 1 + weight norms and GPT-NeoX's per-head fused qkv."""
    from safetensors.torch import load_file

    checkpoint(tmp_path, *ARCHITECTURES[architecture][0]())
    loaded = load_model(str(tmp_path))
    state = hf_state_dict(loaded.config, loaded.weights)
    original = load_file(str(tmp_path / "model.safetensors"))  # the names on disk (transformers renames some)
    assert set(state) == set(original)
    for name, tensor in state.items():
        torch.testing.assert_close(tensor, original[name], rtol=0, atol=1e-6, msg=name)


def test_unsupported_variants_are_one_line_errors(tmp_path):
    checkpoint(tmp_path / "ckpt", *_stablelm())
    edit_config(tmp_path / "ckpt", qk_layernorm=True)
    one_line_error(lambda: load_model(str(tmp_path / "ckpt")), "per-head q/k LayerNorm")
    edit_config(tmp_path / "ckpt", model_type="falcon_mamba")
    one_line_error(lambda: load_model(str(tmp_path / "ckpt")),
                    r"model_type 'falcon_mamba' is not supported \(supported: .*gemma3_text.*gpt_neox")
    assert {"gemma", "gemma2", "gemma3_text", "phi3", "qwen3", "stablelm", "gpt_neox"} <= set(CONFIG_READERS)
