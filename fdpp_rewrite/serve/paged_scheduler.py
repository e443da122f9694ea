"""Continuous batching on a paged engine (engine.paged: the KV cache is a pool of fixed-size blocks, a sequence holds
a table of them; fdpp_rewrite/engine/paged_cache.py). Rows, not slots, bound the batch (engine.max_batch, up to 256,
or serve --max-batch); free blocks bound what runs.

Each iteration (scheduler.py's, with these steps in place of its prefill / mixed / decode passes):
1. admission, oldest first: the oldest waiting request takes a free row when its prompt's blocks, minus the full
   blocks the prefix cache already holds (engine.attach_prefix), plus one block for its first decode tokens, fit
   in the free blocks left once the running sequences' outstanding prompt blocks and a reserve of one block per
   running sequence (their growth) are set aside. The queue stops at the first that does not fit (no overtaking);
   with nothing running the oldest is always admitted (submission refused what cannot fit the whole pool);
2. ONE engine.step: every sequence with a token to feed, and the next chunk (at most --prefill-chunk tokens, run
   padded to its bucket) of each of the oldest prompts not all in their rows yet, as many chunks as
   --prefill-budget holds padded (2048 / 128: 16 prompts a step). Many prompts
   are prefilled in the same pass as the decode rows, so time to first token falls with load instead of queueing
   behind one prompt at a time. As in scheduler.py, the step is launched before the last step's tokens are read;
3. short of blocks (engine.blocks_needed above the free blocks, or OutOfBlocks from the step): the youngest
   prompts' chunks wait for a later step first; if the decode rows alone do not fit, the last step's tokens are
   read (sequences that ended give their blocks back), then the youngest running sequence is preempted: its blocks
   are released and it goes back to the front of the queue with prompt + generated tokens as the ids to prefill
   (recomputed; the prefix cache usually still holds its prompt's blocks). Its streamed text stays sent, its
   max_tokens counts what it produced already, and the oldest sequence always progresses, so no request fails or
   starves for lack of blocks.

Prefix caching is the engine's (engine.kv.prefix; serve --no-prefix-cache loads the engine without it): admission
calls engine.attach_prefix when it is on.
"""

from __future__ import annotations

from fdpp_rewrite.engine.paged.blocks import OutOfBlocks
from fdpp_rewrite.serve.requests import InFlight, Request
from fdpp_rewrite.serve.scheduler import DEFAULT_PREFILL_BUDGET, Scheduler
from fdpp_rewrite.serve.warmup import warm_up_paged


class PagedScheduler(Scheduler):
    def __init__(self, engine, tokenizer=None, *, prefill_budget: int = DEFAULT_PREFILL_BUDGET,
                 max_batch: int | None = None, **options):
        super().__init__(engine, tokenizer, **options)
        self.slots = [None] * min(engine.max_batch, max_batch or engine.max_batch)
        self.block_size = engine.kv.block_size
        # every chunk runs padded to one length, and a step carries as many as fit the budget padded, so a step's
        # prompt rows stay within what the engine captures as CUDA graphs (step_budget) and few shapes exist
        self.prefill_budget = min(prefill_budget, engine.step_budget()[1])
        self.prefill_chunk = min(self.prefill_chunk, self.prefill_budget)
        self.padded = engine.chunk_bucket(self.prefill_chunk)
        self.max_chunks = max(1, self.prefill_budget // self.padded)
        self.prefix_cache = engine.kv.prefix is not None  # serve --no-prefix-cache loads the engine without it
        self.preemptions = 0
        self.prefill_last = 0  # prompt tokens of the last step
        # (head of the queue, free blocks, committed blocks) when that head last did not fit: it is not tried again
        # (attach_prefix walks its prompt, and counts the lookup in the hit rate) until one of them changes
        self.blocked: tuple | None = None

    # -- what the HTTP side asks -----------------------------------------------------------------------------

    def sequence_limit(self) -> tuple[int, str]:
        pool = self.engine.kv.total_blocks * self.block_size
        if pool >= self.engine.max_seq:
            return super().sequence_limit()
        return pool, (f"this server's KV cache of {self.engine.kv.total_blocks} blocks of {self.block_size} tokens, "
                      "sized by serve --kv-memory")

    def kv_blocks(self) -> dict:
        kv = self.engine.kv
        return {"used": kv.used_blocks, "free": kv.free_blocks, "total": kv.total_blocks}

    def gauges(self) -> dict:
        prefix = self.engine.kv.prefix
        hit_rate = prefix.hit_tokens / prefix.query_tokens if prefix is not None and prefix.query_tokens else 0.0
        blocks = self.kv_blocks()
        return {
            **super().gauges(),
            "kv_slots_total": ("sequence rows (the engine's max batch, or serve --max-batch)", len(self.slots), None),
            "kv_blocks_used": ("KV blocks held by a sequence", blocks["used"], None),
            "kv_blocks_free": ("KV blocks free, cached prefix blocks no sequence holds included", blocks["free"],
                               None),
            "kv_blocks_total": (f"KV blocks in the pool ({self.block_size} tokens each)", blocks["total"], None),
            "prefix_cache_hit_rate": ("prompt tokens found in the prefix cache over prompt tokens looked up",
                                      hit_rate, None),
            "preemptions_total": ("sequences preempted for lack of KV blocks (requeued and recomputed)",
                                  self.preemptions, None),
            "prefill_tokens_last_step": ("prompt tokens the last step prefilled", self.prefill_last, None),
        }

    def _warm_walk(self, stream) -> None:
        warm_up_paged(self.engine, self.warmup, self.prefill_chunk, self.prefill_budget, len(self.slots),
                      stopping=lambda: self.stopping, stream=stream)

    # -- admission -------------------------------------------------------------------------------------------

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _running(self) -> list:
        return [r for r in self.slots if r is not None]

    def _committed(self) -> int:
        """Blocks the running sequences will take without a new admission: the rest of their prompts, and one each
        to grow into."""
        return sum(1 + self._blocks(len(r.context)) - self._blocks(r.prefilled) for r in self._running())

    def _admit(self, now: float) -> None:
        with self.cond:
            while self.waiting and None in self.slots:
                request = self.waiting[0]
                state = (id(request), self.engine.kv.free_blocks, self._committed())
                if state == self.blocked:
                    return
                slot = self.slots.index(None)
                cached = self.engine.attach_prefix(slot, request.context) if self.prefix_cache else 0
                need = self._blocks(len(request.context)) - cached // self.block_size + 1
                if self._running() and need + state[2] > self.engine.kv.free_blocks:
                    self.engine.release(slot)  # its cached blocks go back to the cache, unreferenced
                    self.blocked = state
                    return
                self.waiting.popleft()
                request.slot, request.prefilled = slot, cached
                self.slots[slot] = request
                if not request.tokens:  # a preempted request's prompt was counted at its first admission
                    self.metrics.add_tokens(prompt=len(request.prompt))

    # -- one step --------------------------------------------------------------------------------------------

    def _launch(self, previous: InFlight | None) -> InFlight | None:
        kv = self.engine.kv
        while True:
            batch, chunks = self._decoding(previous), self._chunks()
            if not batch and not chunks:
                return previous
            while chunks and self._needed(batch, chunks) > kv.free_blocks:
                chunks.pop()  # the youngest prompt's chunk waits for a later step
            if (batch or chunks) and self._needed(batch, chunks) <= kv.free_blocks:
                try:
                    self._step(batch, chunks, previous)
                    return previous
                except OutOfBlocks:  # nothing ran: as short of blocks as blocks_needed would have said
                    pass
            if previous is not None:  # the sequences that ended in it give their blocks back first
                self._land(previous)
                previous = None
                continue
            self._preempt(max(self._running(), key=lambda r: r.arrival))

    def _chunks(self) -> list:
        """(request, ids) of the next chunks of the oldest pending prompts, as many as the prefill budget holds."""
        return [(r, r.context[r.prefilled:r.prefilled + self.prefill_chunk])
                for r in self._pending()[:self.max_chunks]]

    def _needed(self, batch: list, chunks: list) -> int:
        return self.engine.blocks_needed([r.slot for r in batch], [(r.slot, ids) for r, ids in chunks])

    def _step(self, batch: list, chunks: list, previous: InFlight | None) -> None:
        tokens = self._step_tokens(batch, previous)
        decode_logits, chunk_logits = self.engine.step([r.slot for r in batch], tokens,
                                                       [(r.slot, ids) for r, ids in chunks], padded=self.padded)
        done = []  # the chunks that complete their prompt: their logits give the first token
        for index, (request, ids) in enumerate(chunks):
            request.prefilled += len(ids)
            if request.prefilled == len(request.context):
                done.append(index)
        prefilled = sum(len(ids) for _, ids in chunks)
        self.prefill_last = prefilled
        self.metrics.prefill_step(prefilled)
        firsts = [chunks[i][0] for i in done]
        self._launched(batch, decode_logits, firsts, chunk_logits[done] if done else None,
                       kind="mixed" if chunks else "decode", queued=previous is not None)
        self.mixed_steps += bool(chunks and batch)

    def _preempt(self, request: Request) -> None:
        """Give the youngest running sequence's blocks back; it is recomputed from the front of the queue."""
        self.engine.release(request.slot)
        self.slots[request.slot] = None
        request.slot, request.prefilled, request.next_token = None, 0, None
        request.context = request.prompt + request.tokens
        self.preemptions += 1
        with self.cond:
            self.waiting.appendleft(request)
