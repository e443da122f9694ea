"""The block pool of the paged KV cache: which 64-token blocks are free, how many owners hold each, which to evict.

    pool = BlockPool(8)            # ids 1..7 usable; 0 is the null block, never handed out
    a = pool.allocate(3)           # [1, 2, 3], each referenced once; all or nothing (OutOfBlocks)
    pool.ref(a[0])                 # a second owner (a sequence sharing a cached prefix block)
    pool.unref(a[0]); pool.free_count   # 4: blocks 4..7
    pool.check([a])                # every invariant, refcounts against the owners' block lists

A block is in exactly one state: free (on the free list), referenced (refcount > 0), or cached and unreferenced
(its content is in the prefix cache, prefix.py, and no sequence holds it). Cached unreferenced blocks count as free:
when the free list runs dry, allocate() takes the least recently released one and the cache forgets its key. The
pool is host bookkeeping only; the memory is the engine's pools [num_blocks, Hkv, KV_BLOCK_SIZE, D].
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.errors import FdppError

# Tokens per block: the attention contract's constant, which the kernels' table reads are built around.
KV_BLOCK_SIZE = int(load_contract("AsyncSoftmaxAttention").raw["kv_block_size"])
NULL_BLOCK = 0  # every unused table entry points here: padding rows write into it, nothing real reads it


class OutOfBlocks(FdppError):
    """A step or an admission needs more KV blocks than are free; the caller preempts or waits."""


def blocks_for(tokens: int) -> int:
    """Blocks that hold `tokens` positions: blocks_for(64) == 1, blocks_for(65) == 2, blocks_for(0) == 0."""
    return -(-tokens // KV_BLOCK_SIZE)


class BlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise FdppError(f"a KV block pool needs at least 2 blocks (the null block and one usable), got "
                            f"{num_blocks}; give the KV cache more memory (--kv-memory)")
        self.num_blocks = num_blocks
        self._refs = [0] * num_blocks
        self._free = list(range(num_blocks - 1, NULL_BLOCK, -1))  # a stack: block 1 is handed out first
        self._cached: set[int] = set()            # blocks whose content the prefix cache holds
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; least recent first
        self._cache = None                        # the PrefixCache told about evictions (attach_cache)

    @property
    def total(self) -> int:
        """Usable blocks (the null block excluded)."""
        return self.num_blocks - 1

    @property
    def free_count(self) -> int:
        """Blocks allocate() can hand out: the free list and the evictable cached blocks."""
        return len(self._free) + len(self._evictable)

    @property
    def used_count(self) -> int:
        """Blocks some owner references."""
        return self.total - self.free_count

    @property
    def cached_count(self) -> int:
        """Blocks whose content the prefix cache holds, referenced or not."""
        return len(self._cached)

    @property
    def cached(self) -> frozenset:
        """The blocks whose content the prefix cache holds."""
        return frozenset(self._cached)

    def refcount(self, block: int) -> int:
        return self._refs[block]

    def attach_cache(self, cache) -> None:
        """`cache.forget(block)` is called when a cached block is evicted; `cache.check()` runs in check()."""
        if self._cache is not None:
            raise ValueError("this BlockPool already has a prefix cache")
        self._cache = cache

    def allocate(self, n: int) -> list[int]:
        """`n` blocks, each referenced once, or OutOfBlocks and nothing allocated. The free list goes first, then
        the least recently released cached blocks (the prefix cache forgets them)."""
        if n < 0:
            raise ValueError(f"allocate({n}): a block count is >= 0")
        if n > self.free_count:
            raise self.out_of_blocks(n)
        taken = [self._free.pop() for _ in range(min(n, len(self._free)))]
        while len(taken) < n:
            block, _ = self._evictable.popitem(last=False)
            self._cached.discard(block)
            self._cache.forget(block)
            taken.append(block)
        for block in taken:
            self._refs[block] = 1
        return taken

    def out_of_blocks(self, needed: int) -> OutOfBlocks:
        """The error for a request of `needed` blocks that the pool cannot meet."""
        return OutOfBlocks(f"need {needed} KV blocks, {self.free_count} of {self.total} are free; give the KV cache "
                           "more memory (--kv-memory) or run fewer or shorter sequences at once")

    def ref(self, block: int) -> None:
        """One more owner of a referenced or cached block (a free block is allocated, not ref'ed)."""
        self._check_id(block)
        if self._refs[block] == 0:
            if block not in self._evictable:
                raise ValueError(f"ref of KV block {block}, which is free; allocate() hands out free blocks")
            del self._evictable[block]
        self._refs[block] += 1

    def unref(self, block: int) -> None:
        """One owner fewer; at zero a cached block becomes evictable (most recent), any other block free."""
        self._check_id(block)
        if self._refs[block] == 0:
            raise ValueError(f"unref of KV block {block}, which no one references")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._cached:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def mark_cached(self, block: int) -> None:
        """The prefix cache took `block`'s content (the block is referenced: its owner just wrote it)."""
        self._check_id(block)
        if self._cache is None:
            raise ValueError("mark_cached on a BlockPool with no prefix cache attached (attach_cache)")
        if self._refs[block] == 0:
            raise ValueError(f"KV block {block} is cached while unreferenced; cache blocks their owner holds")
        self._cached.add(block)

    def check(self, holders=None) -> None:
        """Raise AssertionError naming the block unless: the null block is never free, held or cached; every
        other block is in exactly one of free / referenced / cached-unreferenced; and, given `holders` (every
        owner's block list), each refcount equals the number of times the owners hold the block."""
        free = Counter(self._free)
        for block in range(self.num_blocks):
            refs, cached = self._refs[block], block in self._cached
            states = [name for name, on in (("free", free[block] > 0), ("referenced", refs > 0),
                                            ("evictable", block in self._evictable)) if on]
            if block == NULL_BLOCK:
                if states or cached:
                    raise AssertionError(f"the null KV block {block} is {states or 'cached'}")
                continue
            if len(states) != 1 or free[block] > 1:
                raise AssertionError(f"KV block {block} is in states {states} (free list x{free[block]}); "
                                     "expected exactly one")
            if (block in self._evictable) != (cached and refs == 0):
                raise AssertionError(f"KV block {block}: cached={cached}, refcount {refs}, but evictable="
                                     f"{block in self._evictable}")
        if holders is not None:
            held = Counter(block for blocks in holders for block in blocks)
            for block in range(self.num_blocks):
                if held[block] != self._refs[block]:
                    raise AssertionError(f"KV block {block} has refcount {self._refs[block]} but {held[block]} "
                                         "owner references")
        if self._cache is not None:
            self._cache.check()

    def _check_id(self, block: int) -> None:
        if not NULL_BLOCK < block < self.num_blocks:
            raise ValueError(f"KV block id {block} is not a usable block (1..{self.num_blocks - 1})")
