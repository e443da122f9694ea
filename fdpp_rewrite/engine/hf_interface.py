"""The engine's adapter for graphs `torch.onnx.export` writes from transformers' models (dynamo=True or False).

Their interface: input_ids [batch, seq], attention_mask [batch, past + seq], position_ids [batch, seq] (and
cache_position [seq] where the export kept it), past_key_values.N.key/value [batch, kv_heads, past, head_dim] in;
logits and present.N.key/value = Concat(past, new) out. The engine runs them on its own cache layout:

- build first fuses each layer's RoPE and its cache Concats into one fdpp::RopeAppend on the engine's cache views
  (fuse_cache_rope: passes/rope_hf_cache.py proves the tables are cos/sin(position_ids * inv_freq)), so the layer
  runs the kernels an fdpp export's layer runs; then (lower_cache_concats) each Concat still making a present
  output (a layer left unfused, or a model without RoPE such as OPT) becomes CacheAppend (ops.cache_append). Either
  way the new rows are written in place into the runtime's cache at each sequence's own length, and the present is
  the cache view [batch, kv_heads, past + seq, head_dim]; no cache is ever copied.
- The runtime (HfFeeds) feeds past_key_values.N.* as the views cache[slots, :, :past] and the CacheAppend buffers
  as cache[slots, :, :past + seq] of the same allocation. A sequence's rows are [0, length) of its slot, so the
  attention_mask is a prefix of ones: rows the sequence wrote, plus its new ones.
- Prefill (batch 1, a slot) feeds past = the slot's length exactly: the graph's causal rule (key j visible to
  query i iff j <= past + i) is then the prompt's own. A decode step (one token) feeds past = KV bucket - 1 for
  every slot of the batch bucket; sequence b's row goes to lengths[b] <= past and the mask hides rows past it,
  so a batch of different lengths shares one graph shape per bucket (and one CUDA graph).
Example: lengths 3 and 5 in the KV bucket 128: past views 127 rows, the new rows go to rows 3 and 5, the masks
are 1 on rows 0..3 and 0..5, position_ids 3 and 5.

The interface's names (past_key_values.N.*, present.N.*, what makes a graph a transformers export) are defined in
fdpp_rewrite/hf_graph.py, which the CPU compare reads too without importing torch.
"""

from __future__ import annotations

import torch

from fdpp_rewrite.engine.ops import ENGINE_DOMAIN
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.hf_graph import past_names, present_name

BUFFER_PREFIX = "engine.cache."  # + the past input's name: the cache view a CacheAppend writes into
WRITE_POS = "engine.write_pos"  # [batch] int64: the row each sequence's new tokens start at (its length)
OPTIONAL_INPUTS = ("position_ids", "cache_position")


def past_inputs(input_names, path) -> list:
    """The past_key_values.N.key/value inputs in layer order (key before value); a one-line error for a
    prefill-only export or an input the engine cannot feed."""
    past = past_names(input_names)
    if not past:
        raise FdppError(f"{path} is a prefill-only Hugging Face export (no past_key_values.N.key/value inputs); the "
                        "engine needs the decode-with-cache export (past_key_values.N.* in, present.N.* out)")
    known = {"input_ids", "attention_mask", *OPTIONAL_INPUTS, *past, *(BUFFER_PREFIX + name for name in past),
             WRITE_POS}
    unknown = sorted(set(input_names) - known)
    if unknown:
        raise FdppError(f"{path} takes the input '{unknown[0]}'; the engine feeds a Hugging Face graph only "
                        "input_ids, attention_mask, position_ids, cache_position and past_key_values.N.*")
    return past


def fuse_cache_rope(model, path):
    """The model with each layer's RoPE + cache Concats fused into RopeAppend on the engine's cache views where the
    pass can prove it (module docstring); the rest is left for lower_cache_concats."""
    import onnx_graphsurgeon as gs

    from fdpp_rewrite.passes import rope_hf_cache
    from fdpp_rewrite.passes.weights import attach_external_data

    graph = gs.import_onnx(model)
    attach_external_data(graph, str(path.parent))  # read lazily: only the small RoPE tables are loaded
    if not rope_hf_cache.run(graph, lambda name: BUFFER_PREFIX + name, WRITE_POS).total:
        return model
    return gs.export_onnx(graph)


def lower_cache_concats(nodes: list, past: list, path) -> None:
    """Replace the Concat(past, new) behind each present output by an in-place CacheAppend (module docstring); a
    present a fused RopeAppend already writes stays as it is."""
    producer = {name: node for node in nodes for name in node["outputs"]}

    def source(name):  # through one-input Concats and Identity, which the TorchScript export leaves in
        node = producer.get(name)
        while node is not None and (node["op"] == "Identity" or (node["op"] == "Concat" and len(node["inputs"]) == 1)):
            name = node["inputs"][0]
            node = producer.get(name)
        return name

    for name in past:
        present = present_name(name)
        node = producer.get(present)
        if node is not None and node["op"] == "RopeAppend":
            continue
        if (node is None or node["op"] != "Concat" or node["attrs"].get("axis") not in (2, -2)
                or len(node["inputs"]) != 2 or source(node["inputs"][0]) != name):
            raise FdppError(f"{path}: the output {present} is not Concat({name}, new rows) on the sequence axis; "
                            "the engine appends to its cache only in that form (export with a DynamicCache)")
        node.update(op="CacheAppend", domain=ENGINE_DOMAIN, attrs={},
                    inputs=[node["inputs"][1], BUFFER_PREFIX + name, WRITE_POS])


class HfFeeds:
    """The inputs of a Hugging Face graph's prefill and decode steps, over the engine's caches (module docstring).
    A decode step's inputs are views of persistent buffers (the mask, the engine's step_ids and past_len), so a
    captured CUDA graph replays on new values after refresh_decode_mask."""

    def __init__(self, input_names, past: list, max_batch: int, max_seq: int, device):
        self.input_names, self.past, self.device = set(input_names), past, device
        self.mask = torch.zeros(max_batch, max_seq, dtype=torch.int64, device=device)
        self.rows = torch.arange(max_seq, dtype=torch.int64, device=device)
        self.cache_positions = {}  # past -> [past] on the device: a decode bucket's cache_position

    def _feeds(self, input_ids, mask, positions, cache_position, caches, slots, past: int, write_pos) -> dict:
        seq = input_ids.shape[1]
        feeds = {"input_ids": input_ids, "attention_mask": mask, WRITE_POS: write_pos}
        if "position_ids" in self.input_names:
            feeds["position_ids"] = positions
        if "cache_position" in self.input_names:
            feeds["cache_position"] = cache_position
        for name, cache in zip(self.past, caches):
            feeds[name] = cache[slots, :, :past]
            feeds[BUFFER_PREFIX + name] = cache[slots, :, :past + seq]
        return feeds

    def prefill(self, input_ids, caches, slot: int, start: int) -> dict:
        """A prompt chunk of one slot after the `start` tokens already in it (batch 1, past = start)."""
        seq = input_ids.shape[1]
        mask = torch.ones(1, start + seq, dtype=torch.int64, device=self.device)
        positions = torch.arange(start, start + seq, dtype=torch.int64, device=self.device)
        write_pos = torch.tensor([start], dtype=torch.int64, device=self.device)
        return self._feeds(input_ids, mask, positions.reshape(1, seq), positions, caches, slice(slot, slot + 1),
                           start, write_pos)

    def decode(self, step_ids, lengths, caches, batch: int, kv_len: int) -> dict:
        """One token per slot of [0, batch): lengths (the engine's past_len view) are the write rows and the
        positions; the past view is kv_len - 1 rows, the mask the persistent buffer's [batch, kv_len] view."""
        past = kv_len - 1
        if past not in self.cache_positions:
            self.cache_positions[past] = torch.tensor([past], dtype=torch.int64, device=self.device)
        self.refresh_decode_mask(lengths, batch, kv_len)
        return self._feeds(step_ids, self.mask[:batch, :kv_len], lengths.reshape(batch, 1),
                           self.cache_positions[past], caches, slice(0, batch), past, lengths)

    def refresh_decode_mask(self, lengths, batch: int, kv_len: int) -> None:
        """mask[b, j] = 1 for the rows sequence b holds and the one it writes now (j <= lengths[b])."""
        self.mask[:batch, :kv_len].copy_(self.rows[:kv_len].reshape(1, kv_len) <= lengths.reshape(batch, 1))
