"""Hugging Face checkpoint names -> ours, one declarative table per family.

A tuple on the right means the checkpoint stores those tensors concatenated along dim 0 (ChatGLM2's fused
query_key_value and dense_h_to_4h); the split sizes come from our shapes. Names in a family's TRANSPOSED set are
stored [in_features, out_features] (GPT-2's Conv1D) and are transposed as they are read, before any split."""

import torch

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models.config import ModelConfig
from fdpp_rewrite.models.names import weight_shapes

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


def group_by_part(tensor: torch.Tensor, num_heads: int, parts: int, inverse: bool = False) -> torch.Tensor:
    """Rows [H, parts, D] -> [parts, H, D] (q of every head, then k, then v); `inverse` goes back."""
    rest = tensor.shape[1:]
    outer = (parts, num_heads) if inverse else (num_heads, parts)
    return tensor.reshape(*outer, -1, *rest).transpose(0, 1).reshape(tensor.shape)


def is_norm_scale(name: str) -> bool:
    return name.endswith("norm.weight")
