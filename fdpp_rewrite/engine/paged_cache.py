"""The paged KV cache: one block pool per cache input, a block table per sequence row, blocks allocated as a
sequence grows and given back when it retires (the design: /work/notes/paged_design.md, docs/design.md).

    cache = PagedCache(names, max_batch=256, max_seq=4096, kv_heads=8, head_dim=128, dtype=torch.float16,
                       device=dev, num_blocks=5000)
    cache.grow([(3, 200)])             # slot 3 will hold 200 tokens: blocks for positions 0..199, table row 3
    cache.rows([3, 0])                 # the host table rows a step of slots 3 and 0 reads (numpy int32 [2, W])
    cache.release(3)                   # its blocks unreferenced (prefix-cached ones stay, evictable), row zeroed

Pool tensors are [num_blocks, Hkv, 64, D]; block 0 is the null block, never allocated: every unused table entry is
0, so a padding row's K/V write lands there and nothing real reads it. The table lives on the host (numpy int32
[max_batch, W], W = ceil(max_seq / 64)); a step uploads the rows it runs into its own static device buffer
(paged_engine.py), so captured steps replay with new rows and no host synchronization. Lengths are host-only: a
step uploads its past_len with its rows.

Prefix reuse: a slot's SequenceBlocks records the prompt ids its chunks wrote; after every chunk its full blocks
are published to the PrefixCache, and attach() gives a fresh slot the cached blocks of a prompt's prefix. Once a
slot decodes, its ids are on the device only: it publishes nothing more (`known` turns False).
"""

from __future__ import annotations

import numpy as np
import torch

from fdpp_rewrite.engine.kv_cache import check_fits
from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE, BlockPool, blocks_for
from fdpp_rewrite.engine.paged.prefix import PrefixCache
from fdpp_rewrite.engine.paged.sequence import SequenceBlocks, grow_all
from fdpp_rewrite.errors import FdppError


class PagedCache:
    def __init__(self, names: list, max_batch: int, max_seq: int, kv_heads: int, head_dim: int, dtype, device,
                 num_blocks: int, prefix_caching: bool = True):
        self.names, self.max_batch, self.max_seq, self.device = list(names), max_batch, max_seq, device
        self.block_size = KV_BLOCK_SIZE
        shape = (num_blocks, kv_heads, KV_BLOCK_SIZE, head_dim)
        self.tensors = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.names]
        self.width = blocks_for(max_seq)
        self.table = np.zeros((max_batch, self.width), dtype=np.int32)
        self.pool = BlockPool(num_blocks)
        self.prefix = PrefixCache(self.pool) if prefix_caching else None
        self.sequences = [SequenceBlocks(self.pool, self.prefix) for _ in range(max_batch)]
        self.lengths = [0] * max_batch
        self.known = [True] * max_batch  # whether the slot's SequenceBlocks holds every id written (no decode yet)

    # -- what callers read -----------------------------------------------------------------------------------------

    @property
    def total_blocks(self) -> int:
        return self.pool.total

    @property
    def free_blocks(self) -> int:
        return self.pool.free_count

    @property
    def used_blocks(self) -> int:
        return self.pool.used_count

    @property
    def past_len(self) -> torch.Tensor:
        """The slots' lengths as a CPU tensor (a contiguous engine's past_len lives on the device)."""
        return torch.tensor(self.lengths, dtype=torch.int64)

    def views(self) -> dict:
        """{cache input name: its pool} (a step reads and writes the pools through its table rows)."""
        return dict(zip(self.names, self.tensors))

    def rows(self, slots: list[int]) -> np.ndarray:
        """The host table rows of `slots` (a copy: the caller uploads it)."""
        return self.table[slots]

    # -- growing and retiring --------------------------------------------------------------------------------------

    def check_fits(self, longest: int) -> None:
        check_fits(longest, self.max_seq)

    def blocks_needed(self, slot: int, length: int) -> int:
        """New blocks slot `slot` needs to hold `length` tokens."""
        return self.sequences[slot].blocks_needed(length)

    def grow(self, growths: list) -> None:
        """Allocate what each (slot, length) needs to hold `length` tokens, all or nothing (OutOfBlocks, nothing
        allocated, when they do not fit), and enter the new blocks in the slots' table rows."""
        entries = grow_all((self.sequences[slot], length) for slot, length in growths)
        for (slot, _), new in zip(growths, entries):
            for index, block in new:
                self.table[slot, index] = block

    def wrote_prompt(self, slot: int, ids: list[int], length: int) -> None:
        """Slot `slot` now holds `length` tokens, the last of them these prompt `ids`; its full blocks are published
        to the prefix cache (idempotent: a block already cached is kept)."""
        self.lengths[slot] = length
        if self.known[slot]:
            self.sequences[slot].append(ids)
            self.sequences[slot].publish()

    def decoded(self, slots: list[int]) -> None:
        """`slots` each took one generated token (its id stays on the device: the slot publishes nothing more)."""
        for slot in slots:
            self.lengths[slot] += 1
            self.known[slot] = False

    def attach(self, slot: int, prompt_ids: list[int]) -> int:
        """A free slot takes the cached full blocks of `prompt_ids`' prefix; returns the tokens they hold."""
        if self.lengths[slot]:
            raise FdppError(f"slot {slot} holds {self.lengths[slot]} tokens; attach a prefix to a free slot")
        sequence = self.sequences[slot]
        tokens = sequence.attach_prefix(list(prompt_ids))
        self.table[slot, :len(sequence.blocks)] = sequence.blocks
        self.lengths[slot] = tokens
        return tokens

    def release(self, slot: int) -> None:
        self.sequences[slot].release()
        self.table[slot] = 0
        self.lengths[slot] = 0
        self.known[slot] = True

    def assume(self, slot: int, length: int) -> None:
        """Warm-up only: the slot holds `length` tokens of junk (its blocks allocated; OutOfBlocks if they are not
        free)."""
        self.grow([(slot, length)])
        self.lengths[slot] = length
        self.known[slot] = False

    def reset(self) -> None:
        for slot in range(self.max_batch):
            if self.lengths[slot] or self.sequences[slot].blocks:
                self.release(slot)
