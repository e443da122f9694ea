"""Hugging Face checkpoints: a directory with config.json and *.safetensors (one file or shards).

One declarative table per family maps checkpoint names to ours. A tuple on the right means the checkpoint
stores those tensors concatenated along dim 0 (ChatGLM2's fused query_key_value and dense_h_to_4h); the split
sizes come from our shapes."""

import json
from pathlib import Path

import torch

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models.config import ModelConfig
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

NAME_MAPS = {"llama": LLAMA_NAMES, "opt": OPT_NAMES, "chatglm": CHATGLM_NAMES}

# Older OPT checkpoints (facebook/opt-*) were saved from OPTModel: "decoder.layers..." without "model.".
KEY_ALIASES = {"opt": [("decoder.", "model.decoder.")]}


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


def _rope_theta(cfg: dict, default: float) -> float:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", None):
        raise FdppError(f"rope scaling type {rope_type!r} is not supported (only plain RoPE); "
                        "use a checkpoint without rope_scaling")
    return float(params.get("rope_theta", cfg.get("rope_theta", default)))


def config_from_hf(cfg: dict, where: str = "config.json") -> ModelConfig:
    """Our ModelConfig from a Hugging Face config.json dict."""
    model_type = cfg.get("model_type")
    try:
        if model_type == "llama":
            heads = cfg["num_attention_heads"]
            return ModelConfig(
                family="llama", hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
                num_layers=cfg["num_hidden_layers"], num_heads=heads,
                num_kv_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads, vocab_size=cfg["vocab_size"],
                max_position=cfg.get("max_position_embeddings", 2048), norm_eps=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=_rope_theta(cfg, 10000.0), tie_embeddings=cfg.get("tie_word_embeddings", False),
                qkv_bias=cfg.get("attention_bias", False), linear_bias=_llama_linear_bias(cfg))
        if model_type == "opt":
            _check(cfg, "do_layer_norm_before", True, "post-LayerNorm OPT (opt-350m) is not supported")
            _check(cfg, "activation_function", "relu", "only the ReLU MLP of OPT is supported")
            _check(cfg, "enable_bias", True, "OPT without biases is not supported")
            _check(cfg, "layer_norm_elementwise_affine", True, "OPT without LayerNorm affine is not supported")
            if cfg.get("word_embed_proj_dim", cfg["hidden_size"]) != cfg["hidden_size"]:
                raise FdppError(f"{where}: OPT with word_embed_proj_dim != hidden_size (project_in/out) "
                                "is not supported")
            heads = cfg["num_attention_heads"]
            return ModelConfig(
                family="opt", hidden_size=cfg["hidden_size"], intermediate_size=cfg["ffn_dim"],
                num_layers=cfg["num_hidden_layers"], num_heads=heads, num_kv_heads=heads,
                head_dim=cfg["hidden_size"] // heads, vocab_size=cfg["vocab_size"],
                max_position=cfg["max_position_embeddings"], norm_eps=1e-5, norm="layernorm", activation="relu",
                qkv_bias=True, linear_bias=True, learned_positions=True, position_offset=2,
                tie_embeddings=cfg.get("tie_word_embeddings", True))
        if model_type == "chatglm":
            _check(cfg, "rmsnorm", True, "ChatGLM with LayerNorm is not supported")
            _check(cfg, "post_layer_norm", True, "ChatGLM without a final norm is not supported")
            _check(cfg, "add_bias_linear", False, "ChatGLM with linear biases is not supported")
            _check(cfg, "apply_residual_connection_post_layernorm", False,
                   "ChatGLM with post-norm residuals is not supported")
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
    except KeyError as exc:
        raise FdppError(f"{where} lacks the field {exc.args[0]!r} that a {model_type} config needs") from None
    raise FdppError(f"{where}: model_type {model_type!r} is not supported "
                    f"(supported: {', '.join(NAME_MAPS)}); use a llama, opt or chatglm checkpoint")


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

    last = {}  # the most recent fused tensor, so q, k, v of one layer read query_key_value once

    def fetch(name: str) -> torch.Tensor:
        hf_name, start, stop = source_of[name]
        if last.get("name") != hf_name:
            last.clear()
            last.update(name=hf_name, tensor=index.get(hf_name))
        tensor = last["tensor"]
        if len(name_map[hf_name]) > 1:
            expected_rows = sum(shapes[p][0] for p in name_map[hf_name])
            if tensor.shape[0] != expected_rows:
                raise FdppError(f"{hf_name} has {tensor.shape[0]} rows, the config needs {expected_rows}")
            tensor = tensor[start:stop]
        return tensor

    from fdpp_rewrite.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_hf_dir(directory, raw)
    return config, Weights(config, fetch, dtype), tokenizer


def hf_state_dict(config: ModelConfig, weights) -> dict[str, torch.Tensor]:
    """The inverse map: our weights under the checkpoint's names (fused tensors concatenated).
    Used to write test checkpoints and to load our weights into transformers' models."""
    state = {}
    for hf_name, parts in expand_name_map(config).items():
        tensors = [weights[p] for p in parts]
        state[hf_name] = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
    return state


def hf_config_json(config: ModelConfig) -> dict:
    """The config.json a Hugging Face checkpoint of this architecture has (the inverse of config_from_hf)."""
    c = config
    if c.family == "llama":
        if c.qkv_bias != c.linear_bias:
            raise FdppError("a llama config.json cannot express qkv_bias != linear_bias")
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size,
                "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
                "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
                "vocab_size": c.vocab_size, "max_position_embeddings": c.max_position, "rms_norm_eps": c.norm_eps,
                "rope_theta": c.rope_theta, "tie_word_embeddings": c.tie_embeddings, "attention_bias": c.qkv_bias,
                "mlp_bias": c.linear_bias, "hidden_act": "silu"}
    if c.family == "opt":
        return {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": c.hidden_size,
                "ffn_dim": c.intermediate_size, "num_hidden_layers": c.num_layers,
                "num_attention_heads": c.num_heads, "vocab_size": c.vocab_size,
                "max_position_embeddings": c.max_position, "word_embed_proj_dim": c.hidden_size,
                "do_layer_norm_before": True, "activation_function": "relu", "enable_bias": True,
                "layer_norm_elementwise_affine": True, "tie_word_embeddings": c.tie_embeddings}
    return {"model_type": "chatglm", "architectures": ["ChatGLMModel"], "num_layers": c.num_layers,
            "hidden_size": c.hidden_size, "ffn_hidden_size": c.intermediate_size, "num_attention_heads": c.num_heads,
            "multi_query_attention": c.num_kv_heads != c.num_heads, "multi_query_group_num": c.num_kv_heads,
            "kv_channels": c.head_dim, "padded_vocab_size": c.vocab_size, "seq_length": c.max_position,
            "layernorm_epsilon": c.norm_eps, "rope_ratio": c.rope_theta / 10000.0, "rmsnorm": True,
            "add_qkv_bias": c.qkv_bias, "add_bias_linear": False, "post_layer_norm": True,
            "apply_residual_connection_post_layernorm": False}


def save_hf_checkpoint(config: ModelConfig, weights, directory: Path, shards: int = 1) -> None:
    """Write our weights as a Hugging Face checkpoint (config.json + `shards` safetensors files)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config_json(config), indent=2) + "\n")
    state = hf_state_dict(config, weights)
    names = sorted(state)
    for k in range(shards):
        part = {n: state[n].contiguous() for n in names[k::shards]}
        save_file(part, str(directory / f"model-{k + 1:05d}-of-{shards:05d}.safetensors"))
