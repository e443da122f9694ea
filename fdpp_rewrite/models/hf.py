"""Hugging Face checkpoints: a directory with config.json and *.safetensors (one file or shards).

One declarative table per family maps checkpoint names to ours. A tuple on the right means the checkpoint
stores those tensors concatenated along dim 0 (ChatGLM2's fused query_key_value and dense_h_to_4h); the split
sizes come from our shapes. Names in a family's TRANSPOSED set are stored [in_features, out_features] (GPT-2's
Conv1D) and are transposed as they are read, before any split."""

import json
from pathlib import Path

import torch

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models.config import ROPE_TYPES, ModelConfig
from fdpp_rewrite.models.names import weight_shapes
from fdpp_rewrite.models.weights import Weights

LLAMA_NAMES = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{i}.input_layernorm.weight": "layers.{i}.attn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "layers.{i}.attn.q.weight",
    "model.layers.{i}.self_attn.q_proj.bias": "layers.{i}.attn.q.bias",
    "model.layers.{i}.self_attn.k_proj.weight": "layers.{i}.attn.k.weight",
    "model.layers.{i}.self_attn.k_proj.bias": "layers.{i}.attn.k.bias",
    "model.layers.{i}.self_attn.v_proj.weight": "layers.{i}.attn.v.weight",
    "model.layers.{i}.self_attn.v_proj.bias": "layers.{i}.attn.v.bias",
    "model.layers.{i}.self_attn.o_proj.weight": "layers.{i}.attn.o.weight",
    "model.layers.{i}.self_attn.o_proj.bias": "layers.{i}.attn.o.bias",
    "model.layers.{i}.post_attention_layernorm.weight": "layers.{i}.mlp_norm.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "layers.{i}.mlp.gate.weight",
    "model.layers.{i}.mlp.gate_proj.bias": "layers.{i}.mlp.gate.bias",
    "model.layers.{i}.mlp.up_proj.weight": "layers.{i}.mlp.up.weight",
    "model.layers.{i}.mlp.up_proj.bias": "layers.{i}.mlp.up.bias",
    "model.layers.{i}.mlp.down_proj.weight": "layers.{i}.mlp.down.weight",
    "model.layers.{i}.mlp.down_proj.bias": "layers.{i}.mlp.down.bias",
    "model.norm.weight": "final_norm.weight",
    "lm_head.weight": "lm_head.weight",
}

OPT_NAMES = {
    "model.decoder.embed_tokens.weight": "embed.weight",
    "model.decoder.embed_positions.weight": "pos_embed.weight",
    "model.decoder.layers.{i}.self_attn_layer_norm.weight": "layers.{i}.attn_norm.weight",
    "model.decoder.layers.{i}.self_attn_layer_norm.bias": "layers.{i}.attn_norm.bias",
    "model.decoder.layers.{i}.self_attn.q_proj.weight": "layers.{i}.attn.q.weight",
    "model.decoder.layers.{i}.self_attn.q_proj.bias": "layers.{i}.attn.q.bias",
    "model.decoder.layers.{i}.self_attn.k_proj.weight": "layers.{i}.attn.k.weight",
    "model.decoder.layers.{i}.self_attn.k_proj.bias": "layers.{i}.attn.k.bias",
    "model.decoder.layers.{i}.self_attn.v_proj.weight": "layers.{i}.attn.v.weight",
    "model.decoder.layers.{i}.self_attn.v_proj.bias": "layers.{i}.attn.v.bias",
    "model.decoder.layers.{i}.self_attn.out_proj.weight": "layers.{i}.attn.o.weight",
    "model.decoder.layers.{i}.self_attn.out_proj.bias": "layers.{i}.attn.o.bias",
    # OPT calls the norm before the MLP "final_layer_norm" inside each layer
    "model.decoder.layers.{i}.final_layer_norm.weight": "layers.{i}.mlp_norm.weight",
    "model.decoder.layers.{i}.final_layer_norm.bias": "layers.{i}.mlp_norm.bias",
    "model.decoder.layers.{i}.fc1.weight": "layers.{i}.mlp.up.weight",
    "model.decoder.layers.{i}.fc1.bias": "layers.{i}.mlp.up.bias",
    "model.decoder.layers.{i}.fc2.weight": "layers.{i}.mlp.down.weight",
    "model.decoder.layers.{i}.fc2.bias": "layers.{i}.mlp.down.bias",
    "model.decoder.final_layer_norm.weight": "final_norm.weight",
    "model.decoder.final_layer_norm.bias": "final_norm.bias",
    "lm_head.weight": "lm_head.weight",
}

CHATGLM_NAMES = {
    "transformer.embedding.word_embeddings.weight": "embed.weight",
    "transformer.encoder.layers.{i}.input_layernorm.weight": "layers.{i}.attn_norm.weight",
    "transformer.encoder.layers.{i}.self_attention.query_key_value.weight":
        ("layers.{i}.attn.q.weight", "layers.{i}.attn.k.weight", "layers.{i}.attn.v.weight"),
    "transformer.encoder.layers.{i}.self_attention.query_key_value.bias":
        ("layers.{i}.attn.q.bias", "layers.{i}.attn.k.bias", "layers.{i}.attn.v.bias"),
    "transformer.encoder.layers.{i}.self_attention.dense.weight": "layers.{i}.attn.o.weight",
    "transformer.encoder.layers.{i}.post_attention_layernorm.weight": "layers.{i}.mlp_norm.weight",
    # SwiGLU: the first half of dense_h_to_4h is the gate, the second half the up projection
    "transformer.encoder.layers.{i}.mlp.dense_h_to_4h.weight":
        ("layers.{i}.mlp.gate.weight", "layers.{i}.mlp.up.weight"),
    "transformer.encoder.layers.{i}.mlp.dense_4h_to_h.weight": "layers.{i}.mlp.down.weight",
    "transformer.encoder.final_layernorm.weight": "final_norm.weight",
    "transformer.output_layer.weight": "lm_head.weight",
}

GPT2_NAMES = {
    "transformer.wte.weight": "embed.weight",
    "transformer.wpe.weight": "pos_embed.weight",
    "transformer.h.{i}.ln_1.weight": "layers.{i}.attn_norm.weight",
    "transformer.h.{i}.ln_1.bias": "layers.{i}.attn_norm.bias",
    "transformer.h.{i}.attn.c_attn.weight": ("layers.{i}.attn.q.weight", "layers.{i}.attn.k.weight",
                                             "layers.{i}.attn.v.weight"),
    "transformer.h.{i}.attn.c_attn.bias": ("layers.{i}.attn.q.bias", "layers.{i}.attn.k.bias",
                                           "layers.{i}.attn.v.bias"),
    "transformer.h.{i}.attn.c_proj.weight": "layers.{i}.attn.o.weight",
    "transformer.h.{i}.attn.c_proj.bias": "layers.{i}.attn.o.bias",
    "transformer.h.{i}.ln_2.weight": "layers.{i}.mlp_norm.weight",
    "transformer.h.{i}.ln_2.bias": "layers.{i}.mlp_norm.bias",
    "transformer.h.{i}.mlp.c_fc.weight": "layers.{i}.mlp.up.weight",
    "transformer.h.{i}.mlp.c_fc.bias": "layers.{i}.mlp.up.bias",
    "transformer.h.{i}.mlp.c_proj.weight": "layers.{i}.mlp.down.weight",
    "transformer.h.{i}.mlp.c_proj.bias": "layers.{i}.mlp.down.bias",
    "transformer.ln_f.weight": "final_norm.weight",
    "transformer.ln_f.bias": "final_norm.bias",
    "lm_head.weight": "lm_head.weight",  # absent from GPT-2 checkpoints: tied to wte
}

# Llama's names and, per head, RMSNorm of q and k (qwen3, gemma3; dropped by configs without qk_norm) and
# LayerNorm biases (stablelm; dropped for RMSNorm).
LLAMA_LIKE_NAMES = {
    **LLAMA_NAMES,
    "model.layers.{i}.self_attn.q_norm.weight": "layers.{i}.attn.q_norm.weight",
    "model.layers.{i}.self_attn.k_norm.weight": "layers.{i}.attn.k_norm.weight",
    "model.layers.{i}.input_layernorm.bias": "layers.{i}.attn_norm.bias",
    "model.layers.{i}.post_attention_layernorm.bias": "layers.{i}.mlp_norm.bias",
    "model.norm.bias": "final_norm.bias",
}

# Gemma 2 and 3: "post_attention_layernorm" is the norm on the attention's output, the MLP has a norm on each side.
GEMMA2_NAMES = {
    **LLAMA_LIKE_NAMES,
    "model.layers.{i}.post_attention_layernorm.weight": "layers.{i}.attn_post_norm.weight",
    "model.layers.{i}.pre_feedforward_layernorm.weight": "layers.{i}.mlp_norm.weight",
    "model.layers.{i}.post_feedforward_layernorm.weight": "layers.{i}.mlp_post_norm.weight",
}

PHI3_NAMES = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{i}.input_layernorm.weight": "layers.{i}.attn_norm.weight",
    "model.layers.{i}.self_attn.qkv_proj.weight": ("layers.{i}.attn.q.weight", "layers.{i}.attn.k.weight",
                                                   "layers.{i}.attn.v.weight"),
    "model.layers.{i}.self_attn.o_proj.weight": "layers.{i}.attn.o.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "layers.{i}.mlp_norm.weight",
    "model.layers.{i}.mlp.gate_up_proj.weight": ("layers.{i}.mlp.gate.weight", "layers.{i}.mlp.up.weight"),
    "model.layers.{i}.mlp.down_proj.weight": "layers.{i}.mlp.down.weight",
    "model.norm.weight": "final_norm.weight",
    "lm_head.weight": "lm_head.weight",
}

GPT_NEOX_NAMES = {
    "gpt_neox.embed_in.weight": "embed.weight",
    "gpt_neox.layers.{i}.input_layernorm.weight": "layers.{i}.attn_norm.weight",
    "gpt_neox.layers.{i}.input_layernorm.bias": "layers.{i}.attn_norm.bias",
    "gpt_neox.layers.{i}.attention.query_key_value.weight": ("layers.{i}.attn.q.weight", "layers.{i}.attn.k.weight",
                                                             "layers.{i}.attn.v.weight"),
    "gpt_neox.layers.{i}.attention.query_key_value.bias": ("layers.{i}.attn.q.bias", "layers.{i}.attn.k.bias",
                                                           "layers.{i}.attn.v.bias"),
    "gpt_neox.layers.{i}.attention.dense.weight": "layers.{i}.attn.o.weight",
    "gpt_neox.layers.{i}.attention.dense.bias": "layers.{i}.attn.o.bias",
    "gpt_neox.layers.{i}.post_attention_layernorm.weight": "layers.{i}.mlp_norm.weight",
    "gpt_neox.layers.{i}.post_attention_layernorm.bias": "layers.{i}.mlp_norm.bias",
    "gpt_neox.layers.{i}.mlp.dense_h_to_4h.weight": "layers.{i}.mlp.up.weight",
    "gpt_neox.layers.{i}.mlp.dense_h_to_4h.bias": "layers.{i}.mlp.up.bias",
    "gpt_neox.layers.{i}.mlp.dense_4h_to_h.weight": "layers.{i}.mlp.down.weight",
    "gpt_neox.layers.{i}.mlp.dense_4h_to_h.bias": "layers.{i}.mlp.down.bias",
    "gpt_neox.final_layer_norm.weight": "final_norm.weight",
    "gpt_neox.final_layer_norm.bias": "final_norm.bias",
    "embed_out.weight": "lm_head.weight",
}

# Qwen2 and Mistral checkpoints use Llama's names (Qwen2 adds the q/k/v biases, which LLAMA_NAMES has).
NAME_MAPS = {"llama": LLAMA_NAMES, "qwen2": LLAMA_NAMES, "mistral": LLAMA_NAMES, "opt": OPT_NAMES,
             "gpt2": GPT2_NAMES, "chatglm": CHATGLM_NAMES, "gemma": LLAMA_NAMES, "gemma2": GEMMA2_NAMES,
             "gemma3": GEMMA2_NAMES, "phi3": PHI3_NAMES, "qwen3": LLAMA_LIKE_NAMES, "stablelm": LLAMA_LIKE_NAMES,
             "gpt_neox": GPT_NEOX_NAMES}

# GPT-NeoX's fused query_key_value holds, per head, that head's q, k and v rows ([H, 3, D] along dim 0).
HEAD_INTERLEAVED = {"gpt_neox": {"gpt_neox.layers.{i}.attention.query_key_value.weight",
                                 "gpt_neox.layers.{i}.attention.query_key_value.bias"}}

# Gemma's RMSNorm scales by (1 + weight); we store the scale (config.py).
NORM_PLUS_ONE = ("gemma", "gemma2", "gemma3")

# GPT-2's Conv1D layers store their weight as [in_features, out_features].
TRANSPOSED = {"gpt2": {"transformer.h.{i}.attn.c_attn.weight", "transformer.h.{i}.attn.c_proj.weight",
                       "transformer.h.{i}.mlp.c_fc.weight", "transformer.h.{i}.mlp.c_proj.weight"}}

KEY_ALIASES = {
    # Older OPT checkpoints (facebook/opt-*) were saved from OPTModel: "decoder.layers..." without "model.".
    "opt": [("decoder.", "model.decoder.")],
    # The original gpt2 checkpoints were saved from GPT2Model: "h.0...", "wte.weight" without "transformer.".
    "gpt2": [(prefix, "transformer." + prefix) for prefix in ("wte.", "wpe.", "h.", "ln_f.")],
}


def expand_name_map(config: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Checkpoint name -> the canonical names it holds (in concatenation order), for this config only:
    entries whose canonical names the config does not use (biases it has not, a tied lm_head) drop out."""
    needed = weight_shapes(config)
    expanded = {}
    for hf_pattern, ours in NAME_MAPS[config.family].items():
        parts = (ours,) if isinstance(ours, str) else ours
        layers = range(config.num_layers) if "{i}" in hf_pattern else [None]
        for i in layers:
            names = tuple(p.format(i=i) for p in parts)
            if all(n in needed for n in names):
                expanded[hf_pattern.format(i=i)] = names
            elif any(n in needed for n in names):
                raise FdppError(f"internal: {hf_pattern} maps to a mix of used and unused names {names}")
    return expanded


def _expand(patterns, config: ModelConfig) -> set[str]:
    return {pattern.format(i=i) for pattern in patterns
            for i in (range(config.num_layers) if "{i}" in pattern else [None])}


def transposed_names(config: ModelConfig) -> set[str]:
    """The checkpoint names of this config that are stored [in_features, out_features]."""
    return _expand(TRANSPOSED.get(config.family, ()), config)


def head_interleaved_names(config: ModelConfig) -> set[str]:
    """The checkpoint names of this config whose fused rows are grouped by head (GPT-NeoX)."""
    return _expand(HEAD_INTERLEAVED.get(config.family, ()), config)


def _group_by_part(tensor: torch.Tensor, num_heads: int, parts: int, inverse: bool = False) -> torch.Tensor:
    """Rows [H, parts, D] -> [parts, H, D] (q of every head, then k, then v); `inverse` goes back."""
    rest = tensor.shape[1:]
    outer = (parts, num_heads) if inverse else (num_heads, parts)
    return tensor.reshape(*outer, -1, *rest).transpose(0, 1).reshape(tensor.shape)


def _is_norm_scale(name: str) -> bool:
    return name.endswith("norm.weight")


def config_from_hf(cfg: dict, where: str = "config.json") -> ModelConfig:
    """Our ModelConfig from a Hugging Face config.json dict."""
    model_type = cfg.get("model_type")
    reader = CONFIG_READERS.get(model_type)
    if reader is None:
        raise FdppError(f"{where}: model_type {model_type!r} is not supported "
                        f"(supported: {', '.join(CONFIG_READERS)}); use a checkpoint of one of those")
    try:
        return reader(cfg, where)
    except KeyError as exc:
        raise FdppError(f"{where} lacks the field {exc.args[0]!r} that a {model_type} config needs") from None


def _llama_like(cfg: dict, where: str) -> ModelConfig:
    """llama, qwen2 and mistral: one layout, differing in biases and mistral's (or qwen2's) sliding window."""
    family = cfg["model_type"]
    _check(cfg, "hidden_act", "silu", f"{family} with another MLP activation than silu is not supported")
    if family == "llama":
        qkv_bias, linear_bias = cfg.get("attention_bias", False), _llama_linear_bias(cfg)
    else:  # qwen2: bias on q, k, v only; mistral, qwen3: none
        qkv_bias, linear_bias = family == "qwen2", False
    if family == "qwen3":
        _check(cfg, "attention_bias", False, "qwen3 with attention biases is not supported")
        _check(cfg, "use_sliding_window", False, "qwen3 with sliding-window layers is not supported")
    heads = cfg["num_attention_heads"]
    window = _sliding_window(cfg)
    max_position = cfg.get("max_position_embeddings", 2048)
    return ModelConfig(
        family=family, hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads, vocab_size=cfg["vocab_size"],
        max_position=min(max_position, window) if window else max_position, norm_eps=cfg.get("rms_norm_eps", 1e-6),
        tie_embeddings=cfg.get("tie_word_embeddings", False), qkv_bias=qkv_bias, linear_bias=linear_bias,
        sliding_window=window, qk_norm=family == "qwen3", **_rope(cfg, where))


def _sliding_window(cfg: dict) -> int:
    """The attention window in tokens (0: none). Qwen2 windows only layers >= max_window_layers, and only with
    use_sliding_window; any windowed layer limits the whole model's sequences."""
    window = cfg.get("sliding_window") or 0
    if cfg["model_type"] == "qwen2":
        layer_types = cfg.get("layer_types")
        windowed = ("sliding_attention" in layer_types if layer_types
                    else cfg.get("max_window_layers", 28) < cfg["num_hidden_layers"])
        return window if cfg.get("use_sliding_window", False) and windowed else 0
    return window if cfg["model_type"] == "mistral" else 0


def _rope(cfg: dict, where: str, head_dim: int | None = None, params: dict | None = None) -> dict:
    """The ModelConfig rope fields of a config.json: rope_parameters (transformers 5) or rope_scaling and
    rope_theta (older files). With `head_dim`, a partial rotary factor gives rotary_dim; without, it is refused.
    `params`: the rope parameters to read instead of the file's own (gemma3's full-attention set)."""
    params = params if params is not None else cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type")) or "default"
    theta = params.get("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000.0)))
    fields = {"rope_theta": float(theta)}
    partial = (params.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or cfg.get("rotary_pct")
               or 1.0)
    if partial != 1.0 and head_dim is None:
        raise FdppError(f"{where}: partial_rotary_factor {partial} is not supported for {cfg['model_type']} "
                        "(RoPE on every channel only)")
    if partial != 1.0:
        fields["rotary_dim"] = int(head_dim * partial)
    if rope_type not in ROPE_TYPES:
        raise FdppError(f"{where}: rope scaling type {rope_type!r} is not supported "
                        f"(supported: {', '.join(ROPE_TYPES)})")
    if rope_type == "default":
        return fields
    if "factor" not in params:
        raise FdppError(f"{where}: {rope_type} rope scaling lacks its 'factor'")
    fields.update(rope_type=rope_type, rope_factor=float(params["factor"]))
    if rope_type == "llama3":
        try:
            fields.update(rope_low_freq_factor=float(params["low_freq_factor"]),
                          rope_high_freq_factor=float(params["high_freq_factor"]),
                          rope_original_max_position=int(params["original_max_position_embeddings"]))
        except KeyError as exc:
            raise FdppError(f"{where}: llama3 rope scaling lacks {exc.args[0]!r}") from None
    return fields


def _opt(cfg: dict, where: str) -> ModelConfig:
    _check(cfg, "do_layer_norm_before", True, "post-LayerNorm OPT (opt-350m) is not supported")
    _check(cfg, "activation_function", "relu", "only the ReLU MLP of OPT is supported")
    _check(cfg, "enable_bias", True, "OPT without biases is not supported")
    _check(cfg, "layer_norm_elementwise_affine", True, "OPT without LayerNorm affine is not supported")
    if cfg.get("word_embed_proj_dim", cfg["hidden_size"]) != cfg["hidden_size"]:
        raise FdppError(f"{where}: OPT with word_embed_proj_dim != hidden_size (project_in/out) is not supported")
    heads = cfg["num_attention_heads"]
    return ModelConfig(
        family="opt", hidden_size=cfg["hidden_size"], intermediate_size=cfg["ffn_dim"],
        num_layers=cfg["num_hidden_layers"], num_heads=heads, num_kv_heads=heads,
        head_dim=cfg["hidden_size"] // heads, vocab_size=cfg["vocab_size"],
        max_position=cfg["max_position_embeddings"], norm_eps=1e-5, norm="layernorm", activation="relu",
        qkv_bias=True, linear_bias=True, learned_positions=True, position_offset=2,
        tie_embeddings=cfg.get("tie_word_embeddings", True))


# GPT-2 spells the tanh-approximated GELU two ways; both are 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
GPT2_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")


def _gpt2(cfg: dict, where: str) -> ModelConfig:
    if cfg.get("activation_function", "gelu_new") not in GPT2_GELU_TANH:
        raise FdppError(f"{where}: GPT-2 with activation_function {cfg['activation_function']!r} is not supported "
                        f"(supported: {', '.join(GPT2_GELU_TANH)})")
    _check(cfg, "scale_attn_weights", True, "GPT-2 without the 1/sqrt(head_dim) attention scale is not supported")
    _check(cfg, "scale_attn_by_inverse_layer_idx", False, "GPT-2 with per-layer attention scaling is not supported")
    _check(cfg, "add_cross_attention", False, "GPT-2 with cross-attention is not supported")
    hidden, heads = cfg["n_embd"], cfg["n_head"]
    return ModelConfig(
        family="gpt2", hidden_size=hidden, intermediate_size=cfg.get("n_inner") or 4 * hidden,
        num_layers=cfg["n_layer"], num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
        vocab_size=cfg["vocab_size"], max_position=cfg["n_positions"], norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
        norm="layernorm", activation="gelu_tanh", qkv_bias=True, linear_bias=True, learned_positions=True,
        tie_embeddings=cfg.get("tie_word_embeddings", True))


def _chatglm(cfg: dict, where: str) -> ModelConfig:
    _check(cfg, "rmsnorm", True, "ChatGLM with LayerNorm is not supported")
    _check(cfg, "post_layer_norm", True, "ChatGLM without a final norm is not supported")
    _check(cfg, "add_bias_linear", False, "ChatGLM with linear biases is not supported")
    _check(cfg, "apply_residual_connection_post_layernorm", False, "ChatGLM with post-norm residuals is not supported")
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("multi_query_group_num", heads) if cfg.get("multi_query_attention") else heads
    head_dim = cfg.get("kv_channels") or cfg["hidden_size"] // heads
    return ModelConfig(
        family="chatglm", hidden_size=cfg["hidden_size"], intermediate_size=cfg["ffn_hidden_size"],
        num_layers=cfg["num_layers"], num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        rotary_dim=head_dim // 2, rope_interleaved=True, vocab_size=cfg["padded_vocab_size"],
        max_position=cfg.get("seq_length", 32768), norm_eps=cfg.get("layernorm_epsilon", 1e-5),
        rope_theta=10000.0 * cfg.get("rope_ratio", 1), qkv_bias=cfg.get("add_qkv_bias", True),
        tie_embeddings=False)


GEMMA_FAMILY = {"gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3"}
GELU_TANH_NAMES = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
# transformers' default local/global layer pattern where a config.json has no layer_types: every Nth is global
GEMMA_GLOBAL_EVERY = {"gemma2": 2, "gemma3": 6}


def _gemma(cfg: dict, where: str) -> ModelConfig:
    """Gemma 1, 2 and 3 (text): GeGLU, (1 + weight) RMSNorm, scaled embeddings; 2 and 3 add norms after attention
    and MLP, local (sliding-window) layers and query_pre_attn_scalar; 2 soft-caps, 3 has q/k norms and a local
    rope base."""
    family = GEMMA_FAMILY[cfg["model_type"]]
    activation = cfg.get("hidden_activation") or cfg.get("hidden_act", "gelu_pytorch_tanh")
    if activation not in GELU_TANH_NAMES:
        raise FdppError(f"{where}: {family} with activation {activation!r} is not supported "
                        f"(supported: {', '.join(GELU_TANH_NAMES)})")
    if cfg.get("use_bidirectional_attention"):  # None (gemma2's default) is causal too
        raise FdppError(f"{where}: {family} with bidirectional attention (an encoder) is not supported")
    _check(cfg, "attention_bias", False, f"{family} with attention biases is not supported")
    layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    fields = {}
    if family != "gemma":
        every = cfg.get("sliding_window_pattern") or GEMMA_GLOBAL_EVERY[family]
        layer_types = cfg.get("layer_types") or [
            "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]
        fields.update(post_norms=True, layer_types=tuple(layer_types), sliding_window=cfg.get("sliding_window") or 0,
                      attn_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5,
                      attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
                      final_softcap=float(cfg.get("final_logit_softcapping") or 0.0))
    params = cfg.get("rope_parameters") or {}
    if family == "gemma3":
        local = params.get("sliding_attention", {})
        fields.update(qk_norm=True, rope_local_theta=float(local.get("rope_theta",
                                                                     cfg.get("rope_local_base_freq", 10000.0))))
        params = params.get("full_attention", params if "rope_type" in params else cfg.get("rope_scaling") or {})
    return ModelConfig(
        family=family, hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"], num_layers=layers,
        num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=head_dim,
        vocab_size=cfg["vocab_size"], max_position=cfg.get("max_position_embeddings", 8192),
        norm_eps=cfg.get("rms_norm_eps", 1e-6), activation="geglu", scale_embeddings=True,
        tie_embeddings=cfg.get("tie_word_embeddings", True), **fields, **_rope(cfg, where, params=params))


def _phi3(cfg: dict, where: str) -> ModelConfig:
    """Phi-3: Llama's layer with fused qkv_proj and gate_up_proj; a sliding window (phi-3-mini-4k) is masked in
    every layer."""
    _check(cfg, "hidden_act", "silu", "phi3 with another MLP activation than silu is not supported")
    layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    window = cfg.get("sliding_window") or 0
    return ModelConfig(
        family="phi3", hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"], num_layers=layers,
        num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=head_dim,
        vocab_size=cfg["vocab_size"], max_position=cfg.get("max_position_embeddings", 4096),
        norm_eps=cfg.get("rms_norm_eps", 1e-5), tie_embeddings=cfg.get("tie_word_embeddings", False),
        sliding_window=window, layer_types=("sliding_attention",) * layers if window else (),
        **_rope(cfg, where, head_dim))


def _stablelm(cfg: dict, where: str) -> ModelConfig:
    _check(cfg, "hidden_act", "silu", "stablelm with another MLP activation than silu is not supported")
    _check(cfg, "qk_layernorm", False, "stablelm with per-head q/k LayerNorm (stablelm-2-12b) is not supported")
    _check(cfg, "use_parallel_residual", False, "stablelm with a parallel residual is not supported")
    heads = cfg["num_attention_heads"]
    head_dim = cfg["hidden_size"] // heads
    return ModelConfig(
        family="stablelm", hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim, vocab_size=cfg["vocab_size"], max_position=cfg.get("max_position_embeddings", 4096),
        norm_eps=cfg.get("layer_norm_eps", 1e-5), norm="layernorm", qkv_bias=cfg.get("use_qkv_bias", False),
        tie_embeddings=cfg.get("tie_word_embeddings", False), **_rope(cfg, where, head_dim))


# GPT-NeoX's MLP activations: exact GELU ("gelu", Pythia) or its tanh form.
GPT_NEOX_ACTIVATIONS = {"gelu": "gelu", **{name: "gelu_tanh" for name in GELU_TANH_NAMES}}


def _gpt_neox(cfg: dict, where: str) -> ModelConfig:
    act = cfg.get("hidden_act", "gelu")
    if act not in GPT_NEOX_ACTIVATIONS:
        raise FdppError(f"{where}: gpt_neox with hidden_act {act!r} is not supported "
                        f"(supported: {', '.join(GPT_NEOX_ACTIVATIONS)})")
    _check(cfg, "attention_bias", True, "gpt_neox without attention biases is not supported")
    heads = cfg["num_attention_heads"]
    head_dim = cfg["hidden_size"] // heads
    return ModelConfig(
        family="gpt_neox", hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=heads, num_kv_heads=heads, head_dim=head_dim,
        vocab_size=cfg["vocab_size"], max_position=cfg.get("max_position_embeddings", 2048),
        norm_eps=cfg.get("layer_norm_eps", 1e-5), norm="layernorm", activation=GPT_NEOX_ACTIVATIONS[act],
        qkv_bias=True, linear_bias=True, parallel_residual=cfg.get("use_parallel_residual", True),
        tie_embeddings=cfg.get("tie_word_embeddings", False), **_rope(cfg, where, head_dim))


# config.json's model_type -> the reader of its config
CONFIG_READERS = {"llama": _llama_like, "qwen2": _llama_like, "mistral": _llama_like, "qwen3": _llama_like,
                  "opt": _opt, "gpt2": _gpt2, "chatglm": _chatglm, "gemma": _gemma, "gemma2": _gemma,
                  "gemma3_text": _gemma, "phi3": _phi3, "stablelm": _stablelm, "gpt_neox": _gpt_neox}


def _llama_linear_bias(cfg: dict) -> bool:
    if cfg.get("attention_bias", False) != cfg.get("mlp_bias", False):
        raise FdppError("llama checkpoints with attention_bias != mlp_bias are not supported")
    return bool(cfg.get("mlp_bias", False))


def _check(cfg: dict, key: str, expected, message: str) -> None:
    if cfg.get(key, expected) != expected:
        raise FdppError(f"{message} (config.json has {key}={cfg[key]!r})")


def read_hf_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise FdppError(f"{directory} has no config.json; pass a Hugging Face checkpoint directory")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FdppError(f"{path} is not valid JSON ({exc}); re-download the checkpoint") from None


class SafetensorsIndex:
    """Which file holds which tensor, over every *.safetensors file of a directory (sharded or not)."""

    def __init__(self, directory: Path, aliases=()):
        from safetensors import SafetensorError, safe_open

        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise FdppError(f"{directory} has no *.safetensors files (only safetensors checkpoints are read; "
                            "convert .bin files with transformers' save_pretrained)")
        self._handles = {}
        self._where = {}
        for path in files:
            try:
                handle = safe_open(str(path), framework="pt")
                keys = list(handle.keys())
            except (SafetensorError, OSError, ValueError) as exc:
                raise FdppError(f"cannot read {path.name}: {exc}; the file is truncated or corrupt, "
                                "re-download it") from None
            self._handles[path] = handle
            for key in keys:
                for old, new in aliases:
                    if key.startswith(old):
                        key_alias = new + key[len(old):]
                        self._where.setdefault(key_alias, (path, key))
                self._where[key] = (path, key)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        from safetensors import SafetensorError

        path, key = self._where[name]
        try:
            return self._handles[path].get_tensor(key)
        except (SafetensorError, OSError, ValueError) as exc:
            raise FdppError(f"cannot read tensor {key} from {path.name}: {exc}; re-download the file") from None


def load_hf_checkpoint(directory: Path, dtype: str, num_layers: int | None):
    """(config, Weights, tokenizer or None) of a Hugging Face checkpoint directory."""
    raw = read_hf_config(directory)
    config = config_from_hf(raw, str(directory / "config.json")).with_layers(num_layers)
    index = SafetensorsIndex(directory, KEY_ALIASES.get(config.family, ()))
    name_map = expand_name_map(config)
    missing = [hf for hf in name_map if hf not in index]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise FdppError(f"{directory} lacks weights {shown}; the checkpoint is incomplete or not a "
                        f"{config.family} model")
    shapes = weight_shapes(config)
    source_of = {}
    for hf_name, parts in name_map.items():
        offset = 0
        for part in parts:
            rows = shapes[part][0]
            source_of[part] = (hf_name, offset, offset + rows)
            offset += rows

    transposed, interleaved = transposed_names(config), head_interleaved_names(config)
    plus_one = config.family in NORM_PLUS_ONE
    last = {}  # the most recent fused tensor, so q, k, v of one layer read query_key_value once

    def fetch(name: str) -> torch.Tensor:
        hf_name, start, stop = source_of[name]
        if last.get("name") != hf_name:
            last.clear()
            tensor = index.get(hf_name)
            last.update(name=hf_name, tensor=tensor.T if hf_name in transposed else tensor)
        tensor = last["tensor"]
        parts = name_map[hf_name]
        if len(parts) > 1:
            expected_rows = sum(shapes[p][0] for p in parts)
            if tensor.shape[0] != expected_rows:
                raise FdppError(f"{hf_name} has {tensor.shape[0]} rows, the config needs {expected_rows}")
            if hf_name in interleaved:
                tensor = _group_by_part(tensor, config.num_heads, len(parts))
            tensor = tensor[start:stop]
        if plus_one and _is_norm_scale(name):
            tensor = tensor.float() + 1.0  # in float32: 1 + a bfloat16 weight rounds in bfloat16
        return tensor

    from fdpp_rewrite.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_hf_dir(directory, raw)
    return config, Weights(config, fetch, dtype), tokenizer


def hf_state_dict(config: ModelConfig, weights) -> dict[str, torch.Tensor]:
    """The inverse map: our weights under the checkpoint's names (fused tensors concatenated).
    Used to write test checkpoints and to load our weights into transformers' models."""
    state = {}
    transposed, interleaved = transposed_names(config), head_interleaved_names(config)
    plus_one = config.family in NORM_PLUS_ONE
    for hf_name, parts in expand_name_map(config).items():
        tensors = [weights[p] - 1.0 if plus_one and _is_norm_scale(p) else weights[p] for p in parts]
        tensor = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
        if hf_name in interleaved:
            tensor = _group_by_part(tensor, config.num_heads, len(parts), inverse=True)
        state[hf_name] = tensor.T.contiguous() if hf_name in transposed else tensor
    return state


def hf_config_json(config: ModelConfig) -> dict:
    """The config.json a Hugging Face checkpoint of this architecture has (the inverse of config_from_hf)."""
    c = config
    if c.family in ("llama", "qwen2", "mistral", "qwen3"):
        return _llama_like_json(c)
    if c.family in NEW_FAMILY_JSON:
        return NEW_FAMILY_JSON[c.family](c)
    if c.family == "opt":
        return {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": c.hidden_size,
                "ffn_dim": c.intermediate_size, "num_hidden_layers": c.num_layers,
                "num_attention_heads": c.num_heads, "vocab_size": c.vocab_size,
                "max_position_embeddings": c.max_position, "word_embed_proj_dim": c.hidden_size,
                "do_layer_norm_before": True, "activation_function": "relu", "enable_bias": True,
                "layer_norm_elementwise_affine": True, "tie_word_embeddings": c.tie_embeddings}
    if c.family == "gpt2":
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": c.hidden_size,
                "n_inner": c.intermediate_size, "n_layer": c.num_layers, "n_head": c.num_heads,
                "vocab_size": c.vocab_size, "n_positions": c.max_position, "layer_norm_epsilon": c.norm_eps,
                "activation_function": "gelu_new", "scale_attn_weights": True,
                "tie_word_embeddings": c.tie_embeddings}
    return {"model_type": "chatglm", "architectures": ["ChatGLMModel"], "num_layers": c.num_layers,
            "hidden_size": c.hidden_size, "ffn_hidden_size": c.intermediate_size, "num_attention_heads": c.num_heads,
            "multi_query_attention": c.num_kv_heads != c.num_heads, "multi_query_group_num": c.num_kv_heads,
            "kv_channels": c.head_dim, "padded_vocab_size": c.vocab_size, "seq_length": c.max_position,
            "layernorm_epsilon": c.norm_eps, "rope_ratio": c.rope_theta / 10000.0, "rmsnorm": True,
            "add_qkv_bias": c.qkv_bias, "add_bias_linear": False, "post_layer_norm": True,
            "apply_residual_connection_post_layernorm": False}


ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}


def _common_json(c: ModelConfig, model_type: str, architecture: str) -> dict:
    return {"model_type": model_type, "architectures": [architecture], "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "vocab_size": c.vocab_size,
            "max_position_embeddings": c.max_position, "tie_word_embeddings": c.tie_embeddings}


def _rope_json(c: ModelConfig) -> dict:
    data = {"rope_type": c.rope_type, "rope_theta": c.rope_theta}
    if c.rope_type != "default":
        data["factor"] = c.rope_factor
    if c.rotary_dim:
        data["partial_rotary_factor"] = c.rotary_dim / c.head_dim
    return data


def _gemma_json(c: ModelConfig) -> dict:
    model_type = {"gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3_text"}[c.family]
    architecture = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
    data = _common_json(c, model_type, architecture[c.family])
    data.update(head_dim=c.head_dim, rms_norm_eps=c.norm_eps, hidden_activation="gelu_pytorch_tanh",
                hidden_act="gelu_pytorch_tanh", rope_parameters=_rope_json(c))
    if c.family != "gemma":
        data.update(layer_types=list(c.layer_types), sliding_window=c.sliding_window,
                    query_pre_attn_scalar=_integral(c.attn_scale ** -2), attn_logit_softcapping=c.attn_softcap or None,
                    final_logit_softcapping=c.final_softcap or None)
    if c.family == "gemma3":
        data["rope_parameters"] = {"full_attention": _rope_json(c),
                                   "sliding_attention": {"rope_type": "default", "rope_theta": c.rope_local_theta}}
    return data


def _integral(value: float):
    """An int where a float is one up to rounding (transformers checks query_pre_attn_scalar is an int)."""
    return round(value) if abs(value - round(value)) < 1e-6 else value


def _phi3_json(c: ModelConfig) -> dict:
    data = _common_json(c, "phi3", "Phi3ForCausalLM")
    data.update(rms_norm_eps=c.norm_eps, hidden_act="silu", rope_parameters=_rope_json(c),
                sliding_window=c.sliding_window or None)
    return data


def _stablelm_json(c: ModelConfig) -> dict:
    data = _common_json(c, "stablelm", "StableLmForCausalLM")
    data.update(layer_norm_eps=c.norm_eps, hidden_act="silu", use_qkv_bias=c.qkv_bias, qk_layernorm=False,
                use_parallel_residual=False, rope_parameters=_rope_json(c))
    return data


def _gpt_neox_json(c: ModelConfig) -> dict:
    data = _common_json(c, "gpt_neox", "GPTNeoXForCausalLM")
    del data["num_key_value_heads"]
    data.update(layer_norm_eps=c.norm_eps, hidden_act="gelu" if c.activation == "gelu" else "gelu_new",
                use_parallel_residual=c.parallel_residual, attention_bias=True, rope_parameters=_rope_json(c))
    return data


NEW_FAMILY_JSON = {"gemma": _gemma_json, "gemma2": _gemma_json, "gemma3": _gemma_json, "phi3": _phi3_json,
                   "stablelm": _stablelm_json, "gpt_neox": _gpt_neox_json}


def _llama_like_json(c: ModelConfig) -> dict:
    expected_biases = {"llama": (c.linear_bias, c.linear_bias), "qwen2": (True, False), "mistral": (False, False),
                       "qwen3": (False, False)}
    if (c.qkv_bias, c.linear_bias) != expected_biases[c.family]:
        raise FdppError(f"a {c.family} config.json cannot express qkv_bias={c.qkv_bias}, linear_bias={c.linear_bias}")
    data = {"model_type": c.family, "architectures": [ARCHITECTURES[c.family]], "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "vocab_size": c.vocab_size, "max_position_embeddings": c.max_position, "rms_norm_eps": c.norm_eps,
            "rope_theta": c.rope_theta, "tie_word_embeddings": c.tie_embeddings, "hidden_act": "silu"}
    if c.family == "llama":
        data.update(attention_bias=c.qkv_bias, mlp_bias=c.linear_bias)
    if c.family == "mistral":
        data["sliding_window"] = c.sliding_window or None
    if c.family == "qwen2":  # every layer windowed, or none
        data.update(use_sliding_window=bool(c.sliding_window), sliding_window=c.sliding_window or None,
                    max_window_layers=0 if c.sliding_window else c.num_layers)
    if c.rope_type != "default":
        data["rope_scaling"] = {"rope_type": c.rope_type, "factor": c.rope_factor}
        if c.rope_type == "llama3":
            data["rope_scaling"].update(low_freq_factor=c.rope_low_freq_factor,
                                        high_freq_factor=c.rope_high_freq_factor,
                                        original_max_position_embeddings=c.rope_original_max_position)
    return data
