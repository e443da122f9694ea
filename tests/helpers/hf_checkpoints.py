"""Hugging Face checkpoints written from our weights (config.json + safetensors shards), for tests of the loader
(fdpp_rewrite.models.hf.load_hf_checkpoint) and of `export` from a checkpoint folder."""

from __future__ import annotations

import json
from pathlib import Path

from fdpp_rewrite.models.hf import hf_state_dict
from fdpp_rewrite.models.hf_config import hf_config_json


def write_checkpoint(directory: Path, config_json: dict, state: dict, shards: int = 1) -> None:
    """config.json and the tensors of `state` split over `shards` files named as transformers names them."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    names = sorted(state)
    for k in range(shards):
        part = {n: state[n].contiguous() for n in names[k::shards]}
        save_file(part, str(directory / f"model-{k + 1:05d}-of-{shards:05d}.safetensors"))


def save_hf_checkpoint(config, weights, directory: Path, shards: int = 1) -> None:
    """Write our weights as a Hugging Face checkpoint of `config`'s family."""
    write_checkpoint(directory, hf_config_json(config), hf_state_dict(config, weights), shards)
