"""The engine's slot-level methods the server's scheduler uses (cpu backend): a prompt prefilled in chunks equals
the prompt prefilled whole, and a decode step of some slots neither advances nor corrupts the other slots of its
bucket (free, or mid-prefill)."""

import pytest
import torch

from fdpp_rewrite.engine.runtime import Engine
from fdpp_rewrite.errors import FdppError

PROMPT = [(7 * i + 3) % 390 for i in range(45)]


@pytest.fixture(scope="module")
def engine(engine_dir):
    return Engine(engine_dir)


def test_chunked_prefill_equals_the_whole_prompt(engine):
    engine.reset()
    whole = engine.prefill(0, PROMPT).clone()
    rows = [cache[0, :, :len(PROMPT)].clone() for cache in engine.caches]
    engine.reset()
    for start, end in ((0, 16), (16, 33), (33, 45)):  # the last chunk runs padded to 16, the second to 32
        chunked = engine.prefill_chunk(1, PROMPT[start:end])
        assert engine.lengths[1] == end and int(engine.past_len[1]) == end
    torch.testing.assert_close(chunked, whole, atol=1e-4, rtol=1e-4)
    for before, cache in zip(rows, engine.caches):
        torch.testing.assert_close(cache[1, :, :len(PROMPT)], before, atol=1e-5, rtol=1e-5)


def test_a_chunk_must_fit_the_engine(engine):
    engine.reset()
    with pytest.raises(FdppError, match="max sequence"):
        engine.prefill_chunk(0, [1] * (engine.max_seq + 1))
    with pytest.raises(FdppError, match="non-empty"):
        engine.prefill_chunk(0, [])


def test_decode_slots_leaves_free_and_mid_prefill_slots_alone(engine):
    """Slots 0 and 2 decode; slot 1 is mid-prefill, slot 3 free: every step runs the batch bucket of 4. Slot 1's
    length stays, the row each step writes at it is rewritten by its next chunk, slot 3 stays at length 0, and
    every sequence's greedy tokens equal its tokens alone (Engine.generate)."""
    short, other, late = PROMPT[:5], PROMPT[10:30], PROMPT[:40]
    steps = 6
    alone = {name: engine.generate([p], steps + 1).tokens[0] for name, p in
             (("short", short), ("other", other), ("late", late))}
    engine.reset()
    first = [int(engine.prefill_chunk(0, short).argmax()), int(engine.prefill_chunk(2, other).argmax())]
    engine.prefill_chunk(1, late[:16])
    tokens = {0: [first[0]], 2: [first[1]]}
    for _ in range(steps):
        feed = torch.tensor([tokens[0][-1], tokens[2][-1]])
        logits = engine.decode_slots([0, 2], feed)
        for slot, row in zip((0, 2), logits.argmax(-1).tolist()):
            tokens[slot].append(row)
        assert engine.slot_buckets([0, 2])[0] == 4
        assert engine.lengths[1] == 16 and engine.lengths[3] == 0
        assert engine.past_len.tolist() == [len(short) + len(tokens[0]) - 1, 16, len(other) + len(tokens[2]) - 1, 0]
    written = engine.caches[0][1, :, 16].clone()
    assert bool(written.abs().sum() > 0)  # the decode steps wrote slot 1's next row ...
    late_tokens = [int(engine.prefill_chunk(1, late[16:]).argmax())]  # ... which this chunk rewrites
    assert not torch.equal(engine.caches[0][1, :, 16], written)
    for _ in range(steps):
        logits = engine.decode_slots([1], torch.tensor([late_tokens[-1]]))
        late_tokens.append(int(logits[0].argmax()))
    assert tokens[0] == alone["short"] and tokens[2] == alone["other"] and late_tokens == alone["late"]


def test_release_frees_the_slot_for_the_kv_bucket(engine):
    engine.reset()
    engine.prefill_chunk(0, PROMPT[:5])
    engine.prefill_chunk(1, PROMPT * 3)  # 135 tokens: the KV bucket of 256
    assert engine.slot_buckets([0]) == (1, 128) and engine.slot_buckets([0, 1])[1] == 256
    engine.release(1)
    assert engine.lengths[1] == 0 and int(engine.past_len[1]) == 0
    assert engine.slot_buckets([0, 1]) == (2, 128)


def _mid_flight(engine):
    """Slots 0 and 2 decoding (their first tokens returned), slot 1 holding the first 16 tokens of a prompt."""
    engine.reset()
    first = [int(engine.prefill_chunk(0, PROMPT[:5]).argmax()), int(engine.prefill_chunk(2, PROMPT[10:30]).argmax())]
    engine.prefill_chunk(1, PROMPT[:16])
    return torch.tensor(first)


def test_a_mixed_step_equals_the_decode_step_and_the_chunk_run_apart(engine):
    """One pass over input_ids [1, 4 + 32] (mixed.py) gives what decode_slots and prefill_chunk give one after
    the other: the decode rows' logits, the chunk's last logits, every slot's cache rows and lengths."""
    assert engine.supports_mixed, engine.mixed_reason
    tokens = _mid_flight(engine)
    apart = engine.decode_slots([0, 2], tokens), engine.prefill_chunk(1, PROMPT[16:40])
    caches = [cache.clone() for cache in engine.caches]
    lengths, past = list(engine.lengths), engine.past_len.clone()
    for _ in range(2):  # traced, then its Program replayed
        tokens = _mid_flight(engine)
        mixed = engine.mixed_step([0, 2], tokens, 1, PROMPT[16:40])
        torch.testing.assert_close(mixed[0], apart[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mixed[1], apart[1], atol=1e-5, rtol=1e-5)
        assert engine.lengths == lengths == [6, 40, 21, 0] and torch.equal(engine.past_len, past)
        for before, cache in zip(caches, engine.caches):
            for slot, length in enumerate(lengths):
                torch.testing.assert_close(cache[slot, :, :length], before[slot, :, :length], atol=1e-5, rtol=1e-5)
    assert list(engine.mixed_steps) == [(4, 32, 1, 128)]  # (batch bucket, padded chunk, chunk slot, KV bucket)


def test_a_mixed_step_refuses_what_it_cannot_run(engine):
    tokens = _mid_flight(engine)
    with pytest.raises(FdppError, match="other than the chunk's slot"):
        engine.mixed_step([0, 1], torch.tensor([1, 2]), 1, PROMPT[16:20])
    with pytest.raises(FdppError, match="non-empty chunk"):
        engine.mixed_step([0, 2], tokens, 1, [])
    with pytest.raises(FdppError, match="max sequence"):
        engine.mixed_step([0, 2], tokens, 1, [1] * 8, padded=engine.max_seq)
    assert engine.lengths == [5, 16, 20, 0]  # nothing ran
