"""Hugging Face checkpoints: a directory with config.json and *.safetensors (one file or shards), read into
our Weights through the name tables of hf_names.py; hf_state_dict is the inverse."""

from pathlib import Path

import torch

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models.config import ModelConfig
from fdpp_rewrite.models.hf_config import config_from_hf, read_hf_config
from fdpp_rewrite.models.hf_names import (KEY_ALIASES, NORM_PLUS_ONE, expand_name_map, group_by_part,
                                         head_interleaved_names, is_norm_scale, transposed_names)
from fdpp_rewrite.models.names import weight_shapes
from fdpp_rewrite.models.weights import Weights


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
                tensor = group_by_part(tensor, config.num_heads, len(parts))
            tensor = tensor[start:stop]
        if plus_one and is_norm_scale(name):
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
        tensors = [weights[p] - 1.0 if plus_one and is_norm_scale(p) else weights[p] for p in parts]
        tensor = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
        if hf_name in interleaved:
            tensor = group_by_part(tensor, config.num_heads, len(parts), inverse=True)
        state[hf_name] = tensor.T.contiguous() if hf_name in transposed else tensor
    return state
