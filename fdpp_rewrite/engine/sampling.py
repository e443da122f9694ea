"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p."""

from __future__ import annotations

import math

import torch

from fdpp_rewrite.errors import FdppError


class Sampler:
    """Greedy (temperature 0) or sampled with temperature, top-k and top-p from a seeded generator."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None):
        if not math.isfinite(temperature) or temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
            raise FdppError(f"sampling needs temperature >= 0, top-k >= 0 and 0 < top-p <= 1 (got {temperature}, "
                            f"{top_k}, {top_p})")
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed
        self.generator = None

    def __call__(self, logits):
        """logits [B, V] -> token ids [B] (int64, on logits' device)."""
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        if self.generator is None or self.generator.device != logits.device:
            self.generator = torch.Generator(device=logits.device)
            self.generator.manual_seed(self.seed if self.seed is not None else torch.seed())
        scores = logits.float() / self.temperature
        if self.top_k:
            kth = torch.topk(scores, min(self.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1:
            ordered, order = torch.sort(scores, dim=-1, descending=True)
            probs = torch.softmax(ordered, dim=-1)
            drop = probs.cumsum(-1) - probs > self.top_p  # keep the smallest prefix whose mass reaches top_p
            scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
        probs = torch.softmax(scores, dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
