"""The reference model against Hugging Face transformers (weights copied across through our name maps), and its
own KV-cache bookkeeping."""

import pytest
import torch
from fdpp_rewrite.models import get_config, load_model
from fdpp_rewrite.models.hf import hf_state_dict
from fdpp_rewrite.models.hf_config import hf_config_json
from fdpp_rewrite.models.reference import ReferenceModel

transformers = pytest.importorskip("transformers")


def _hf_llama(config):
    hf_config = transformers.LlamaConfig(
        hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim, vocab_size=config.vocab_size,
        max_position_embeddings=config.max_position, rms_norm_eps=config.norm_eps, rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_embeddings)
    return transformers.LlamaForCausalLM(hf_config)


def _hf_opt(config):
    hf_config = transformers.OPTConfig(
        hidden_size=config.hidden_size, ffn_dim=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, vocab_size=config.vocab_size,
        max_position_embeddings=config.max_position, word_embed_proj_dim=config.hidden_size, dropout=0.0)
    return transformers.OPTForCausalLM(hf_config)


def _hf_glm(config):
    """transformers' GLM-4 model has ChatGLM2's layer: fused gate_up, qkv bias, RoPE on half of each head in
    interleaved pairs. Our chatglm weights map onto it by name."""
    hf_config = transformers.GlmConfig(
        hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim, vocab_size=config.vocab_size,
        max_position_embeddings=config.max_position, rms_norm_eps=config.norm_eps, attention_bias=True,
        partial_rotary_factor=config.rotary_dim / config.head_dim, rope_theta=config.rope_theta,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.GlmForCausalLM(hf_config)


def _hf_from_config_json(config):
    """transformers' own model class for the config.json our hf_config_json writes (eager attention: the plain
    softmax our reference computes)."""
    data = hf_config_json(config)
    hf_config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    return transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")


def _glm_state(model):
    state = {}
    for i in range(model.config.num_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        for ours, theirs in (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")):
            state[h + theirs + ".weight"] = model.weights[p + ours + ".weight"]
        for x in "qkv":
            state[h + f"self_attn.{x}_proj.weight"] = model.weights[p + f"attn.{x}.weight"]
            state[h + f"self_attn.{x}_proj.bias"] = model.weights[p + f"attn.{x}.bias"]
        state[h + "self_attn.o_proj.weight"] = model.weights[p + "attn.o.weight"]
        state[h + "mlp.gate_up_proj.weight"] = torch.cat([model.weights[p + "mlp.gate.weight"],
                                                          model.weights[p + "mlp.up.weight"]])
        state[h + "mlp.down_proj.weight"] = model.weights[p + "mlp.down.weight"]
    state["model.embed_tokens.weight"] = model.weights["embed.weight"]
    state["model.norm.weight"] = model.weights["final_norm.weight"]
    state["lm_head.weight"] = model.weights["lm_head.weight"]
    return state


@pytest.mark.parametrize("preset,make_hf,state_of", [
    ("tiny-llama", _hf_llama, lambda m: hf_state_dict(m.config, m.weights)),
    ("tiny-smollm2", _hf_llama, lambda m: hf_state_dict(m.config, m.weights)),
    ("tiny-opt", _hf_opt, lambda m: hf_state_dict(m.config, m.weights)),
    ("tiny-chatglm", _hf_glm, _glm_state),
    ("tiny-llama3", _hf_from_config_json, lambda m: hf_state_dict(m.config, m.weights)),
    ("tiny-qwen2", _hf_from_config_json, lambda m: hf_state_dict(m.config, m.weights)),
    ("tiny-mistral", _hf_from_config_json, lambda m: hf_state_dict(m.config, m.weights)),
    ("tiny-gpt2", _hf_from_config_json, lambda m: hf_state_dict(m.config, m.weights)),
])
def test_reference_matches_transformers(preset, make_hf, state_of):
    model = load_model(preset)
    hf = make_hf(model.config).eval()
    missing, unexpected = hf.load_state_dict(state_of(model), strict=False)
    assert unexpected == []
    assert set(missing) <= {"lm_head.weight"} and (not missing or model.config.tie_embeddings)
    ids = torch.randint(0, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
    reference = ReferenceModel(model.config, model.weights)
    got = reference(ids, torch.zeros(3, dtype=torch.long), reference.new_caches(3, 16))
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_sliding_window_masks_like_transformers():
    """The reference's window rule is Mistral's: a query sees the `window` latest keys, itself included. (Exports
    never reach the window, see config.py; this checks the rule the reference holds them to.)"""
    from dataclasses import replace

    config = replace(get_config("tiny-mistral"), sliding_window=4, max_position=4)
    model = load_model("tiny-mistral")
    hf = _hf_from_config_json(config).eval()
    hf.load_state_dict(hf_state_dict(config, model.weights))
    ids = torch.randint(0, config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = hf(ids).logits
    reference = ReferenceModel(config, model.weights)
    got = reference(ids, torch.zeros(2, dtype=torch.long), reference.new_caches(2, 12))
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    unwindowed = ReferenceModel(get_config("tiny-mistral"), model.weights)
    full = unwindowed(ids, torch.zeros(2, dtype=torch.long), unwindowed.new_caches(2, 12))
    torch.testing.assert_close(full[:, :4], got[:, :4], atol=1e-5, rtol=1e-5)  # within the window: the same
    assert (full[:, 4:] - got[:, 4:]).abs().max() > 1e-3  # beyond it the window changes the logits


def test_llama_checkpoint_written_by_transformers_loads_back(tmp_path):
    """save_pretrained (sharded safetensors) -> load_model -> same logits as transformers."""
    torch.manual_seed(0)
    hf = _hf_llama(load_model("tiny-llama").config).eval()
    hf.save_pretrained(tmp_path / "ckpt", max_shard_size="300KB")
    assert len(list((tmp_path / "ckpt").glob("*.safetensors"))) > 1
    model = load_model(str(tmp_path / "ckpt"))
    assert model.config == get_config("tiny-llama")
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(ids).logits
    reference = ReferenceModel(model.config, model.weights)
    torch.testing.assert_close(reference(ids, torch.zeros(2, dtype=torch.long), reference.new_caches(2, 12)),
                               expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("preset", ["tiny-smollm2", "tiny-opt", "tiny-chatglm", "tiny-gpt2"])
def test_incremental_decoding_equals_one_prefill(preset):
    """Chunked prefill + decode steps through the cache give the same logits as one pass over all tokens,
    also with a different past_len per sequence."""
    model = load_model(preset)
    reference = ReferenceModel(model.config, model.weights)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    full = reference(ids, torch.zeros(2, dtype=torch.long), reference.new_caches(2, 20))

    caches = reference.new_caches(2, 20)
    first = reference(ids[:, :6], torch.tensor([0, 0]), caches)
    torch.testing.assert_close(first, full[:, :6], atol=1e-5, rtol=1e-5)
    for t in range(6, 9):
        step = reference(ids[:, t:t + 1], torch.tensor([t, t]), caches)
        torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-5, rtol=1e-5)

    # sequence 1 starts 3 tokens later: its cache rows 0..2 hold its own first tokens
    ragged = reference.new_caches(2, 20)
    reference(ids[1:, :3], torch.tensor([0]), [(k[1:], v[1:]) for k, v in ragged])
    out = reference(torch.stack([ids[0, :4], ids[1, 3:7]]), torch.tensor([0, 3]), ragged)
    torch.testing.assert_close(out[0], full[0, :4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1], full[1, 3:7], atol=1e-5, rtol=1e-5)


def test_score_hook_sees_scaled_scores_before_the_mask():
    model = load_model("tiny-smollm2")
    reference = ReferenceModel(model.config, model.weights)
    seen = []
    ids = torch.tensor([[5, 6, 7]])
    reference(ids, torch.tensor([2]), reference.new_caches(1, 8),
              score_hook=lambda layer, scores, mask: seen.append((layer, scores.clone(), mask.clone())))
    assert [layer for layer, _, _ in seen] == [0, 1, 2]
    layer, scores, mask = seen[0]
    assert scores.shape == (1, 3, 3, 8) and mask.shape == (1, 1, 3, 8)
    visible = mask[0, 0] == 0
    assert visible.tolist() == [[j <= 2 + i for j in range(8)] for i in range(3)]
    assert torch.isfinite(scores).all()


def test_cache_too_small_is_an_error():
    from fdpp_rewrite.errors import FdppError

    model = load_model("tiny-llama")
    reference = ReferenceModel(model.config, model.weights)
    with pytest.raises(FdppError, match="do not fit a cache of 4"):
        reference(torch.tensor([[1, 2, 3]]), torch.tensor([2]), reference.new_caches(1, 4))
