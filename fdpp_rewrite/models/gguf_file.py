"""GGUF files (llama.cpp's format) of the llama architecture: config from the metadata, weights dequantized to
float with gguf.quants.dequantize, the tokenizer rebuilt from the embedded vocabulary.

llama.cpp's converter reorders the rows of attn_q and attn_k inside each head so that its rotary code can rotate
adjacent pairs; our rotary code (like Hugging Face's) rotates channel i with channel i + D/2. `unpermute_rows`
restores the Hugging Face order."""

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
    if arch != "llama":
        raise FdppError(f"{path} is a GGUF of architecture {arch!r}; only 'llama' GGUF files are supported")

    def get(key, default=None):
        value = fields.get(f"llama.{key}", default)
        if value is None:
            raise FdppError(f"{path} lacks the GGUF key llama.{key}; the file is incomplete")
        return value

    if fields.get("llama.rope.scaling.type", "none") not in ("none", "linear") or \
            fields.get("llama.rope.scaling.factor", 1.0) != 1.0:
        raise FdppError(f"{path} uses rope scaling, which is not supported")
    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    head_dim = int(fields.get("llama.attention.key_length", hidden // heads))
    vocab = fields.get("llama.vocab_size") or len(fields.get("tokenizer.ggml.tokens", []))
    return ModelConfig(
        family="llama", hidden_size=hidden, intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")), num_heads=heads,
        num_kv_heads=int(fields.get("llama.attention.head_count_kv", heads)), head_dim=head_dim,
        vocab_size=int(vocab), max_position=int(get("context_length")),
        norm_eps=round(float(get("attention.layer_norm_rms_epsilon")), 12),
        rope_theta=float(fields.get("llama.rope.freq_base", 10000.0)),
        tie_embeddings="output.weight" not in tensor_names)


def load_gguf(path: Path, dtype: str, num_layers: int | None):
    """(config, Weights, tokenizer or None) of a llama GGUF file."""
    import gguf

    reader, fields = open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}
    config = config_from_gguf(fields, path, set(tensors)).with_layers(num_layers)
    ours_to_gguf = {}
    for gguf_pattern, ours in GGUF_NAMES.items():
        layers = range(config.num_layers) if "{i}" in gguf_pattern else [None]
        for i in layers:
            ours_to_gguf[ours.format(i=i)] = gguf_pattern.format(i=i)
    needed = weight_shapes(config)
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
        if name.endswith("attn.q.weight"):
            values = unpermute_rows(values, config.num_heads)
        elif name.endswith("attn.k.weight"):
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
