"""Presets, loaders (random init, Hugging Face safetensors, GGUF) and their errors."""

import json

import numpy as np
import pytest
import torch
from hf_checkpoints import save_hf_checkpoint, write_checkpoint

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models import PRESETS, get_config, load_model, smollm2_gguf_path
from fdpp_rewrite.models.config import FAMILIES
from fdpp_rewrite.models.gguf_file import config_from_gguf, open_gguf, unpermute_rows
from fdpp_rewrite.models.hf import hf_state_dict
from fdpp_rewrite.models.hf_config import config_from_hf, hf_config_json
from fdpp_rewrite.models.names import parameter_count, weight_shapes

# Published parameter counts (model cards / summing the checkpoints' tensors).
PUBLISHED_PARAMETERS = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "opt-6.7b": 6_658_473_984,
    "chatglm2-6b": 6_243_584_000,
    "smollm2-135m": 134_515_008,
    "llama3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    "gpt2": 124_439_808,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_real_presets_have_the_published_parameter_count(name):
    assert parameter_count(get_config(name)) == PUBLISHED_PARAMETERS[name]


def test_preset_dimensions():
    llama = get_config("llama2-7b")
    assert (llama.num_layers, llama.hidden_size, llama.intermediate_size, llama.num_heads, llama.vocab_size) == \
        (32, 4096, 11008, 32, 32000)
    opt = get_config("opt-6.7b")
    assert (opt.norm, opt.activation, opt.position_offset, opt.max_position, opt.linear_bias) == \
        ("layernorm", "relu", 2, 2048, True)
    glm = get_config("chatglm2-6b")
    assert (glm.num_kv_heads, glm.head_dim, glm.rope_dim, glm.rope_interleaved, glm.qkv_bias, glm.linear_bias) == \
        (2, 128, 64, True, True, False)
    smol = get_config("smollm2-135m")
    assert (smol.num_heads, smol.num_kv_heads, smol.rope_theta, smol.tie_embeddings) == (9, 3, 100000.0, True)


def test_every_family_has_a_tiny_preset():
    tiny = [c for n, c in PRESETS.items() if n.startswith("tiny-")]
    assert {c.family for c in tiny} == set(FAMILIES)
    assert any(c.num_kv_heads < c.num_heads for c in tiny)  # GQA/MQA covered
    assert all(parameter_count(c) < 5_000_000 for c in tiny)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(FdppError, match="unknown preset 'llama3'.*llama2-7b.*tiny-llama"):
        get_config("llama3")
    with pytest.raises(FdppError, match="unknown preset 'gpt5'"):
        load_model("gpt5")


def test_missing_path(tmp_path):
    with pytest.raises(FdppError, match="does not exist"):
        load_model(str(tmp_path / "nothing.gguf"))


def test_random_init_is_seeded_lazy_and_says_so():
    a = load_model("tiny-llama", seed=0)
    b = load_model("tiny-llama", seed=0)
    c = load_model("tiny-llama", seed=1)
    assert a.origin == "random init (seed 0): not trained weights"
    assert a.tokenizer is None
    name = "layers.1.attn.k.weight"
    assert torch.equal(a.weights[name], b.weights[name])
    assert not torch.equal(a.weights[name], c.weights[name])
    assert set(a.weights) == set(weight_shapes(a.config))
    assert abs(a.weights[name].std().item() - 0.02) < 0.002
    assert abs(a.weights["layers.0.attn_norm.weight"].mean().item() - 1.0) < 0.01
    half = load_model("tiny-llama", dtype="float16")
    assert half.weights[name].dtype == torch.float16
    assert torch.allclose(half.weights[name].float(), a.weights[name], atol=1e-4)


def test_layers_override():
    model = load_model("tiny-smollm2", num_layers=1)
    assert model.config.num_layers == 1
    assert "layers.1.attn.q.weight" not in model.weights
    with pytest.raises(FdppError, match="--layers must be positive"):
        load_model("tiny-smollm2", num_layers=0)


def test_bad_dtype():
    with pytest.raises(FdppError, match="unsupported dtype"):
        load_model("tiny-llama", dtype="int8")


# -- GGUF -----------------------------------------------------------------------------------------------------

def _llama_cpp_permute(weight, num_heads):
    """What llama.cpp's converter does to attn_q / attn_k rows (written from its documented behaviour)."""
    rows, cols = weight.shape
    return weight.reshape(num_heads, 2, rows // num_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


@pytest.mark.parametrize("num_heads,head_dim", [(3, 64), (2, 8), (5, 6)])
def test_unpermute_undoes_llama_cpp_row_order(num_heads, head_dim):
    weight = np.random.default_rng(0).standard_normal((num_heads * head_dim, 7)).astype(np.float32)
    permuted = _llama_cpp_permute(weight, num_heads)
    assert not np.array_equal(permuted, weight)
    np.testing.assert_array_equal(unpermute_rows(permuted, num_heads), weight)


def test_smollm2_gguf_matches_the_preset():
    path = smollm2_gguf_path()
    reader, fields = open_gguf(path)
    assert config_from_gguf(fields, path, {t.name for t in reader.tensors}) == get_config("smollm2-135m")


def test_smollm2_preset_loads_trained_weights_and_tokenizer():
    model = load_model("smollm2-135m")
    assert "GGUF file" in model.origin and "Q4_1" in model.origin
    assert model.preset == "smollm2-135m"
    q = model.weights["layers.0.attn.q.weight"]
    assert q.shape == (576, 576) and q.dtype == torch.float32 and 0.01 < q.std().item() < 1
    tok = model.tokenizer
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    ids = tok.encode("Hello world, 2024!")
    assert tok.decode(ids) == "Hello world, 2024!"
    assert [tok.backend.id_to_token(i) for i in tok.encode(" 2024")] == ["Ġ", "2", "0", "2", "4"]  # digits split
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert chat.endswith("<|im_start|>assistant\n")
    assert tok.encode(chat).count(1) == 3  # system, user, assistant: <|im_start|> is one special token
    random = load_model("smollm2-135m", random_init=True)
    assert random.origin.startswith("random init")


def test_unreadable_gguf(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 100)
    with pytest.raises(FdppError, match="cannot read .* as GGUF"):
        load_model(str(junk))
    truncated = tmp_path / "truncated.gguf"
    with open(smollm2_gguf_path(), "rb") as f:
        truncated.write_bytes(f.read(2_000_000))
    with pytest.raises(FdppError, match="cannot read .* as GGUF"):
        load_model(str(truncated))


def test_gguf_of_another_architecture(tmp_path):
    import gguf

    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(FdppError, match="architecture 'gpt2'; supported: llama, gemma3"):
        load_model(str(path))


def test_file_that_is_no_checkpoint(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 64)
    with pytest.raises(FdppError, match="neither a checkpoint directory nor a .gguf"):
        load_model(str(path))


# -- Hugging Face safetensors ----------------------------------------------------------------------------------

CHATGLM_CONFIG = hf_config_json(get_config("tiny-chatglm"))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_config_json_roundtrip(name):
    assert config_from_hf(hf_config_json(get_config(name))) == get_config(name)


def test_save_hf_checkpoint_roundtrip(tmp_path):
    source = load_model("tiny-opt")
    save_hf_checkpoint(source.config, source.weights, tmp_path / "opt", shards=2)
    loaded = load_model(str(tmp_path / "opt"))
    assert loaded.config == source.config
    for name in source.weights:
        assert torch.equal(loaded.weights[name], source.weights[name]), name


def test_chatglm_fused_weights_are_split(tmp_path):
    source = load_model("tiny-chatglm")
    state = hf_state_dict(source.config, source.weights)
    qkv = state["transformer.encoder.layers.1.self_attention.query_key_value.weight"]
    assert qkv.shape == (4 * 128 + 2 * 2 * 128, 512)
    write_checkpoint(tmp_path / "glm", CHATGLM_CONFIG, state, shards=3)
    loaded = load_model(str(tmp_path / "glm"))
    assert loaded.config == source.config
    assert "3 safetensors files" in loaded.origin
    for name in ("layers.1.attn.q.weight", "layers.1.attn.k.weight", "layers.1.attn.v.bias",
                 "layers.0.mlp.gate.weight", "layers.0.mlp.up.weight", "lm_head.weight"):
        assert torch.equal(loaded.weights[name], source.weights[name]), name


def test_old_opt_names_without_model_prefix(tmp_path):
    source = load_model("tiny-opt")
    c = source.config
    state = {k.removeprefix("model."): v for k, v in hf_state_dict(c, source.weights).items()}
    config_json = {"model_type": "opt", "hidden_size": c.hidden_size, "ffn_dim": c.intermediate_size,
                   "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
                   "vocab_size": c.vocab_size, "max_position_embeddings": c.max_position,
                   "word_embed_proj_dim": c.hidden_size}
    write_checkpoint(tmp_path / "opt", config_json, state)
    loaded = load_model(str(tmp_path / "opt"))
    assert loaded.config == c
    assert torch.equal(loaded.weights["pos_embed.weight"], source.weights["pos_embed.weight"])


def test_unsupported_family(tmp_path):
    write_checkpoint(tmp_path / "bloom", {"model_type": "bloom", "n_layer": 2}, {"x": torch.zeros(2)})
    with pytest.raises(FdppError, match="model_type 'bloom' is not supported "
                                        r"\(supported: llama, qwen2, mistral, qwen3, opt, gpt2, chatglm, gemma, "
                                        r"gemma2, gemma3_text, phi3, stablelm, gpt_neox\)"):
        load_model(str(tmp_path / "bloom"))


def test_missing_weight_names(tmp_path):
    source = load_model("tiny-chatglm")
    state = hf_state_dict(source.config, source.weights)
    del state["transformer.encoder.layers.1.mlp.dense_4h_to_h.weight"]
    write_checkpoint(tmp_path / "glm", CHATGLM_CONFIG, state)
    with pytest.raises(FdppError, match="lacks weights transformer.encoder.layers.1.mlp.dense_4h_to_h.weight"):
        load_model(str(tmp_path / "glm"))


def test_truncated_safetensors(tmp_path):
    source = load_model("tiny-chatglm")
    write_checkpoint(tmp_path / "glm", CHATGLM_CONFIG, hf_state_dict(source.config, source.weights))
    shard = next((tmp_path / "glm").glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-1000])
    with pytest.raises(FdppError, match="truncated or corrupt"):
        load_model(str(tmp_path / "glm"))


def test_directory_without_config_or_weights(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FdppError, match="has no config.json"):
        load_model(str(tmp_path / "empty"))
    (tmp_path / "empty" / "config.json").write_text("{not json")
    with pytest.raises(FdppError, match="not valid JSON"):
        load_model(str(tmp_path / "empty"))
    (tmp_path / "empty" / "config.json").write_text(json.dumps(CHATGLM_CONFIG))
    with pytest.raises(FdppError, match="no \\*.safetensors files"):
        load_model(str(tmp_path / "empty"))
