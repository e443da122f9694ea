"""The prefix cache: full KV blocks that sequences wrote, found again by their tokens and position.

    cache = PrefixCache(pool)
    cache.insert(prompt, blocks)      # a 200-token prompt's 3 full blocks (64 + 64 + 64 tokens) are now cached
    cache.match(prompt2)              # [b0, b1]: prompt2 starts with the same 128 tokens (each block ref'ed)
    cache.hit_rate                    # hit_tokens / query_tokens over every match()

A block's key is a digest of (its parent block's key, its 64 token ids), chained from a fixed root: the same 64
ids after another prefix, or at another position, are another key, because a block's K/V depend on every token
before it. match() walks the chain from the root and stops at the first key not cached, so it never returns a
chain with a hole, even after the pool evicted a block in the middle (evicted blocks are forgotten: forget());
a descendant of an evicted block stays cached, unreachable until the same prefix is written again, and is evicted
in its turn. At most (len(tokens) - 1) // 64 blocks match: the last prompt token is always computed, since its
logits give the first generated token.
"""

from __future__ import annotations

import hashlib
from array import array

from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE, BlockPool

ROOT_KEY = b"fdpp-kv-prefix"  # the parent key of a sequence's first block


def chain_keys(tokens, known=()) -> list[bytes]:
    """The keys of every full block of `tokens`, reusing `known` (the keys of a prefix of these tokens) as is:
    chain_keys(ids[:130]) has 2 keys; chain_keys(ids[:200], that) computes only the third."""
    keys = list(known)
    parent = keys[-1] if keys else ROOT_KEY
    for start in range(len(keys) * KV_BLOCK_SIZE, len(tokens) - KV_BLOCK_SIZE + 1, KV_BLOCK_SIZE):
        # a 128-bit digest: a collision would hand a sequence another prefix's K/V, so no 64-bit hash()
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(array("q", tokens[start:start + KV_BLOCK_SIZE]).tobytes())
        parent = digest.digest()
        keys.append(parent)
    return keys


class PrefixCache:
    def __init__(self, pool: BlockPool):
        self.pool = pool
        self._block_of: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self.hit_tokens = 0
        self.query_tokens = 0
        pool.attach_cache(self)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens found cached over prompt tokens asked for (0.0 before any match)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def __len__(self) -> int:
        return len(self._block_of)

    def match(self, tokens, keys: list[bytes] | None = None) -> list[int]:
        """The blocks of the longest cached chain that starts `tokens`, at most (len(tokens) - 1) // 64 of them,
        each ref'ed for the caller (who unrefs them on release). `keys`: chain_keys(tokens) if already known."""
        limit = max(0, (len(tokens) - 1) // KV_BLOCK_SIZE)
        keys = chain_keys(tokens[:limit * KV_BLOCK_SIZE]) if keys is None else keys[:limit]
        blocks = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            blocks.append(block)
        for block in blocks:
            self.pool.ref(block)
        self.query_tokens += len(tokens)
        self.hit_tokens += len(blocks) * KV_BLOCK_SIZE
        return blocks

    def insert(self, tokens, blocks: list[int], keys: list[bytes] | None = None) -> None:
        """Cache the full blocks of a sequence whose K/V for `tokens` are written in `blocks` (its table, in
        order; the caller holds them). Idempotent. A key already cached keeps its block (this one stays the
        sequence's own); a block already cached under a key is not cached twice."""
        keys = chain_keys(tokens) if keys is None else keys
        for key, block in zip(keys, blocks):
            if key in self._block_of or block in self._key_of:
                continue
            self._block_of[key] = block
            self._key_of[block] = key
            self.pool.mark_cached(block)

    def forget(self, block: int) -> None:
        """The pool evicted `block`: its key is no longer cached (its descendants become unreachable)."""
        del self._block_of[self._key_of.pop(block)]

    def check(self) -> None:
        """AssertionError naming the block unless keys and blocks map one to one and match the pool's cached set."""
        for key, block in self._block_of.items():
            if self._key_of.get(block) != key:
                raise AssertionError(f"prefix cache: KV block {block} is cached under two keys or none")
        cached, pooled = set(self._key_of), self.pool.cached
        if len(cached) != len(self._block_of) or cached != pooled:
            stray = sorted(cached ^ pooled)
            raise AssertionError(f"prefix cache and pool disagree on the cached KV blocks {stray}")
