"""One sequence's KV blocks: its block-table row on the host, and the token ids whose K/V they hold.

    seq = SequenceBlocks(pool, prefix)
    seq.attach_prefix(prompt)     # 128: the first two blocks of a 150-token prompt were cached (now shared)
    seq.grow(150)                 # [(2, 9)]: positions 128..191 go to block 9, table entry 2
    seq.append(prompt[128:])      # after the step wrote them
    seq.publish()                 # its full blocks into the prefix cache (here: the two it shares already)
    seq.release()                 # unref all; cached blocks stay cached (evictable), the others are free
    grow_all([(a, 300), (b, 41)])  # a step's growth over several sequences, all or nothing

Entry j of `blocks` holds positions [64 j, 64 j + 64). Shared prefix blocks are full and never written again: a
match leaves at least the last prompt token to compute, so writes start in a block of the sequence's own.
"""

from __future__ import annotations

from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE, BlockPool, blocks_for
from fdpp_rewrite.engine.paged.prefix import PrefixCache, chain_keys


class SequenceBlocks:
    def __init__(self, pool: BlockPool, prefix: PrefixCache | None = None):
        self.pool, self.prefix = pool, prefix
        self.blocks: list[int] = []
        self.tokens: list[int] = []      # ids whose K/V are written, position order
        self._keys: list[bytes] = []     # chain keys of the full blocks of `tokens` computed so far

    def attach_prefix(self, prompt) -> int:
        """Take the cached blocks that start `prompt` (the sequence must hold none); returns the tokens they hold
        (0 on a miss or without a prefix cache). The prompt's remaining tokens are then computed from there."""
        if self.blocks:
            raise ValueError("attach_prefix on a sequence that already holds KV blocks; release() it first")
        if self.prefix is None:
            return 0
        keys = chain_keys(prompt)
        self.blocks = self.prefix.match(prompt, keys)
        cached = len(self.blocks) * KV_BLOCK_SIZE
        self.tokens, self._keys = list(prompt[:cached]), keys[:len(self.blocks)]
        return cached

    def blocks_needed(self, length: int) -> int:
        """New blocks that growing to `length` positions would allocate."""
        return max(0, blocks_for(length) - len(self.blocks))

    def grow(self, length: int) -> list[tuple[int, int]]:
        """Allocate what `length` positions need, all or nothing (OutOfBlocks); returns the new table entries
        [(index, block), ...] (empty when the blocks held already reach `length`)."""
        start = len(self.blocks)
        new = self.pool.allocate(self.blocks_needed(length))
        self.blocks.extend(new)
        return list(enumerate(new, start))

    def append(self, ids) -> None:
        """`ids` were written after `tokens` (a prompt chunk, or decode tokens once known on the host)."""
        if len(self.tokens) + len(ids) > len(self.blocks) * KV_BLOCK_SIZE:
            raise ValueError(f"{len(self.tokens)} + {len(ids)} tokens do not fit the sequence's "
                             f"{len(self.blocks)} KV blocks; grow() first")
        self.tokens.extend(ids)

    def publish(self) -> None:
        """Insert the full blocks of `tokens` into the prefix cache (no-op without one). Cheap to repeat: only
        blocks filled since the last call are hashed."""
        if self.prefix is not None:
            self._keys = chain_keys(self.tokens, self._keys)
            self.prefix.insert(self.tokens, self.blocks, self._keys)

    def release(self) -> None:
        """Unref every block, last first: of a released chain, the pool then evicts the tail before the root,
        which the most other prompts share."""
        for block in reversed(self.blocks):
            self.pool.unref(block)
        self.blocks, self.tokens, self._keys = [], [], []


def grow_all(growths) -> list[list[tuple[int, int]]]:
    """grow() each (sequence, length) of one step, all or nothing: OutOfBlocks, with no sequence grown, when their
    new blocks together exceed the pool's free blocks. Returns each sequence's new table entries, in order."""
    growths = list(growths)
    if growths:
        pool = growths[0][0].pool
        needed = sum(seq.blocks_needed(length) for seq, length in growths)
        if needed > pool.free_count:
            raise pool.out_of_blocks(needed)
    return [seq.grow(length) for seq, length in growths]
