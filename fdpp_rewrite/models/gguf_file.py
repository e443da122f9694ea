"""GGUF files (llama.cpp's format) of the llama and gemma3 architectures: config from the metadata, weights
dequantized to float with gguf.quants.dequantize, the tokenizer rebuilt from the embedded vocabulary.

For llama, llama.cpp's converter reorders the rows of attn_q and attn_k inside each head so that its rotary code
can rotate adjacent pairs; our rotary code (like Hugging Face's) rotates channel i with channel i + D/2.
`unpermute_rows` restores the Hugging Face order. For gemma3 it keeps the order (its rotary code rotates i with
i + D/2 there too) and stores Gemma's norm weights as 1 + weight, the scale our norms take as they are."""

from pathlib import Path

import numpy as np
import torch

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models.config import ModelConfig
from fdpp_rewrite.models.names import weight_shapes
from fdpp_rewrite.models.weights import Weights

GGUF_NAMES = {
    "token_embd.weight": "embed.weight",
    "blk.{i}.attn_norm.weight": "layers.{i}.attn_norm.weight",
    "blk.{i}.attn_q.weight": "layers.{i}.attn.q.weight",
    "blk.{i}.attn_k.weight": "layers.{i}.attn.k.weight",
    "blk.{i}.attn_v.weight": "layers.{i}.attn.v.weight",
    "blk.{i}.attn_output.weight": "layers.{i}.attn.o.weight",
    "blk.{i}.ffn_norm.weight": "layers.{i}.mlp_norm.weight",
    "blk.{i}.ffn_gate.weight": "layers.{i}.mlp.gate.weight",
    "blk.{i}.ffn_up.weight": "layers.{i}.mlp.up.weight",
    "blk.{i}.ffn_down.weight": "layers.{i}.mlp.down.weight",
    "output_norm.weight": "final_norm.weight",
    "output.weight": "lm_head.weight",
}

# Gemma 3: q/k norms, and a norm after attention (post_attention_norm) and on each side of the MLP (ffn_norm
# before, post_ffw_norm after).
GEMMA3_GGUF_NAMES = {
    **GGUF_NAMES,
    "blk.{i}.attn_q_norm.weight": "layers.{i}.attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "layers.{i}.attn.k_norm.weight",
    "blk.{i}.post_attention_norm.weight": "layers.{i}.attn_post_norm.weight",
    "blk.{i}.post_ffw_norm.weight": "layers.{i}.mlp_post_norm.weight",
}

ARCHITECTURES = {"llama": GGUF_NAMES, "gemma3": GEMMA3_GGUF_NAMES}
# What llama.cpp fixes for gemma3 rather than storing: the local layers' rope base and one global layer in six.
GEMMA3_LOCAL_ROPE_THETA = 10000.0
GEMMA3_GLOBAL_EVERY = 6
GEMMA3_27B_LAYERS = 62


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order. Per head, GGUF row 2j + s holds Hugging Face row s * D/2 + j."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def open_gguf(path: Path):
    """(reader, metadata dict) of a GGUF file; FdppError if it cannot be parsed."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path), "r")
        fields = {name: field.contents() for name, field in reader.fields.items()}
    except Exception as exc:  # the gguf parser raises ValueError, IndexError, struct/numpy errors on bad input
        raise FdppError(f"cannot read {path} as GGUF ({type(exc).__name__}: {exc}); "
                        "the file is truncated or not a GGUF file") from None
    return reader, fields


def config_from_gguf(fields: dict, path: Path, tensor_names: set[str]) -> ModelConfig:
    arch = fields.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise FdppError(f"{path} is a GGUF of architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")

    def get(key, default=None):
        value = fields.get(f"{arch}.{key}", default)
        if value is None:
            raise FdppError(f"{path} lacks the GGUF key {arch}.{key}; the file is incomplete")
        return value

    scaling, factor = get("rope.scaling.type", "none"), float(get("rope.scaling.factor", 1.0))
    if arch == "llama" and (scaling not in ("none", "linear") or factor != 1.0) or scaling not in ("none", "linear"):
        raise FdppError(f"{path} uses {scaling} rope scaling, which is not supported")
    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    layers = int(get("block_count"))
    vocab = get("vocab_size", 0) or len(fields.get("tokenizer.ggml.tokens", []))
    fields_of_arch = {}
    if arch == "gemma3":
        # query_pre_attn_scalar is not stored: llama.cpp takes head_dim, and hidden / heads for the 27B model
        query_scalar = hidden / heads if layers == GEMMA3_27B_LAYERS else head_dim
        fields_of_arch = dict(
            activation="geglu", scale_embeddings=True, post_norms=True, qk_norm=True, attn_scale=query_scalar ** -0.5,
            rope_local_theta=GEMMA3_LOCAL_ROPE_THETA, sliding_window=int(get("attention.sliding_window")),
            layer_types=tuple("full_attention" if (i + 1) % GEMMA3_GLOBAL_EVERY == 0 else "sliding_attention"
                              for i in range(layers)))
        if scaling == "linear" and factor != 1.0:  # the global layers' (gemma3 4B and up)
            fields_of_arch.update(rope_type="linear", rope_factor=factor)
    return ModelConfig(
        family=arch, hidden_size=hidden, intermediate_size=int(get("feed_forward_length")),
        num_layers=layers, num_heads=heads, num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim, vocab_size=int(vocab), max_position=int(get("context_length")),
        norm_eps=round(float(get("attention.layer_norm_rms_epsilon")), 12),
        rope_theta=float(get("rope.freq_base", 10000.0)), tie_embeddings="output.weight" not in tensor_names,
        **fields_of_arch)


def load_gguf(path: Path, dtype: str, num_layers: int | None):
    """(config, Weights, tokenizer or None) of a llama GGUF file."""
    import gguf

    reader, fields = open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}
    config = config_from_gguf(fields, path, set(tensors)).with_layers(num_layers)
    ours_to_gguf = {}
    for gguf_pattern, ours in ARCHITECTURES[config.family].items():
        layers = range(config.num_layers) if "{i}" in gguf_pattern else [None]
        for i in layers:
            ours_to_gguf[ours.format(i=i)] = gguf_pattern.format(i=i)
    needed = weight_shapes(config)
    permuted = config.family == "llama"  # llama.cpp reorders llama's q/k rows only
    missing = [ours_to_gguf[n] for n in needed if ours_to_gguf.get(n) not in tensors]
    if missing:
        raise FdppError(f"{path} lacks tensors {', '.join(missing[:4])}"
                        f"{f' and {len(missing) - 4} more' if len(missing) > 4 else ''}; the GGUF is incomplete")

    def fetch(name: str) -> torch.Tensor:
        tensor = tensors[ours_to_gguf[name]]
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except (NotImplementedError, ValueError) as exc:
            raise FdppError(f"cannot dequantize {tensor.name} ({tensor.tensor_type.name}): {exc}") from None
        values = np.asarray(values, dtype=np.float32)
        if values.shape != needed[name]:
            raise FdppError(f"{path}: tensor {tensor.name} has shape {values.shape}, the metadata implies "
                            f"{needed[name]}; the GGUF is inconsistent")
        if permuted and name.endswith("attn.q.weight"):
            values = unpermute_rows(values, config.num_heads)
        elif permuted and name.endswith("attn.k.weight"):
            values = unpermute_rows(values, config.num_kv_heads)
        return torch.from_numpy(np.array(values, dtype=np.float32, order="C"))  # a writable copy

    from fdpp_rewrite.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf_fields(fields)
    return config, Weights(config, fetch, dtype), tokenizer, _quant_summary(reader)


def _quant_summary(reader) -> str:
    counts = {}
    for tensor in reader.tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1]))
