"""The engine runtime: load an engine folder, run one forward pass per step with CUDA graphs, the slot API.

    engine = Engine.load("engines/smollm2")                 # checks format, GPU and library build
    result = engine.generate([ids_a, ids_b], max_new_tokens=32, sampler=Sampler())
    result.tokens                                           # the new ids of each sequence (stop id excluded)
    engine = Engine.load("engines/llama", kv_memory="0.9")  # a paged KV cache in 90% of the free GPU memory

Two cache layouts, one Engine. Contiguous (kv_cache.SlotCache; slots.py does the work): sequence b lives in cache
slot b, sized for max_seq. Paged (paged_cache.PagedCache; paged_engine.py does the work): a block pool shared by
up to max_batch sequence rows, each with a block table; every call runs as `step` (paged_step.py: decode rows and
prompt chunks of several sequences in one pass). An engine is paged when its manifest has a kv_cache (build
--kv-memory) or the caller passes kv_memory / kv_blocks; Hugging Face graphs, tensor-parallel engines and graphs
that cannot run mixed steps stay contiguous. The only host synchronization of a step is reading the sampled tokens.

Slot-level work, for a server that admits and retires sequences (fdpp_rewrite.serve): `prefill_chunk` runs part of
a prompt into a slot after the tokens already there, `decode_slots` steps only the given slots, `mixed_step` does
both in one pass, `release` frees a slot; a paged engine adds `step`, `blocks_needed`, `attach_prefix` and
`step_budget`. `generate` (generation.py) and `decode` keep the whole-batch form. A tensor-parallel engine's rank 0
mirrors each state-changing call to the other ranks (tp_group.py).

The modules this one uses are its public surface too: Sampler, GenerateResult, pick and upload import from here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fdpp_rewrite.engine import buckets, generation, mixed, paged_engine, slots
from fdpp_rewrite.engine.buckets import pick
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
    wraps the backend (ablations.py: TorchKernels for the stock-torch peer, an ablation for bench --ablate).
    Paged options (paged_engine.py): kv_memory (a fraction of the free memory or "20GiB"; overrides the
    manifest's), kv_blocks (the pool's block count, for tests), prefix_caching."""

    def __init__(self, folder, backend: str | None = None, use_graphs: bool = True, wrapper=None,
                 kv_memory=None, kv_blocks: int | None = None, prefix_caching: bool = True):
        self.paged_options = {"kv_memory": kv_memory, "kv_blocks": kv_blocks, "prefix_caching": prefix_caching}
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
        self.step_ids = torch.zeros(self.max_batch, 1, dtype=torch.int64, device=device)
        self.active = 0
        self.batch_buckets = buckets.batch_buckets(self.max_batch)
        self.kv_buckets = buckets.kv_buckets(self.max_seq)
        self.prefill_buckets = buckets.prefill_buckets(self.max_seq)
        self.hf_feeds = None  # a Hugging Face graph's inputs (hf_interface.py); None for our exporter's graphs
        if self.plan.get("interface") == "hf":
            from fdpp_rewrite.engine.hf_interface import HfFeeds

            self.hf_feeds = HfFeeds(self.plan["inputs"], self.plan["cache_inputs"], self.max_batch, self.max_seq,
                                    device)
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
        self.paged = paged_engine.wanted(self)
        if self.paged:
            paged_engine.setup(self, **self.paged_options)
        else:
            self.kv = SlotCache(self.plan["cache_inputs"], self.max_batch, self.max_seq, self.plan["num_kv_heads"],
                                self.plan["head_dim"], self.dtype, device)
        self.mode = paged_engine if self.paged else slots

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
    def paged_steps(self) -> dict:
        return self.traced.paged_steps

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

    # -- the slot API: slots.py (contiguous) or paged_engine.py (paged) does the work -------------------------------

    @mirrored
    def reset(self) -> None:
        self.mode.reset(self)

    @mirrored
    def prefill(self, slot: int, ids: list[int]):
        """Run a prompt into slot `slot` (its previous contents dropped); returns the last position's logits [V]."""
        return self.mode.prefill(self, slot, ids)

    @mirrored
    def prefill_chunk(self, slot: int, ids: list[int]):
        """Run the next `ids` of a prompt into `slot` after the tokens already there; returns the logits [V] of
        the chunk's last id."""
        return self.mode.prefill_chunk(self, slot, ids)

    @mirrored
    def decode(self, tokens):
        """One decode step of slots [0, active) with tokens [active] (device int64); returns logits [active, V]."""
        return self.mode.decode(self, tokens)

    @mirrored
    def decode_slots(self, slots: list[int], tokens):
        """One decode step of the sequences in `slots` (distinct) with tokens [len(slots)] (device int64); returns
        their logits [len(slots), V] in that order. Only these slots advance."""
        return self.mode.decode_slots(self, slots, tokens)

    def mixed_step(self, slots: list[int], tokens, chunk_slot: int, ids: list[int], padded: int | None = None):
        """decode_slots(slots, tokens) and prefill_chunk(chunk_slot, ids) in one pass (`padded`: the length the
        chunk runs as); returns (the slots' logits [len(slots), V], the chunk's last logits [V])."""
        return self.mode.mixed_step(self, slots, tokens, chunk_slot, ids, padded)

    def assume_length(self, slot: int, length: int) -> None:
        """Warm-up only: mark `slot` as holding `length` tokens of junk, so a walk reaches a KV bucket cheaply."""
        self.mode.assume_length(self, slot, length)

    @mirrored
    def release(self, slot: int) -> None:
        """Free a slot (a paged engine gives its blocks back)."""
        self.mode.release(self, slot)

    def decode_buckets(self, batch: int) -> tuple[int, int]:
        return slots.decode_buckets(self, batch)

    def slot_buckets(self, slot_list: list[int]) -> tuple[int, int]:
        return slots.slot_buckets(self, slot_list)

    def chunk_bucket(self, chunk: int) -> int:
        """The padded length a prompt chunk of `chunk` tokens runs as (its prefill bucket, within max_seq)."""
        return pick(min(chunk, self.max_seq), self.prefill_buckets)

    @property
    def supports_mixed(self) -> bool:
        return self.mixed_reason is None

    # -- the paged engine's step API (paged_engine.py; a contiguous engine refuses in one line) ---------------------

    def step(self, decode_slots: list[int], tokens, chunks: list, padded: int | None = None):
        """One pass: a decode step of `decode_slots` with tokens [len(decode_slots)] (device int64) and the next
        ids of each (slot, ids) in `chunks`; returns (decode logits [len(decode_slots), V], chunk logits
        [len(chunks), V]). Allocates the blocks it needs first: OutOfBlocks, with nothing run, when they are not
        free."""
        return self.mode.step(self, decode_slots, tokens, chunks, padded)

    def blocks_needed(self, decode_slots: list[int], chunks: list) -> int:
        """Blocks step(decode_slots, ..., chunks) would allocate."""
        return self.mode.blocks_needed(self, decode_slots, chunks)

    def attach_prefix(self, slot: int, prompt_ids: list[int]) -> int:
        """A free slot takes the cached full blocks of its prompt; returns the tokens already in cache."""
        return self.mode.attach_prefix(self, slot, prompt_ids)

    def step_budget(self) -> tuple[int, int]:
        """(most decode rows, most chunk tokens) of a step the engine captures as a CUDA graph."""
        return self.mode.step_budget(self)

    # -- batch generation (generation.py) -------------------------------------------------------------------------

    def check_request(self, prompts: list, max_new_tokens: int) -> None:
        generation.check_request(self, prompts, max_new_tokens)

    def prefill_batch(self, prompts: list):
        """Prefill prompt b into slot b (a paged engine: batched chunk rounds); returns the logits [len, V]."""
        return self.mode.prefill_batch(self, prompts)

    def generate(self, prompts: list, max_new_tokens: int, sampler: Sampler | None = None, stop_ids=(),
                 on_tokens=None) -> GenerateResult:
        """Prefill every prompt into its slot, then decode them together (generation.generate)."""
        return generation.generate(self, prompts, max_new_tokens, sampler, stop_ids, on_tokens)
