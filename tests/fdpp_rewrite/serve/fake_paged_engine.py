"""A paged engine double for the scheduler tests: the step API of /work/notes/paged_design.md ("Engine") on the CPU,
with its own block accounting (a pool with reference counts, a prefix cache of full blocks keyed by their whole
prefix, least-recently-used eviction of cached blocks nobody holds) and no model: the logits of a row are a fixed
function of every id in it, so greedy output depends only on the ids a sequence was fed, in order, as a real
model's does. Every call checks its arguments the way the engine does (distinct rows, non-empty chunks, OutOfBlocks
with nothing changed) and is logged in `calls`."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import torch

from fdpp_rewrite.engine.paged.blocks import OutOfBlocks


def next_logits(ids: list, vocab: int) -> torch.Tensor:
    """[vocab] scores that depend on every id of the sequence (its hash picks their shape)."""
    seed = hash(tuple(ids)) % 9973 + 1
    return torch.cos(torch.arange(1, vocab + 1, dtype=torch.float64) * seed * 0.37).float()


def greedy(prompt: list, count: int, vocab: int) -> list:
    """What a sequence alone generates: the reference of the recompute tests."""
    ids, out = list(prompt), []
    for _ in range(count):
        token = int(next_logits(ids, vocab).argmax())
        out.append(token)
        ids.append(token)
    return out


class FakeKV:
    """The pool: blocks 1..num_blocks-1 (0 is the null block), each free, held (refs > 0) or cached and unheld."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool):
        self.block_size = block_size
        self.refs = [0] * num_blocks
        self.free = list(range(num_blocks - 1, 0, -1))
        self.key_of: dict[int, tuple] = {}       # cached block -> its key (every id up to its end)
        self.block_of: dict[tuple, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached and unheld, least recently released first
        self.prefix = self if prefix_caching else None
        self.hit_tokens = self.query_tokens = 0

    @property
    def total_blocks(self) -> int:
        return len(self.refs) - 1

    @property
    def free_blocks(self) -> int:
        return len(self.free) + len(self.evictable)

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks

    def allocate(self, count: int) -> list:
        if count > self.free_blocks:
            raise OutOfBlocks(f"{count} KV blocks needed, {self.free_blocks} free")
        blocks = []
        for _ in range(count):
            if self.free:
                block = self.free.pop()
            else:
                block, _ = self.evictable.popitem(last=False)
                del self.block_of[self.key_of.pop(block)]
            self.refs[block] = 1
            blocks.append(block)
        return blocks

    def ref(self, block: int) -> None:
        if self.refs[block] == 0:
            del self.evictable[block]
        self.refs[block] += 1

    def unref(self, block: int) -> None:
        self.refs[block] -= 1
        assert self.refs[block] >= 0, f"block {block} released more often than held"
        if self.refs[block] == 0:
            if block in self.key_of:
                self.evictable[block] = None
            else:
                self.free.append(block)

    def check(self, tables: list) -> None:
        """Every block in exactly one state; each held block's refs equal the tables holding it."""
        owners = [0] * len(self.refs)
        for table in tables:
            for block in table:
                owners[block] += 1
        assert owners[0] == 0 and self.refs[0] == 0, "the null block is held"
        for block in range(1, len(self.refs)):
            states = (block in self.free) + (block in self.evictable) + (self.refs[block] > 0)
            assert states == 1, f"block {block} is in {states} states"
            assert self.refs[block] == owners[block], f"block {block}: {self.refs[block]} refs, {owners[block]} owners"
            assert block not in self.evictable or block in self.key_of, f"block {block} evictable but not cached"


class FakePagedEngine:
    paged = True
    mixed_reason = None
    manifest: dict = {}  # no tokenizer: prompts are token ids, answers comma-separated ids
    folder = Path("fake-paged")

    def __init__(self, num_blocks: int = 64, block_size: int = 16, max_batch: int = 8, max_seq: int = 1024,
                 vocab: int = 50, prefix_caching: bool = True, step_tokens: int = 2048):
        self.kv = FakeKV(num_blocks, block_size, prefix_caching)
        self.max_batch, self.max_seq, self.vocab_size, self.step_tokens = max_batch, max_seq, vocab, step_tokens
        self.backend = SimpleNamespace(name="cpu")
        self.device = torch.device("cpu")
        self.batch_buckets = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b < max_batch] + [max_batch]
        self.kv_buckets = [k for k in (64, 128, 256, 512) if k < max_seq] + [max_seq]
        self.prefill_buckets = [p for p in (16, 32, 64, 128, 256, 512) if p < max_seq] + [max_seq]
        self.ids = [[] for _ in range(max_batch)]     # the ids each row holds
        self.tables = [[] for _ in range(max_batch)]  # its blocks
        self.decoded = [False] * max_batch            # a row that decoded publishes nothing more (ids on device)
        self.calls: list = []                         # ("step", decode slots, chunk (slot, len), padded), ...

    @property
    def lengths(self) -> list:
        return [len(ids) for ids in self.ids]

    def chunk_bucket(self, chunk: int) -> int:
        return next(p for p in self.prefill_buckets if p >= min(chunk, self.max_seq))

    def step_budget(self) -> tuple[int, int]:
        return self.max_batch, self.step_tokens

    def blocks_needed(self, decode_slots: list, chunks: list) -> int:
        grown = [(slot, 1) for slot in decode_slots] + [(slot, len(ids)) for slot, ids in chunks]
        return sum(max(0, -(-(len(self.ids[slot]) + n) // self.kv.block_size) - len(self.tables[slot]))
                   for slot, n in grown)

    def attach_prefix(self, slot: int, prompt: list) -> int:
        assert not self.ids[slot] and not self.tables[slot], f"attach_prefix to a busy row {slot}"
        self.calls.append(("attach", slot))
        if self.kv.prefix is None:
            return 0
        size, blocks = self.kv.block_size, []
        for index in range((len(prompt) - 1) // size):  # the last prompt token is always computed
            block = self.kv.block_of.get(tuple(prompt[:(index + 1) * size]))
            if block is None:
                break
            self.kv.ref(block)
            blocks.append(block)
        self.tables[slot] = blocks
        self.ids[slot] = list(prompt[:len(blocks) * size])
        self.kv.hit_tokens += len(blocks) * size
        self.kv.query_tokens += len(prompt)
        return len(blocks) * size

    def step(self, decode_slots: list, tokens, chunks: list, padded: int | None = None):
        rows = list(decode_slots) + [slot for slot, _ in chunks]
        assert rows and len(set(rows)) == len(rows) and all(0 <= s < self.max_batch for s in rows), rows
        assert len(tokens) == len(decode_slots) and all(self.ids[s] for s in decode_slots)
        assert all(ids and (padded is None or len(ids) <= padded) for _, ids in chunks)
        assert all(len(self.ids[s]) + 1 <= self.max_seq for s in decode_slots)
        needed = self.blocks_needed(decode_slots, chunks)
        if needed > self.kv.free_blocks:
            raise OutOfBlocks(f"the step needs {needed} KV blocks, {self.kv.free_blocks} are free")
        self.calls.append(("step", list(decode_slots), [(slot, len(ids)) for slot, ids in chunks], padded))
        grown = [(slot, [int(t)]) for slot, t in zip(decode_slots, tokens.tolist())] + list(chunks)
        for slot, ids in grown:
            self.ids[slot] += list(ids)
            want = -(-len(self.ids[slot]) // self.kv.block_size) - len(self.tables[slot])
            self.tables[slot] += self.kv.allocate(want)
        for slot in decode_slots:
            self.decoded[slot] = True
        for slot, _ in chunks:
            if not self.decoded[slot]:
                self._publish(slot)
        decode = [next_logits(self.ids[s], self.vocab_size) for s in decode_slots]
        chunk = [next_logits(self.ids[s], self.vocab_size) for s, _ in chunks]
        empty = torch.empty(0, self.vocab_size)
        return (torch.stack(decode) if decode else empty), (torch.stack(chunk) if chunk else empty)

    def _publish(self, slot: int) -> None:
        size = self.kv.block_size
        for index in range(len(self.ids[slot]) // size):
            key, block = tuple(self.ids[slot][:(index + 1) * size]), self.tables[slot][index]
            if key not in self.kv.block_of and block not in self.kv.key_of:
                self.kv.block_of[key], self.kv.key_of[block] = block, key

    def release(self, slot: int) -> None:
        for block in self.tables[slot]:
            self.kv.unref(block)
        self.tables[slot], self.ids[slot], self.decoded[slot] = [], [], False

    def reset(self) -> None:
        for slot in range(self.max_batch):
            self.release(slot)

    def assume_length(self, slot: int, length: int) -> None:
        """Warm-up: the row holds `length` junk ids (OutOfBlocks, nothing changed, if their blocks are not free)."""
        self.release(slot)
        self.tables[slot] = self.kv.allocate(-(-length // self.kv.block_size))
        self.ids[slot], self.decoded[slot] = [0] * length, True

    def check(self) -> None:
        self.kv.check(self.tables)
        for slot, (ids, table) in enumerate(zip(self.ids, self.tables)):
            assert len(table) == -(-len(ids) // self.kv.block_size), f"row {slot}: {len(ids)} ids, {len(table)} blocks"
