"""The KV block pool (engine/paged/blocks.py): all-or-nothing allocation, reference counts, the null block, LRU
eviction of cached unreferenced blocks, and check() catching a broken invariant."""

import subprocess
import sys
from pathlib import Path

import pytest

import fdpp_rewrite

from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE, NULL_BLOCK, BlockPool, OutOfBlocks, blocks_for
from fdpp_rewrite.engine.paged.prefix import PrefixCache
from fdpp_rewrite.errors import FdppError


def test_block_size_is_the_attention_contracts():
    assert KV_BLOCK_SIZE == load_contract("AsyncSoftmaxAttention").raw["kv_block_size"] == 64
    assert [blocks_for(n) for n in (0, 1, 64, 65, 128, 8192)] == [0, 1, 1, 2, 2, 128]


def test_the_package_is_pure_python():
    """The scheduler thread and CPU-only tools use it: importing it must not pull torch or numpy in."""
    code = ("import sys, fdpp_rewrite.engine.paged.sequence, fdpp_rewrite.engine.paged.sizing; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy'}))")
    package_root = Path(fdpp_rewrite.__file__).parent.parent
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=package_root)
    assert result.stdout.strip() == "[]"


def test_allocate_is_all_or_nothing_and_never_hands_out_the_null_block():
    pool = BlockPool(6)
    assert (pool.total, pool.free_count, pool.used_count) == (5, 5, 0)
    first = pool.allocate(3)
    assert NULL_BLOCK not in first and len(set(first)) == 3
    with pytest.raises(OutOfBlocks, match="need 3 KV blocks, 2 of 5 are free"):
        pool.allocate(3)
    assert pool.free_count == 2 and pool.used_count == 3  # the refused call took nothing
    rest = pool.allocate(2)
    assert sorted(first + rest) == [1, 2, 3, 4, 5]
    assert pool.allocate(0) == []
    with pytest.raises(OutOfBlocks):
        pool.allocate(1)
    pool.check([first, rest])


def test_out_of_blocks_is_a_one_line_fdpp_error():
    with pytest.raises(FdppError) as caught:
        BlockPool(3).allocate(5)
    assert isinstance(caught.value, OutOfBlocks) and "\n" not in str(caught.value)
    with pytest.raises(FdppError, match="at least 2 blocks"):
        BlockPool(1)


def test_reference_counts_free_a_block_at_the_last_owner():
    pool = BlockPool(4)
    (block,) = pool.allocate(1)
    pool.ref(block)
    assert pool.refcount(block) == 2
    pool.check([[block], [block]])
    pool.unref(block)
    assert pool.refcount(block) == 1 and pool.free_count == 2
    pool.unref(block)
    assert pool.refcount(block) == 0 and pool.free_count == 3
    with pytest.raises(ValueError, match="which no one references"):
        pool.unref(block)
    with pytest.raises(ValueError, match="which is free"):
        pool.ref(block)
    with pytest.raises(ValueError, match="not a usable block"):
        pool.ref(NULL_BLOCK)
    with pytest.raises(ValueError, match="not a usable block"):
        pool.unref(4)
    with pytest.raises(ValueError, match=">= 0"):
        pool.allocate(-1)
    with pytest.raises(ValueError, match="no prefix cache attached"):
        pool.mark_cached(pool.allocate(1)[0])
    pool.check([[1]])


def test_cached_unreferenced_blocks_count_as_free_and_are_evicted_least_recent_first():
    pool = BlockPool(5)
    cache = PrefixCache(pool)
    held = pool.allocate(4)
    tokens = list(range(4 * KV_BLOCK_SIZE))
    cache.insert(tokens, held)
    assert pool.cached_count == 4 and pool.free_count == 0
    for block in (held[2], held[0], held[3], held[1]):  # release order = LRU order
        pool.unref(block)
    assert pool.free_count == 4 and pool.used_count == 0 and len(cache) == 4
    pool.check([])
    assert pool.allocate(1) == [held[2]]
    assert pool.cached_count == 3 and len(cache) == 3
    pool.ref(held[0])  # a match takes it back: no longer evictable
    assert pool.allocate(2) == [held[3], held[1]]
    with pytest.raises(OutOfBlocks):
        pool.allocate(1)
    pool.check([[held[2]], [held[0]], [held[3], held[1]]])


def test_the_free_list_goes_before_any_cached_block():
    pool = BlockPool(4)
    cache = PrefixCache(pool)
    (cached,) = pool.allocate(1)
    cache.insert(list(range(KV_BLOCK_SIZE)), [cached])
    pool.unref(cached)
    assert cached not in pool.allocate(2) and len(cache) == 1
    assert pool.allocate(1) == [cached] and len(cache) == 0


def test_check_names_the_block_that_breaks_an_invariant():
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    with pytest.raises(AssertionError, match=f"KV block {blocks[1]} has refcount 1 but 0 owner"):
        pool.check([blocks[:1]])
    pool._free.append(blocks[0])  # corrupt: a referenced block also on the free list
    with pytest.raises(AssertionError, match=f"KV block {blocks[0]} is in states"):
        pool.check()
    pool._free.pop()
    pool._free.append(NULL_BLOCK)
    with pytest.raises(AssertionError, match="null KV block"):
        pool.check()
