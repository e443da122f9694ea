"""Batch generation on an Engine: prefill every prompt into its slot (a paged engine: batched chunks), then decode
them together.

    result = generate(engine, [ids_a, ids_b], max_new_tokens=32, sampler=Sampler())
    result.tokens                     # the new ids of each sequence (stop id excluded)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fdpp_rewrite.engine.sampling import Sampler
from fdpp_rewrite.errors import FdppError


@dataclass
class GenerateResult:
    tokens: list                      # new ids per sequence, the stop id excluded
    first_token_s: float = 0.0        # prefill of every prompt + the first sampled tokens
    step_s: list = field(default_factory=list)  # wall seconds of each decode step (sampling and readback included)


def check_request(engine, prompts: list, max_new_tokens: int) -> None:
    """One-line errors for prompts the engine cannot run (count, length, token ids) before anything runs."""
    if not prompts:
        raise FdppError("no prompts given; pass at least one prompt")
    if len(prompts) > engine.max_batch:
        raise FdppError(f"{len(prompts)} prompts exceed the engine's max batch of {engine.max_batch}; pass fewer "
                        f"prompts or rebuild with --max-batch {len(prompts)}")
    if max_new_tokens < 1:
        raise FdppError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    for index, ids in enumerate(prompts):
        if not ids:
            raise FdppError(f"prompt {index} is empty after tokenization; pass a non-empty prompt")
        if len(ids) + max_new_tokens > engine.max_seq:
            raise FdppError(f"prompt {index} ({len(ids)} tokens) + {max_new_tokens} new tokens exceed the engine's "
                            f"max sequence of {engine.max_seq}; shorten the prompt, lower --max-new-tokens or "
                            "rebuild with a larger --max-seq")
        if engine.vocab_size and (min(ids) < 0 or max(ids) >= engine.vocab_size):
            raise FdppError(f"prompt {index} has token ids outside the vocabulary [0, {engine.vocab_size}); "
                            "use the engine's tokenizer")
    if engine.paged:
        from fdpp_rewrite.engine.paged.blocks import OutOfBlocks, blocks_for

        needed = sum(blocks_for(len(ids) + max_new_tokens) for ids in prompts)
        if needed > engine.kv.total_blocks:
            raise OutOfBlocks(f"{len(prompts)} sequences of up to {max_new_tokens} new tokens need {needed} KV blocks "
                              f"and the pool has {engine.kv.total_blocks}; pass fewer prompts or build with a larger "
                              "--kv-memory")


def generate(engine, prompts: list, max_new_tokens: int, sampler: Sampler | None = None, stop_ids=(),
             on_tokens=None) -> GenerateResult:
    """Prefill every prompt into its slot, then decode them together. on_tokens(step tokens [B], done [B]) is called
    after every step (for streaming)."""
    check_request(engine, prompts, max_new_tokens)
    sampler = sampler or Sampler()
    stop_ids = set(stop_ids)
    engine.reset()
    started = time.perf_counter()
    logits = engine.prefill_batch(prompts)
    engine.active = len(prompts)
    result = GenerateResult(tokens=[[] for _ in prompts])
    done = [False] * len(prompts)
    step_started = None
    for step in range(max_new_tokens):
        tokens = sampler(logits)
        values = tokens.tolist()  # the step's one synchronization
        now = time.perf_counter()
        if step_started is None:
            result.first_token_s = now - started
        else:
            result.step_s.append(now - step_started)
        for b, token in enumerate(values):
            if done[b]:
                continue
            if token in stop_ids:
                done[b] = True
            else:
                result.tokens[b].append(token)
        if on_tokens is not None:
            on_tokens(values, done)
        if all(done) or step == max_new_tokens - 1:
            break
        step_started = time.perf_counter()
        logits = engine.decode(tokens)
    return result
