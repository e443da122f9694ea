"""One sequence's blocks (engine/paged/sequence.py): growth all or nothing, the table entries it returns, prefix
attach and publish, release keeping cached blocks cached."""

import pytest

from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE, BlockPool, OutOfBlocks
from fdpp_rewrite.engine.paged.prefix import PrefixCache
from fdpp_rewrite.engine.paged.sequence import SequenceBlocks, grow_all

B = KV_BLOCK_SIZE


def test_grow_returns_the_new_table_entries_and_is_all_or_nothing():
    pool = BlockPool(5)
    seq = SequenceBlocks(pool)
    assert seq.blocks_needed(0) == 0 and seq.blocks_needed(1) == 1 and seq.blocks_needed(B + 1) == 2
    entries = seq.grow(B + 1)
    assert [index for index, _ in entries] == [0, 1] and [block for _, block in entries] == seq.blocks
    assert seq.grow(2 * B) == [] and seq.blocks_needed(2 * B) == 0
    assert seq.blocks_needed(5 * B) == 3
    with pytest.raises(OutOfBlocks):
        seq.grow(5 * B)
    assert len(seq.blocks) == 2 and pool.free_count == 2  # nothing taken
    assert [index for index, _ in seq.grow(3 * B + 7)] == [2, 3]
    pool.check([seq.blocks])
    seq.release()
    assert seq.blocks == [] and pool.free_count == 4
    pool.check([])


def test_append_refuses_tokens_past_the_blocks_held():
    seq = SequenceBlocks(BlockPool(3))
    seq.grow(3)
    seq.append([1, 2, 3])
    with pytest.raises(ValueError, match="grow"):
        seq.append(list(range(B)))
    assert seq.tokens == [1, 2, 3]


def test_a_second_sequence_shares_the_published_prefix_and_writes_after_it():
    pool = BlockPool(16)
    prefix = PrefixCache(pool)
    system = list(range(1000, 1000 + 2 * B))
    first = SequenceBlocks(pool, prefix)
    assert first.attach_prefix(system + [1, 2, 3]) == 0
    first.grow(2 * B + 3)
    first.append(system + [1, 2, 3])
    first.publish()
    assert len(prefix) == 2

    second = SequenceBlocks(pool, prefix)
    assert second.attach_prefix(system + [7, 8]) == 2 * B
    assert second.blocks == first.blocks[:2] and second.tokens == system
    assert [pool.refcount(block) for block in second.blocks] == [2, 2]
    (entry,) = second.grow(2 * B + 2)
    assert entry[0] == 2 and entry[1] not in first.blocks  # its own block after the shared ones
    pool.check([first.blocks, second.blocks])

    first.release()
    second.release()
    assert pool.used_count == 0 and pool.free_count == pool.total and pool.cached_count == 2
    pool.check([])


def test_a_prompt_of_exactly_the_cached_blocks_still_computes_its_last_token():
    pool = BlockPool(8)
    prefix = PrefixCache(pool)
    prompt = list(range(2 * B))
    seq = SequenceBlocks(pool, prefix)
    seq.grow(len(prompt))
    seq.append(prompt)
    seq.publish()
    again = SequenceBlocks(pool, prefix)
    assert again.attach_prefix(prompt) == B  # one block, not two: the 128th token's logits are needed
    assert again.blocks_needed(len(prompt)) == 1
    with pytest.raises(ValueError, match="release"):
        again.attach_prefix(prompt)


def test_publish_as_decode_fills_blocks_and_without_a_cache_it_is_a_no_op():
    pool = BlockPool(8)
    prefix = PrefixCache(pool)
    seq = SequenceBlocks(pool, prefix)
    for token in range(2 * B + 5):  # one token per step
        seq.grow(len(seq.tokens) + 1)
        seq.append([token])
        seq.publish()
    assert len(prefix) == 2 and pool.cached == frozenset(seq.blocks[:2])
    plain = SequenceBlocks(pool)
    assert plain.attach_prefix(list(range(3 * B))) == 0
    plain.grow(B)
    plain.append(list(range(B)))
    plain.publish()
    assert len(prefix) == 2
    pool.check([seq.blocks, plain.blocks])


def test_grow_all_grows_a_steps_sequences_together_or_none():
    pool = BlockPool(6)
    a, b, c = (SequenceBlocks(pool) for _ in range(3))
    a.grow(B)
    grown = grow_all([(a, B + 1), (b, 2 * B), (c, 1)])
    assert grown == [[(1, a.blocks[1])], [(0, b.blocks[0]), (1, b.blocks[1])], [(0, c.blocks[0])]]
    assert pool.free_count == 0
    a.release()
    with pytest.raises(OutOfBlocks, match="need 3 KV blocks, 2 of 5 are free"):
        grow_all([(a, 1), (b, 3 * B), (c, B + 1)])
    assert (a.blocks, len(b.blocks), len(c.blocks)) == ([], 2, 1)  # the first fit, but none grew
    assert grow_all([]) == []
    pool.check([a.blocks, b.blocks, c.blocks])
