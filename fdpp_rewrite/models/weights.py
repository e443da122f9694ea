"""Lazy weight mappings: canonical name -> torch tensor, produced only when asked for.

A 7B model in float32 is 27 GB, more than this machine has, so no loader holds all weights: a `Weights` object
knows every name and shape up front (so missing names fail at load time) and reads, dequantizes or generates
one tensor per lookup. `dict(weights)` materializes everything for small models."""

import zlib
from collections.abc import Callable, Iterator, Mapping

import torch

from fdpp_rewrite.dtypes import NAMES
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models.config import ModelConfig
from fdpp_rewrite.models.names import weight_shapes

DTYPES = {name: getattr(torch, name) for name in NAMES}  # torch names its dtypes as dtypes.FLOAT_TYPES does


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise FdppError(f"unsupported dtype {name!r} (use one of {', '.join(DTYPES)})") from None


class Weights(Mapping):
    """Canonical name -> tensor of `dtype`, fetched on access through `fetch(name)` and shape-checked."""

    def __init__(self, config: ModelConfig, fetch: Callable[[str], torch.Tensor], dtype: str):
        self.config = config
        self.dtype = torch_dtype(dtype)
        self._shapes = weight_shapes(config)
        self._fetch = fetch

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._shapes:
            raise KeyError(name)
        tensor = self._fetch(name)
        if tuple(tensor.shape) != self._shapes[name]:
            raise FdppError(f"weight {name} has shape {tuple(tensor.shape)}, the config needs {self._shapes[name]}; "
                            "the checkpoint does not match its config")
        return tensor.to(self.dtype).contiguous()

    def __contains__(self, name) -> bool:  # Mapping's default would fetch (read or generate) the tensor
        return name in self._shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)


# Random init: small enough that 40 residual layers keep activations near unit scale, norms near 1.
INIT_STD = 0.02


def _name_seed(seed: int, name: str) -> int:
    # Each tensor has its own generator so any one can be produced alone, in any order, reproducibly.
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def random_tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_name_seed(seed, name))
    values = torch.randn(shape, generator=generator, dtype=torch.float32) * INIT_STD
    if "norm" in name and name.endswith(".weight"):
        values += 1.0  # norm scales near 1 (not exactly 1, so a mixed-up norm weight shows in tests)
    return values


def random_weights(config: ModelConfig, seed: int, dtype: str, scales: dict[str, float] | None = None) -> Weights:
    """Seeded random weights; `scales` (a preset's PRESET_WEIGHT_SCALES) multiplies the named tensors."""
    shapes, scales = weight_shapes(config), scales or {}
    return Weights(config, lambda name: random_tensor(name, shapes[name], seed) * scales.get(name, 1.0), dtype)
