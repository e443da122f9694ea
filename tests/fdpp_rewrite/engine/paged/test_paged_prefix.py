"""The prefix cache (engine/paged/prefix.py): keys by content and position, the (len - 1) // 64 cap, idempotent
insert, and no chain with a hole after an eviction."""

from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE, BlockPool, blocks_for
from fdpp_rewrite.engine.paged.prefix import PrefixCache, chain_keys

B = KV_BLOCK_SIZE


def _cached(pool, prefix, tokens):
    """Write `tokens` into fresh blocks, cache them, release them (cached, unreferenced); returns the blocks."""
    blocks = pool.allocate(blocks_for(len(tokens)))
    prefix.insert(tokens, blocks)
    for block in reversed(blocks):
        pool.unref(block)
    return blocks


def test_keys_chain_content_and_position():
    ids = list(range(3 * B + 10))
    keys = chain_keys(ids)
    assert len(keys) == 3 and len(set(keys)) == 3 and chain_keys(ids[:B - 1]) == []
    assert chain_keys(ids, keys[:1]) == keys  # extending known keys gives the same chain
    assert chain_keys(ids[B:2 * B])[0] != keys[1]  # the same 64 ids as a first block: another key
    other = [7] + ids[1:]
    assert all(a != b for a, b in zip(chain_keys(other), keys))  # one token changed: every later key changes


def test_match_returns_the_longest_cached_chain_ref_ed_and_counts_hits():
    pool = BlockPool(10)
    prefix = PrefixCache(pool)
    ids = list(range(3 * B))
    blocks = _cached(pool, prefix, ids)
    assert pool.used_count == 0 and pool.free_count == 9
    got = prefix.match(ids[:2 * B] + [5, 6, 7])
    assert got == blocks[:2] and [pool.refcount(b) for b in blocks] == [1, 1, 0]
    assert (prefix.hit_tokens, prefix.query_tokens) == (2 * B, 2 * B + 3)
    diverged = ids[:B] + [9] * B + [1]
    assert prefix.match(diverged) == blocks[:1]
    assert prefix.match(ids[B:] + [1]) == []  # the same ids one block later are not cached
    assert (prefix.hit_tokens, prefix.query_tokens) == (3 * B, 2 * B + 3 + 2 * B + 1 + 2 * B + 1)
    assert prefix.hit_rate == 3 * B / (6 * B + 5)
    pool.check([got, blocks[:1]])


def test_match_leaves_the_last_prompt_token_to_compute():
    pool = BlockPool(10)
    prefix = PrefixCache(pool)
    ids = list(range(3 * B))
    blocks = _cached(pool, prefix, ids)
    assert prefix.match(ids) == blocks[:2]            # (192 - 1) // 64 = 2
    assert prefix.match(ids + [1]) == blocks           # (193 - 1) // 64 = 3
    assert prefix.match(ids[:B]) == [] and prefix.match(ids[:B + 1]) == blocks[:1] and prefix.match([]) == []
    assert prefix.hit_rate == 6 * B / (3 * B + 3 * B + 1 + B + B + 1 + 0)


def test_insert_is_idempotent_and_keeps_the_first_block_of_a_key():
    pool = BlockPool(10)
    prefix = PrefixCache(pool)
    ids = list(range(2 * B + 1))
    first = pool.allocate(3)
    prefix.insert(ids, first)
    prefix.insert(ids, first)
    assert len(prefix) == 2 and pool.cached == frozenset(first[:2])  # the partial third block is not cached
    second = pool.allocate(3)
    prefix.insert(ids, second)  # the same content written again elsewhere: the cache keeps the first copy
    assert len(prefix) == 2 and pool.cached == frozenset(first[:2])
    prefix.insert([5] * B, first[:1])  # a cached block is never cached under a second key
    assert len(prefix) == 2
    for block in second:
        pool.unref(block)
    assert pool.free_count == 6 and pool.cached_count == 2  # the second copy is plain free, not cached
    pool.check([first])


def test_an_evicted_block_breaks_the_chain_and_its_descendants_return_with_it():
    pool = BlockPool(4)
    prefix = PrefixCache(pool)
    ids = list(range(3 * B + 1))
    blocks = pool.allocate(3)
    prefix.insert(ids, blocks)
    for block in (blocks[1], blocks[2], blocks[0]):  # the middle block is the least recently released
        pool.unref(block)
    (taken,) = pool.allocate(1)
    assert taken == blocks[1] and len(prefix) == 2
    got = prefix.match(ids)
    assert got == blocks[:1]  # the third block is still cached but unreachable: no chain with a hole
    pool.check([[taken], got])
    # the same prefix written again brings the whole chain back
    prefix.insert(ids, [got[0], taken])
    assert len(prefix) == 3
    again = prefix.match(ids)
    assert again == [blocks[0], taken, blocks[2]]
    pool.check([[taken], got, again])
