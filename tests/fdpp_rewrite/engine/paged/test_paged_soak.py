"""A seeded soak of the paged KV bookkeeping: thousands of random operations as a scheduler would make them
(prompts with shared and distinct prefixes, prefill in chunks, decode one token at a time, one sequence or all of
them per step, preemption when out of blocks, cancellation, release), with every invariant checked after each one
and a shadow copy of the pool's memory proving that a prefix match only ever hands out blocks holding exactly the
prompt's tokens."""

import random

import pytest

from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE, BlockPool, OutOfBlocks, blocks_for
from fdpp_rewrite.engine.paged.prefix import PrefixCache
from fdpp_rewrite.engine.paged.sequence import SequenceBlocks, grow_all

B = KV_BLOCK_SIZE


class Soak:
    def __init__(self, seed: int, num_blocks: int, prefix_caching: bool):
        self.rng = random.Random(seed)
        self.pool = BlockPool(num_blocks)
        self.prefix = PrefixCache(self.pool) if prefix_caching else None
        self.memory = {}     # block -> {offset: token}: what the GPU pool would hold
        self.live = []       # [SequenceBlocks, prompt, target length]
        # shared system prompts of 0..4 blocks and odd lengths; vocabulary small enough for chance agreements
        self.systems = [[self.rng.randrange(50) for _ in range(n)] for n in (0, 37, B, 2 * B, 2 * B + 17, 4 * B)]
        self.stats = dict(admitted=0, hits=0, preempted=0, cancelled=0, finished=0)

    def admit(self):
        prompt = self.rng.choice(self.systems) + [self.rng.randrange(50) for _ in range(self.rng.randrange(1, 150))]
        self.stats["admitted"] += 1
        self.live.append([self.attach(prompt), prompt, len(prompt) + self.rng.randrange(1, 60)])

    def attach(self, prompt):
        seq = SequenceBlocks(self.pool, self.prefix)
        cached = seq.attach_prefix(prompt)
        assert cached % B == 0 and cached <= len(prompt) - 1
        for index, block in enumerate(seq.blocks):  # a hit holds exactly the prompt's tokens at their positions
            assert self.memory[block] == {i: prompt[index * B + i] for i in range(B)}, f"block {block}"
        self.stats["hits"] += cached > 0
        return seq

    def next_ids(self, entry):
        """A prompt chunk of 1 to 1,000 tokens while prefilling, then one decode token."""
        seq, prompt, _ = entry
        done = len(seq.tokens)
        if done < len(prompt):
            return prompt[done:done + self.rng.choice((1, 7, B, 100, 1000))]
        return [self.rng.randrange(50)]

    def advance(self, entry):
        """One sequence's step."""
        ids = self.next_ids(entry)
        try:
            entries = entry[0].grow(len(entry[0].tokens) + len(ids))
        except OutOfBlocks:
            self.preempt()
            return
        self.write(entry, ids, entries)

    def advance_all(self):
        """A step of every live sequence, their blocks allocated together (grow_all)."""
        plan = [(entry, self.next_ids(entry)) for entry in self.live]
        try:
            grown = grow_all([(entry[0], len(entry[0].tokens) + len(ids)) for entry, ids in plan])
        except OutOfBlocks:
            self.preempt()
            return
        for (entry, ids), entries in zip(plan, grown):
            self.write(entry, ids, entries)

    def write(self, entry, ids, entries):
        seq, prompt, target = entry
        done = len(seq.tokens)
        assert [i for i, _ in entries] == list(range(len(seq.blocks) - len(entries), len(seq.blocks)))
        assert len(seq.blocks) == blocks_for(done + len(ids))
        for position, token in enumerate(ids, done):
            block = seq.blocks[position // B]
            # only a block of the sequence's own is written: never a shared or cached one
            assert self.pool.refcount(block) == 1 and block not in self.pool.cached, f"block {block}"
            if position % B == 0:
                self.memory[block] = {}
            self.memory[block][position % B] = token
        seq.append(ids)
        if len(seq.tokens) >= len(prompt) or self.rng.random() < 0.3:
            seq.publish()
        if len(seq.tokens) >= target:
            self.drop(entry, "finished")

    def preempt(self):
        """The youngest sequence gives its blocks back and is requeued with its tokens so far as its prompt."""
        seq, prompt, target = self.live[-1]
        if len(seq.tokens) > len(prompt):
            prompt = list(seq.tokens)
        self.drop(self.live[-1], "preempted")
        self.live.insert(0, [self.attach(prompt), prompt, target])

    def drop(self, entry, why):
        entry[0].release()
        self.live.remove(entry)
        self.stats[why] += 1

    def step(self):
        roll = self.rng.random()
        if not self.live or (roll < 0.1 and len(self.live) < 8):
            self.admit()
        elif 0.1 <= roll < 0.115:
            self.drop(self.rng.choice(self.live), "cancelled")
        elif roll < 0.2:
            self.advance_all()
        else:
            self.advance(self.rng.choice(self.live))
        self.pool.check([entry[0].blocks for entry in self.live])

    def drain(self):
        for entry in list(self.live):
            self.drop(entry, "finished")
        self.pool.check([])
        assert self.pool.used_count == 0 and self.pool.free_count == self.pool.total


@pytest.mark.parametrize("seed, num_blocks, prefix_caching", [(0, 24, True), (1, 26, True), (2, 26, False)])
def test_soak_random_admit_grow_cancel_release(seed, num_blocks, prefix_caching):
    soak = Soak(seed, num_blocks, prefix_caching)
    for _ in range(4000):
        soak.step()
    soak.drain()
    stats = soak.stats
    # the run exercised what it claims to: preemption, cancellation, completion and (with the cache) prefix hits
    assert stats["preempted"] > 10 and stats["cancelled"] > 10 and stats["finished"] > 10, stats
    if prefix_caching:
        assert stats["hits"] > 10 and soak.prefix.hit_rate > 0.05 and len(soak.prefix) > 0, stats
    else:
        assert stats["hits"] == 0 and soak.pool.cached_count == 0
