"""Continuous batching: one thread owns the engine; the HTTP side only submits, cancels and reads events.

Each iteration of the scheduler thread (run_once), between decode steps:
1. retire what its client cancelled or what ran past its deadline (waiting or running): its slot is free again;
2. admit waiting requests, oldest first, into the lowest free slots (so the batch bucket stays small);
3. prefill: chunks of the prompts not yet in their slots, oldest first, up to `prefill_chunk` tokens in all, so a
   long prompt is spread over several iterations and never stalls the running sequences for long; a prompt's
   last chunk gives its first token;
4. one decode step of every sequence that has a token to feed (Engine.decode_slots: the slots in between,
   free or mid-prefill, are neither advanced nor corrupted), then each sequence is retired on its own: EOS, a stop
   string, max_tokens.
Steps 3 and 4 are one pass where the engine runs mixed steps (fdpp_rewrite/engine/mixed.py) and both have work:
the oldest pending prompt's next chunk rides on the decode step, so the chunk costs little more than its extra
GEMM rows instead of a second read of every weight.

On a paged engine (engine.paged) the server runs paged_scheduler.PagedScheduler instead: this loop, with
admission by free KV blocks and one step per iteration carrying the decode rows and chunks of several prompts.

Before the loop the thread warms the engine up (warmup.py; `warming` is True until then, and the HTTP side
answers 503).

Events reach the request through its `emit` callback: Delta(text) for new text, then one Finish (usage, finish
reason) or Failure (timeout, engine error). A cancelled request gets nothing more. Without a `deliver` hook emit
is called on this thread; with one (the HTTP side's), an iteration's events are handed over in one call at its
end, so the event loop is woken once per step rather than once per sequence: each wake-up is a syscall that
releases the GIL to the loop, which this thread then waits to get back while the next step should be launched.
On the cpu backend greedy tokens do not depend on which requests share the batch
(tests/fdpp_rewrite/serve/test_scheduler.py checks them against Engine.generate); on the GPU a decode row's GEMMs
run at the step's M (the batch, and a chunk riding on it), so its logits may round differently in the last bits,
as in any batched server.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import Callable

from fdpp_rewrite.serve.metrics import Metrics
from fdpp_rewrite.serve.requests import Delta, Failure, Finish, InFlight, QueueFull, Request, ShuttingDown
from fdpp_rewrite.serve.text import TextStream
from fdpp_rewrite.serve.warmup import warm_up

# Prompt tokens per chunk. A chunk rides on a decode step (a mixed step), so it is kept near the size where the
# step's GEMMs, now at M = batch + chunk, are still bound by the weight read (the chunk sizes measured against each
# other: docs/benchmarks.md).
DEFAULT_PREFILL_CHUNK = 128
# Prompt tokens one step of a paged engine carries (paged_scheduler.py), over the chunks of several prompts: enough
# rows to make the step's GEMMs compute-bound, and within the chunk tokens a step is captured as a CUDA graph for.
DEFAULT_PREFILL_BUDGET = 2048
COUNTER_PERIOD_S = 1.0  # how often the cuda backend's softmax fallback counter is read (a small device readback)
IDLE_WAIT_S = 0.5       # the idle thread still wakes to expire waiting requests


class Scheduler:
    def __init__(self, engine, tokenizer=None, metrics: Metrics | None = None, max_queue: int = 64,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, stop_ids=(), warmup: str = "none",
                 deliver: Callable[[list], None] | None = None):
        self.engine = engine
        engine.reset()  # every slot free: the scheduler owns the engine from here on
        self.tokenizer = tokenizer
        self.metrics = metrics or Metrics()
        self.max_queue, self.prefill_chunk = max_queue, prefill_chunk
        self.stop_ids = set(stop_ids)
        self.warmup = warmup
        self.deliver = deliver           # takes [(emit, event), ...] of one iteration; None: emit on this thread
        self.outbox: list = []
        self.warming = warmup != "none"  # until warm_up has run: the HTTP side refuses requests meanwhile
        self.slots: list[Request | None] = [None] * engine.max_batch
        self.waiting: deque[Request] = deque()
        self.cond = threading.Condition()
        self.steps = 0                 # decode steps run
        self.in_flight: InFlight | None = None  # the last step launched, its tokens not read yet
        self.mixed_steps = 0           # of which carried a prompt chunk in the same pass (Engine.mixed_step)
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.draining = False          # drain() was called: every request fails at the next iteration
        self.submitted = 0             # requests that reached the scheduler (what guard.py refuses never does)
        self.last_error: str | None = None  # the last engine failure (its requests failed; the loop goes on)
        self.on_cuda = engine.backend.name == "cuda"
        self.fallback_base = self._read_fallback_rows() if self.on_cuda else 0
        self.fallback_rows, self.counters_read_at = 0, time.monotonic()
        self.landed_at = 0.0  # when the last step's tokens were read

    # -- the HTTP side ---------------------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        with self.cond:
            if self.draining:
                raise ShuttingDown
            # the free slots take their requests at the next iteration: only the rest wait
            if len(self.waiting) >= self.max_queue + self.slots.count(None):
                raise QueueFull
            request.submitted = time.monotonic()
            request.deadline = request.submitted + request.timeout_s
            request.text = TextStream(self.tokenizer, request.prompt, request.stop)
            request.context = list(request.prompt)
            request.arrival = self.submitted
            self.waiting.append(request)
            self.submitted += 1
            self.cond.notify()

    def drain(self) -> None:
        """The server shuts down: refuse new requests; the waiting and running ones end with a Failure (a stream
        gets its error event) at the next iteration, within one step, so none is cut off mid-response."""
        with self.cond:
            self.draining = True
            self.cond.notify()

    def cancel(self, request: Request) -> None:
        """The client went away: the slot is freed at the next iteration (within one step)."""
        with self.cond:
            request.cancelled = True
            self.cond.notify()

    def gauges(self) -> dict:
        running = [r for r in self.slots if r is not None]
        fallback_help = ("attention rows the asynchronized softmax recomputed with the exact fallback" +
                         ("" if self.on_cuda else "; 0: the cpu backend runs the reference path, not the kernels"))
        return {
            "queue_depth": ("requests waiting for a KV slot", len(self.waiting), None),
            "running_sequences": ("sequences decoding (the running batch)",
                                  sum(r.prefilled == len(r.context) for r in running), None),
            "prefilling_sequences": ("sequences whose prompt is still being prefilled",
                                     sum(r.prefilled < len(r.context) for r in running), None),
            "kv_slots_in_use": ("KV cache slots held by a sequence", len(running), None),
            "requests_submitted_total": ("requests that reached the scheduler", self.submitted, None),
            "kv_slots_total": ("KV cache slots (the engine's max batch)", len(self.slots), None),
            "decode_steps_total": ("decode steps run", self.steps, None),
            "mixed_steps_total": ("decode steps that prefilled a prompt chunk in the same pass (one weight read)",
                                  self.mixed_steps, None),
            "softmax_fallback_rows_total": (fallback_help, self.fallback_rows,
                                            {"path": "kernel" if self.on_cuda else "reference"}),
        }

    # -- the thread ------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="fdpp-scheduler", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if self.thread is not None:
            self.thread.join(timeout=30)

    @property
    def healthy(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and not self.stopping

    def warm_up(self, stream=None) -> None:
        """Trace the engine's shapes (warmup.py) before any request; a failure is reported and serving goes on."""
        try:
            self._warm_walk(stream)
        except Exception as exc:  # noqa: BLE001 - the requests will meet the failure again and fail on their own
            self.last_error = f"{type(exc).__name__}: {exc}"
            print(f"error: the warm-up failed ({self.last_error}); serving without it", file=sys.stderr)
        finally:
            self.warming = False

    def _warm_walk(self, stream) -> None:
        warm_up(self.engine, self.warmup, self.prefill_chunk, stopping=lambda: self.stopping, stream=stream)

    def sequence_limit(self) -> tuple[int, str]:
        """The longest sequence (prompt + max_tokens) a request may have, and what sets it (for the 400s)."""
        return self.engine.max_seq, "this engine's max sequence"

    def kv_blocks(self) -> dict | None:
        """The KV blocks used / free / total of a paged engine (for /health); None with KV slots."""
        return None

    def _loop(self) -> None:
        if self.warming:
            self.warm_up()
        while True:
            with self.cond:
                if (not self.stopping and not self.waiting and self.in_flight is None
                        and all(r is None for r in self.slots)):
                    self.cond.wait(IDLE_WAIT_S)
                if self.stopping:
                    return
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - an engine failure fails its requests, not the server
                self.last_error = f"{type(exc).__name__}: {exc}"
                print(f"error: the engine failed ({self.last_error}); failing the running requests", file=sys.stderr)
                self.in_flight = None
                for request in [r for r in self.slots if r is not None]:
                    self._fail(request, "engine", f"the engine failed: {self.last_error}")
            self._flush()

    # -- one iteration ---------------------------------------------------------------------------------------

    def run_once(self) -> None:
        try:
            self._iterate()
        finally:
            self._flush()

    def _iterate(self) -> None:
        now = time.monotonic()
        self._retire_gone(now)
        self._admit(now)
        # The next step is launched before the last one's tokens are read (it takes them on the GPU), so the host
        # work of a step (sampling readback, stop strings, streaming) overlaps the GPU's next step instead of
        # leaving it idle. A sequence that turns out to have ended ran one step too many: its token is dropped.
        previous, self.in_flight = self.in_flight, None
        previous = self._launch(previous)
        if previous is not None:
            self._land(previous)
        if self.on_cuda and time.monotonic() - self.counters_read_at > COUNTER_PERIOD_S:
            self.fallback_rows = self._read_fallback_rows() - self.fallback_base
            self.counters_read_at = time.monotonic()

    def _launch(self, previous: InFlight | None) -> InFlight | None:
        """Launch this iteration's work; returns `previous` if its tokens are still to be read."""
        if not self._mixed(previous):
            self._prefill()
            self._decode(previous)
        return previous

    def _retire_gone(self, now: float) -> None:
        with self.cond:
            kept = deque()
            for request in self.waiting:
                if self.draining and not request.cancelled:
                    self._fail(request, "shutdown", "the server is shutting down")
                elif request.cancelled:
                    self.metrics.request_done("cancelled")
                elif now > request.deadline:
                    self._timeout(request)
                else:
                    kept.append(request)
            self.waiting = kept
        for request in [r for r in self.slots if r is not None]:
            if request.cancelled:
                self._free(request)
                self.metrics.request_done("cancelled")
            elif now > request.deadline:
                self._free(request)
                self._timeout(request)
            elif self.draining:
                self._fail(request, "shutdown", "the server is shutting down")

    def _admit(self, now: float) -> None:
        with self.cond:
            while self.waiting and None in self.slots:
                request = self.waiting.popleft()
                request.slot = self.slots.index(None)  # the lowest free slot
                self.slots[request.slot] = request
                self.metrics.add_tokens(prompt=len(request.prompt))

    def _prefill(self) -> None:
        budget = self.prefill_chunk
        for request in self._pending():
            if budget <= 0:
                break
            count = min(budget, len(request.context) - request.prefilled)
            chunk = request.context[request.prefilled:request.prefilled + count]
            logits = self.engine.prefill_chunk(request.slot, chunk)
            request.prefilled += count
            budget -= count
            if request.prefilled == len(request.context):
                token = int(request.sampler(logits[None])[0])
                self._on_token(request, token, time.monotonic())

    def _pending(self) -> list:
        """The requests whose prompt is not all in their slot yet, oldest first."""
        return sorted((r for r in self.slots if r is not None and r.prefilled < len(r.context)),
                      key=lambda r: r.arrival)

    def _decoding(self, previous: InFlight | None) -> list:
        """The requests the next decode step runs: those with a token to feed, on the host or still on the GPU
        in `previous`, except one whose token in flight is its last (max_tokens)."""
        flying = set() if previous is None else {id(r) for r in previous.rows}
        return [r for r in self.slots if r is not None and
                (r.next_token is not None or id(r) in flying) and
                not (id(r) in flying and len(r.tokens) + 1 >= r.max_tokens)]

    def _step_tokens(self, batch: list, previous: InFlight | None):
        """The batch's input tokens on the device: from `previous`'s sampled tokens where they are still in flight,
        else the host's."""
        import torch

        from fdpp_rewrite.engine.runtime import upload

        device = self.engine.device
        if previous is None:
            return upload([r.next_token for r in batch], device)
        flying = {id(r): i for i, r in enumerate(previous.rows)}
        host = [r.next_token for r in batch if id(r) not in flying]
        source = torch.cat((previous.sampled, upload(host, device))) if host else previous.sampled
        index, extra = [], len(previous.sampled)
        for r in batch:
            if id(r) in flying:
                index.append(flying[id(r)])
            else:
                index.append(extra)
                extra += 1
        return source[upload(index, device)]

    def _mixed(self, previous: InFlight | None) -> bool:
        """The oldest pending prompt's next chunk in the same pass as the decode step (Engine.mixed_step: one weight
        read for both), where the engine runs mixed steps and both kinds of work wait. The chunk always runs
        padded to the --prefill-chunk bucket, so the warm-up captures one chunk size. False: nothing ran, and the
        separate passes run instead (no decode batch yet, no prompt pending, or a chunk near max_seq)."""
        if not self.engine.supports_mixed:
            return False
        batch, pending = self._decoding(previous), self._pending()
        padded = self.engine.chunk_bucket(self.prefill_chunk)
        if not batch or not pending or pending[0].prefilled + padded > self.engine.max_seq:
            return False
        request = pending[0]
        count = min(self.prefill_chunk, len(request.context) - request.prefilled)
        chunk = request.context[request.prefilled:request.prefilled + count]
        logits, last = self.engine.mixed_step([r.slot for r in batch], self._step_tokens(batch, previous),
                                              request.slot, chunk, padded)
        request.prefilled += count
        firsts = [request] if request.prefilled == len(request.context) else []
        self._launched(batch, logits, firsts, last[None], kind="mixed", queued=previous is not None)
        self.mixed_steps += 1
        return True

    def _decode(self, previous: InFlight | None) -> None:
        batch = self._decoding(previous)
        if batch:
            tokens = self._step_tokens(batch, previous)
            logits = self.engine.decode_slots([r.slot for r in batch], tokens)
            self._launched(batch, logits, queued=previous is not None)

    def _launched(self, batch: list, logits, firsts=(), first_logits=None, kind: str = "decode",
                  queued: bool = False) -> None:
        """Sample the step's tokens on the device (logits [len(batch), V]; first_logits [len(firsts), V]: the first
        tokens of `firsts`, whose prompts just completed) and start their copy to the host: the step is in flight."""
        import torch

        sampled = sample(batch, logits)
        if firsts:
            sampled = torch.cat((sampled, sample(firsts, first_logits)))
        host, event = sampled, None
        if sampled.is_cuda:
            host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
            host.copy_(sampled, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self.in_flight = InFlight(batch, sampled, host, event, list(firsts), kind, queued)
        self.steps += 1

    def _land(self, flight: InFlight) -> None:
        """Read a step's tokens (the wait for the GPU) and hand them to their requests."""
        if flight.event is not None:
            flight.event.synchronize()
        values = flight.host.tolist()
        now = time.monotonic()
        if flight.queued:  # it ran right behind the step landed before: the interval is its time
            self.metrics.step(flight.kind, now - self.landed_at)
        self.landed_at = now
        for request, token in zip(flight.rows, values):
            if not request.done:
                self._on_token(request, token, now)

    # -- a sequence's tokens and its end ---------------------------------------------------------------------

    def _on_token(self, request: Request, token: int, now: float) -> None:
        if token in self.stop_ids:
            self._finish(request, "stop")
            return
        request.tokens.append(token)
        self.metrics.add_tokens(generated=1)
        if len(request.tokens) == 1:
            self.metrics.first_token(now - request.submitted)
        else:
            self.metrics.inter_token(now - request.last_token_at)
        request.last_token_at = now
        text, stopped = request.text.push(token)
        if text:
            self._emit(request, Delta(text))
        if stopped:
            self._finish(request, "stop")
        elif len(request.tokens) >= request.max_tokens:
            self._finish(request, "length")
        else:
            request.next_token = token

    def _finish(self, request: Request, reason: str) -> None:
        rest = request.text.flush()
        if rest:
            self._emit(request, Delta(rest))
        self._free(request)
        self._emit(request, Finish(reason, len(request.prompt), request.text.kept_tokens))
        self.metrics.request_done("answered")

    def _timeout(self, request: Request) -> None:
        # one line in the server's log: a client's lost request is otherwise explained only to that client
        print(f"warning: a request ({len(request.prompt)} prompt tokens, {len(request.tokens)} generated) ran past "
              f"the request timeout of {request.timeout_s:g} s", file=sys.stderr)
        self._emit(request, Failure("timeout", f"the request ran past the server's request timeout of "
                                               f"{request.timeout_s:g} s"))
        self.metrics.request_done("timed_out")

    def _fail(self, request: Request, kind: str, message: str) -> None:
        self._free(request)
        self._emit(request, Failure(kind, message))
        self.metrics.request_done("failed")

    def _free(self, request: Request) -> None:
        if request.slot is not None and self.slots[request.slot] is request:
            self.engine.release(request.slot)
            self.slots[request.slot] = None
        request.next_token = None
        request.done = True

    def _emit(self, request: Request, event) -> None:
        if request.cancelled:
            return
        if self.deliver is None:
            request.emit(event)
        else:
            self.outbox.append((request.emit, event))

    def _flush(self) -> None:
        """Hand this iteration's events to the `deliver` hook, in one call."""
        if self.outbox:
            batch, self.outbox = self.outbox, []
            self.deliver(batch)

    @staticmethod
    def _read_fallback_rows() -> int:
        from fdpp_rewrite.gpu.attention import read_library_counters

        return read_library_counters()[0]


def sample(requests: list, logits):
    """Each request's next token from its row of logits [len(requests), V], on the device (one argmax when all are
    greedy)."""
    import torch

    if all(r.sampler.temperature == 0 for r in requests):
        return logits.argmax(dim=-1)
    return torch.stack([r.sampler(logits[i:i + 1])[0] for i, r in enumerate(requests)])
