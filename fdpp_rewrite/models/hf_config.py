"""Hugging Face config.json <-> ModelConfig: one reader per model_type, and the writer that inverts it."""

import json
from pathlib import Path

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models.config import ROPE_TYPES, ModelConfig

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
