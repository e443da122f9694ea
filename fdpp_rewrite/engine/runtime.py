"""The engine runtime: load an engine folder, run one forward pass per step with CUDA graphs, the slot API.

    engine = Engine.load("engines/smollm2")                 # checks format, GPU and library build
    result = engine.generate([ids_a, ids_b], max_new_tokens=32, sampler=Sampler())
    result.tokens                                           # the new ids of each sequence (stop id excluded)

Sequence b lives in cache slot b (kv_cache.py: its length on the GPU and mirrored on the host). A decode step
feeds the graph the cache views of its bucket (buckets.py); the first step of a bucket is traced (and is the step
itself), then the bucket's Program is captured once into a CUDA graph whose static inputs are the token and
past_len buffers, and every later step of that bucket is one replay (programs.py). The only host synchronization
of a step is reading the sampled tokens. A prompt pass (or chunk) of up to MAX_GRAPH_PREFILL tokens is likewise
captured per (slot, prefill bucket, KV bucket) on its first run and replayed after: replaying a traced Program
from Python costs host time per layer, more than the GPU work of a short chunk.

Slot-level work, for a server that admits and retires sequences one at a time (fdpp_rewrite.serve):
`prefill_chunk` runs part of a prompt into a slot after the tokens already there, `decode_slots` steps only the
given slots, `mixed_step` does both in one pass (mixed.py), `release` frees a slot. `generate` (generation.py) and
`decode` keep the whole-batch form. A tensor-parallel engine's rank 0 mirrors each of these calls to the other
ranks (tp_group.py).

The modules this one uses are its public surface too: Sampler, GenerateResult, pick and upload import from here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fdpp_rewrite.engine import buckets, generation, mixed
from fdpp_rewrite.engine.buckets import MAX_GRAPH_PREFILL, pick
from fdpp_rewrite.engine.generation import GenerateResult
from fdpp_rewrite.engine.interpreter import prepare_nodes
from fdpp_rewrite.engine.kv_cache import SlotCache, upload
from fdpp_rewrite.engine.manifest import check_device, read_manifest
from fdpp_rewrite.engine.programs import ProgramCache
from fdpp_rewrite.engine.sampling import Sampler
from fdpp_rewrite.engine.tensor_parallel import rank_folder_name
from fdpp_rewrite.engine.tp_group import Leader, mirrored
from fdpp_rewrite.errors import FdppError

__all__ = ["Engine", "GenerateResult", "Sampler", "pick", "upload"]

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class Engine:
    """An engine folder loaded on `backend` ("cuda" or "cpu"; default the manifest's). `wrapper`: a class that
    wraps the backend (ablations.py: TorchKernels for the stock-torch peer, an ablation for bench --ablate)."""

    def __init__(self, folder, backend: str | None = None, use_graphs: bool = True, wrapper=None):
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        backend = backend or self.manifest["backend"]
        self.leader, self._inside_call = None, 0  # leader: rank 0 of a tensor-parallel engine (tp_group.py)
        if self.manifest.get("tensor_parallel"):
            options = {"backend": backend, "use_graphs": use_graphs, "wrapper": wrapper}
            self.leader = Leader(type(self), self.folder, self.manifest, options)
            try:
                self.folder = self.folder / rank_folder_name(0)
                self.manifest = read_manifest(self.folder)
                self._load(backend, use_graphs, wrapper)
            except FdppError as exc:
                self.leader.confirm(f"rank 0: {exc}")
            self.leader.confirm(None)
        else:
            self._load(backend, use_graphs, wrapper)

    def _load(self, backend: str, use_graphs: bool, wrapper) -> None:
        """Load the folder read_manifest just read (a rank folder of a tensor-parallel engine: it holds the
        weights) on `backend`."""
        from safetensors.torch import load_file

        from fdpp_rewrite.engine.backends import CpuBackend, CudaBackend
        from fdpp_rewrite.engine.manifest import read_plan, verify_weights

        verify_weights(self.folder, self.manifest)
        if backend == "cuda":
            check_device(self.manifest, self.folder)
        elif backend != "cpu":
            raise FdppError(f"unknown backend {backend!r}; use cuda or cpu")
        self.plan = read_plan(self.folder, self.manifest)
        self.backend = CudaBackend(self.plan["gemm_plans"]) if backend == "cuda" else CpuBackend()
        if wrapper is not None:
            self.backend = wrapper(self.backend)
        device = self.backend.device
        try:
            tensors = load_file(str(self.folder / "weights.safetensors"), device="cpu")
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error for a truncated file
            raise FdppError(f"cannot read {self.folder}/weights.safetensors ({exc}); rebuild the engine") from None
        for name in self.plan.get("scalar_values", []):
            tensors[name] = tensors[name].reshape(())
        host_names = set(self.plan["host_values"])
        self.host_values = {name: t for name, t in tensors.items() if name in host_names}
        self.weights = {name: t.to(device) for name, t in tensors.items() if name not in host_names}
        del tensors
        self.nodes = prepare_nodes(self.plan["nodes"])
        self.dtype = TORCH_DTYPES[self.plan["dtype"]]
        self.max_batch, self.max_seq = self.manifest["max_batch"], self.manifest["max_seq"]
        self.num_layers = self.plan["num_layers"]
        self.vocab_size = self.plan["vocab_size"]
        self.kv = SlotCache(self.plan["cache_inputs"], self.max_batch, self.max_seq, self.plan["num_kv_heads"],
                            self.plan["head_dim"], self.dtype, device)
        self.step_ids = torch.zeros(self.max_batch, 1, dtype=torch.int64, device=device)
        self.active = 0
        self.batch_buckets = buckets.batch_buckets(self.max_batch)
        self.kv_buckets = buckets.kv_buckets(self.max_seq)
        self.prefill_buckets = buckets.prefill_buckets(self.max_seq)
        self.hf_feeds = None  # a Hugging Face graph's inputs (hf_interface.py); None for our exporter's graphs
        if self.plan.get("interface") == "hf":
            from fdpp_rewrite.engine.hf_interface import HfFeeds

            self.hf_feeds = HfFeeds(self.plan["inputs"], self.cache_names, self.max_batch, self.max_seq, device)
        self.use_graphs = use_graphs and backend == "cuda"
        self.traced = ProgramCache(self.nodes, self.weights, self.host_values, self.use_graphs)
        tensor_parallel = self.manifest.get("tensor_parallel", 1) > 1
        # prompt passes are captured, except for Hugging Face graphs (their feeds are built per pass) and ranks
        self.graph_prefill = self.use_graphs and self.hf_feeds is None and not tensor_parallel
        self.prefill_ids = {}  # prefill bucket -> the static [1, bucket] ids a captured pass reads
        if self.graph_prefill:
            self.prefill_past = torch.zeros(1, dtype=torch.int64, device=device)  # the pass's start
            self.prefill_last = torch.zeros(1, dtype=torch.int64, device=device)  # its last real position
        # mixed steps (mixed.py): a decode step and a prompt chunk in one pass; mixed_reason says why not
        self.mixed_reason = ("a tensor-parallel engine" if tensor_parallel else
                             "a Hugging Face graph" if self.hf_feeds is not None else
                             mixed.unsupported_reason(self.plan))
        self.mixed_inputs = {}  # (batch bucket, chunk) -> static (ids [1, B + C], past_len [B + 1], rows [B + 1])

    @classmethod
    def load(cls, folder, **options) -> "Engine":
        return cls(folder, **options)

    def close(self) -> None:
        """Stop the follower ranks of a tensor-parallel engine (also at exit); a plain engine has none."""
        if self.leader is not None:
            self.leader.close()

    # -- what callers read: the cache, the traced and captured shapes ---------------------------------------------

    @property
    def caches(self) -> list:
        return self.kv.tensors

    @property
    def cache_names(self) -> list:
        return self.kv.names

    @property
    def past_len(self):
        return self.kv.past_len

    @property
    def lengths(self) -> list:
        return self.kv.lengths

    @property
    def programs(self) -> dict:
        return self.traced.programs

    @property
    def graphs(self) -> dict:
        return self.traced.decode_graphs

    @property
    def prefill_graphs(self) -> dict:
        return self.traced.prefill_graphs

    @property
    def mixed_steps(self) -> dict:
        return self.traced.mixed_steps

    @property
    def device(self):
        return self.backend.device

    # -- one forward pass ----------------------------------------------------------------------------------------

    def feeds(self, input_ids, past_len, slots: slice, kv_len: int, start: int | None = None) -> dict:
        """The graph's inputs for a step of `slots` over the cache views [:kv_len]: a decode step of the batch
        bucket, or (start given) a prompt chunk of one slot after its `start` tokens."""
        if self.hf_feeds is not None:
            if start is None:
                return self.hf_feeds.decode(input_ids, past_len, self.caches, slots.stop, kv_len)
            return self.hf_feeds.prefill(input_ids, self.caches, slots.start, start)
        return {"input_ids": input_ids, "past_len": past_len, **self.kv.views(slots, kv_len)}

    def forward(self, feeds: dict, cache_program: bool):
        """logits for these feeds: a traced Program of the same shapes when there is one, else a trace."""
        return self.traced.forward(self.program_key(feeds), feeds, self.backend, cache_program)

    def program_key(self, feeds: dict) -> tuple:
        """((batch, seq), KV view length) of a step: the shapes a traced Program is specialized to (for a Hugging
        Face graph the view its cache appends go to, past + seq; the past is then seq's complement)."""
        cache = self.cache_names[0]
        if self.hf_feeds is not None:
            from fdpp_rewrite.engine.hf_interface import BUFFER_PREFIX

            cache = BUFFER_PREFIX + cache
        return tuple(feeds["input_ids"].shape), feeds[cache].shape[2]

    @mirrored
    def reset(self) -> None:
        self.kv.reset()
        self.step_ids.zero_()
        self.active = 0

    @mirrored
    def prefill(self, slot: int, ids: list[int]):
        """Run a prompt into cache slot `slot` (batch 1); returns the last prompt position's logits [V].

        The prompt is right-padded (token 0) to its prefill bucket, so every prompt length of a bucket replays one
        traced Program. Exact: attention is causal, so the padding changes no prompt position, and the cache rows
        it writes past the prompt are masked (past_len) until the decode step of each position overwrites them.
        Example: 100 tokens run as 128; logits come from position 99; rows 100..127 are rewritten by steps 1..28.
        A prompt over MAX_PREFILL_CHUNK tokens runs as consecutive chunks of that size (prefill_chunk)."""
        seq = len(ids)
        if seq > buckets.MAX_PREFILL_CHUNK:
            self.kv.set_length(slot, 0)
            for start in range(0, seq, buckets.MAX_PREFILL_CHUNK):
                logits = self.prefill_chunk(slot, ids[start:start + buckets.MAX_PREFILL_CHUNK])
            return logits
        padded = pick(seq, self.prefill_buckets)
        logits = self.prompt_pass(slot, ids, 0, padded, pick(padded, self.kv_buckets))
        self.kv.set_length(slot, seq)
        return logits

    def prompt_pass(self, slot: int, ids: list[int], start: int, padded: int, kv_len: int):
        """Run `ids` right-padded to `padded` into `slot` after its first `start` tokens, over the cache view
        [:kv_len]; returns the logits [V] of the last id. A CUDA-graph replay where one was captured for (slot,
        padded, kv_len), else the traced Program (captured now when graphs apply)."""
        seq = len(ids)
        padded_ids = upload(list(ids) + [0] * (padded - seq), self.device).reshape(1, padded)
        graphs = self.graph_prefill and padded <= MAX_GRAPH_PREFILL
        if graphs:
            input_ids = self.prefill_ids.get(padded)
            if input_ids is None:
                input_ids = self.prefill_ids[padded] = torch.zeros(1, padded, dtype=torch.int64, device=self.device)
            input_ids.copy_(padded_ids)
            past = self.prefill_past
            past.fill_(start)
            self.prefill_last.fill_(seq - 1)
            key = (slot, padded, kv_len)
            if key in self.prefill_graphs:
                graph, last = self.prefill_graphs[key]
                graph.replay()
                return last[0].clone()  # the next replay of this graph rewrites `last`
        else:
            input_ids = padded_ids
            past = upload([start], self.device)
        feeds = self.feeds(input_ids, past, slice(slot, slot + 1), kv_len, start=start)
        # a Hugging Face graph's chunk after `start` tokens has its own past length: keep only start-0 Programs
        logits = self.forward(feeds, cache_program=self.hf_feeds is None or start == 0)
        if graphs:
            program = self.programs[self.program_key(feeds)]
            self.prefill_graphs[key] = self.traced.capture(program, feeds,
                                                           lambda out: out[0].index_select(0, self.prefill_last))
        return logits[0, seq - 1]

    def decode_buckets(self, batch: int) -> tuple[int, int]:
        longest = max(self.lengths[:batch]) + 1  # the new token's position must be inside the view
        self.kv.check_fits(longest)
        return pick(batch, self.batch_buckets), pick(longest, self.kv_buckets)

    @mirrored
    def decode(self, tokens):
        """One decode step of the active sequences with tokens [B] (device int64); returns logits [B, V]."""
        batch = self.active
        bucket_batch, kv_len = self.decode_buckets(batch)
        self.step_ids[:batch, 0].copy_(tokens)
        logits = self.run_decode_bucket(bucket_batch, kv_len)
        self.kv.advance_first(batch)
        return logits[:batch, -1]

    def run_decode_bucket(self, bucket_batch: int, kv_len: int):
        """One step of slots [0, bucket_batch) from step_ids and past_len: a graph replay, or the bucket's first
        step traced eagerly (and captured). Returns the bucket's logits [bucket_batch, 1, V]."""
        key = (bucket_batch, kv_len)
        if key in self.graphs:
            graph, logits = self.graphs[key]
            if self.hf_feeds is not None:  # the mask is a graph input the step's lengths decide
                self.hf_feeds.refresh_decode_mask(self.past_len[:bucket_batch], bucket_batch, kv_len)
            graph.replay()
            return logits
        feeds = self.feeds(self.step_ids[:bucket_batch], self.past_len[:bucket_batch], slice(0, bucket_batch), kv_len)
        logits = self.forward(feeds, cache_program=True)
        if self.use_graphs:
            self.capture(key, feeds)
        return logits

    def capture(self, key, feeds) -> None:
        """Record the bucket's Program into a CUDA graph (recording runs nothing: the step already ran)."""
        self.graphs[key] = self.traced.capture(self.programs[self.program_key(feeds)], feeds)

    # -- slot-level work (the server's scheduler) ----------------------------------------------------------------

    @mirrored
    def prefill_chunk(self, slot: int, ids: list[int]):
        """Run the next `ids` of a prompt into `slot`, after the lengths[slot] tokens already there (batch 1,
        past_len = those tokens); returns the chunk's last position's logits [V]. A whole prompt in one chunk is
        exactly Engine.prefill. Padding as in Engine.prefill, capped at max_seq: its rows past the chunk are
        masked until the next chunk or decode step rewrites them.
        Example: a 300-token prompt in chunks of 128: past_len 0, 128, 256; the last chunk (44) runs as 64."""
        start, seq = self.lengths[slot], len(ids)
        if not ids or start + seq > self.max_seq:
            raise FdppError(f"slot {slot} holds {start} tokens; a chunk of {seq} must be non-empty and end within "
                            f"the engine's max sequence {self.max_seq}")
        padded = min(pick(seq, self.prefill_buckets), self.max_seq - start)
        logits = self.prompt_pass(slot, ids, start, padded, pick(start + padded, self.kv_buckets))
        self.kv.set_length(slot, start + seq)
        return logits

    def slot_buckets(self, slots: list[int]) -> tuple[int, int]:
        """(batch bucket, KV bucket) of a decode step of `slots`: the batch bucket covers slots [0, max(slots)],
        the KV bucket the longest length among all of them (decoding or not: every slot of the bucket writes a row
        at its length, which must lie inside the view)."""
        bucket_batch = pick(max(slots) + 1, self.batch_buckets)
        longest = max(self.lengths[:bucket_batch]) + 1
        self.kv.check_fits(longest)
        return bucket_batch, pick(longest, self.kv_buckets)

    @mirrored
    def decode_slots(self, slots: list[int], tokens):
        """One decode step of the sequences in `slots` (distinct) with tokens [len(slots)] (device int64);
        returns their logits [len(slots), V] in that order. Only these slots advance.

        The step runs every slot of the bucket, and each writes a K/V row at its own past_len: a free slot (length
        0) writes row 0, which its next prefill rewrites; a slot mid-prefill writes row lengths[slot], the first
        row its next chunk writes. Neither is advanced, so neither is corrupted."""
        bucket_batch, kv_len = self.slot_buckets(slots)
        index = upload(slots, self.device)
        self.step_ids[index, 0] = tokens
        logits = self.run_decode_bucket(bucket_batch, kv_len)
        self.kv.advance(slots, bucket_batch)
        return logits[index, -1]

    def chunk_bucket(self, chunk: int) -> int:
        """The padded length a prompt chunk of `chunk` tokens runs as (its prefill bucket, within max_seq)."""
        return pick(min(chunk, self.max_seq), self.prefill_buckets)

    @property
    def supports_mixed(self) -> bool:
        return self.mixed_reason is None

    def mixed_step(self, slots: list[int], tokens, chunk_slot: int, ids: list[int], padded: int | None = None):
        """One pass that is a decode step of `slots` (as decode_slots) and the next `ids` of the prompt in
        `chunk_slot` (as prefill_chunk), reading the weights once (mixed.py). `padded`: the length the chunk runs
        as (default its prefill bucket; a server passes one size for every chunk, so fewer shapes are captured).
        Returns (the slots' logits [len(slots), V] in their order, the logits [V] of the chunk's last id).
        Example: slots [0, 2] decoding, slot 1 prefilling its next 100 tokens padded to 128: one pass of
        input_ids [1, 4 + 128] over the batch bucket of 4."""
        if self.mixed_reason is not None:
            raise FdppError(f"this engine cannot run mixed steps ({self.mixed_reason}); run prefill_chunk and "
                            "decode_slots separately")
        start, seq = self.lengths[chunk_slot], len(ids)
        padded = padded or pick(max(seq, 1), self.prefill_buckets)
        if not ids or not slots or chunk_slot in slots or seq > padded or start + padded > self.max_seq:
            raise FdppError(f"a mixed step needs decode slots other than the chunk's slot {chunk_slot} and a "
                            f"non-empty chunk of at most {padded} tokens that ends, padded, within the engine's max "
                            f"sequence {self.max_seq} (slot {chunk_slot} holds {start} tokens, chunk {seq})")
        bucket_batch = pick(max(max(slots), chunk_slot) + 1, self.batch_buckets)
        longest = max(max(self.lengths[:bucket_batch]) + 1, start + padded)
        self.kv.check_fits(longest)
        kv_len = pick(longest, self.kv_buckets)
        index = upload(slots, self.device)
        self.step_ids[index, 0] = tokens
        input_ids, past, rows = self._mixed_inputs(bucket_batch, padded)
        input_ids[0, :bucket_batch].copy_(self.step_ids[:bucket_batch, 0])
        input_ids[0, bucket_batch:].copy_(upload(list(ids) + [0] * (padded - seq), self.device))
        past[:bucket_batch].copy_(self.past_len[:bucket_batch])
        past[bucket_batch:].fill_(start)
        rows[bucket_batch:].fill_(bucket_batch + seq - 1)  # the chunk's last real id
        key = (bucket_batch, padded, chunk_slot, kv_len)
        if key in self.mixed_steps:
            runner, out = self.mixed_steps[key]
            if self.use_graphs:
                runner.replay()
            else:
                out = runner.run(self._mixed_feeds(input_ids, past, kv_len))["logits"][0].index_select(0, rows)
        else:
            out = self._trace_mixed(key, input_ids, past, rows)
        self.lengths[chunk_slot] = start + seq
        self.kv.advance(slots, bucket_batch)
        return out[index], out[bucket_batch].clone()  # a replay rewrites `out`

    def _mixed_inputs(self, bucket_batch: int, padded: int):
        key = (bucket_batch, padded)
        if key not in self.mixed_inputs:
            self.mixed_inputs[key] = (torch.zeros(1, bucket_batch + padded, dtype=torch.int64, device=self.device),
                                      torch.zeros(bucket_batch + 1, dtype=torch.int64, device=self.device),
                                      torch.arange(bucket_batch + 1, dtype=torch.int64, device=self.device))
        return self.mixed_inputs[key]

    def _mixed_feeds(self, input_ids, past, kv_len: int) -> dict:
        # every slot: the mixed step's ops slice the decode rows and the chunk's
        return {"input_ids": input_ids, "past_len": past, **self.kv.views(slice(None), kv_len)}

    def _trace_mixed(self, key, input_ids, past, rows):
        """Trace the mixed step of `key` (it runs now), then keep it: captured as a CUDA graph, else its Program.
        Returns the output rows [B + 1, V]: the decode rows of the bucket, then the chunk's last id."""
        bucket_batch, padded, slot, kv_len = key
        feeds = self._mixed_feeds(input_ids, past, kv_len)
        layout = mixed.MixedLayout(batch=bucket_batch, slot=slot, chunk=padded)
        outputs, program = self.traced.trace(feeds, self.backend, layout=layout)
        out = outputs["logits"][0].index_select(0, rows)
        if not self.use_graphs:
            self.mixed_steps[key] = (program, None)
            return out
        self.mixed_steps[key] = self.traced.capture(program, feeds, lambda logits: logits[0].index_select(0, rows))
        return out

    def assume_length(self, slot: int, length: int) -> None:
        """Warm-up only: mark `slot` as holding `length` tokens, whatever its cache rows hold, so a warm-up walk
        reaches a KV bucket without prefilling up to it (the rows are junk: only shapes are being traced)."""
        if not 0 <= length < self.max_seq:
            raise FdppError(f"a slot holds 0 to {self.max_seq - 1} tokens, not {length}")
        self.kv.set_length(slot, length)

    @mirrored
    def release(self, slot: int) -> None:
        """Free a slot: length 0, so the decode steps of other slots write only its row 0 and the KV bucket is
        not held up by a finished sequence."""
        self.kv.set_length(slot, 0)

    # -- batch generation (generation.py) -------------------------------------------------------------------------

    def check_request(self, prompts: list, max_new_tokens: int) -> None:
        generation.check_request(self, prompts, max_new_tokens)

    def generate(self, prompts: list, max_new_tokens: int, sampler: Sampler | None = None, stop_ids=(),
                 on_tokens=None) -> GenerateResult:
        """Prefill every prompt into its slot, then decode them together (generation.generate)."""
        return generation.generate(self, prompts, max_new_tokens, sampler, stop_ids, on_tokens)
