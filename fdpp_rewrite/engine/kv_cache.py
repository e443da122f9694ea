"""The KV cache of contiguous slots: one allocation per cache input, the slots' lengths on the host and the GPU.

    cache = SlotCache(names, max_batch=4, max_seq=2048, kv_heads=8, head_dim=128, dtype=torch.float16, device=dev)
    cache.views(slice(0, 2), 256)      # {name: tensor[0:2, :, :256]}: what a step of slots 0-1 reads and writes
    cache.set_length(1, 40)            # slot 1 holds 40 tokens (host mirror and GPU, no host synchronization)

Slot s is row s of every tensor [max_batch, Hkv, max_seq, D]; its length is lengths[s] on the host (known without a
readback: prompt length + steps) and past_len[s] on the GPU, the graph input that positions RoPE and masks the
attention. A paged engine keeps a PagedCache (paged_cache.py: a block pool and a block table per sequence) instead.
"""

from __future__ import annotations

import numpy as np
import torch

from fdpp_rewrite.errors import FdppError


def upload(values, device) -> torch.Tensor:
    """`values` (a list of ints: int64; a CPU tensor or a numpy array: its dtype) on `device` with no host
    synchronization: staged in pinned memory and copied on the current stream. A plain torch.tensor(...,
    device="cuda"), or a copy_ from pageable memory, first waits for every kernel queued on the stream: the GPU would
    idle while the host prepares the next step."""
    if isinstance(values, torch.Tensor):
        host = values
    elif isinstance(values, np.ndarray):
        host = torch.from_numpy(np.ascontiguousarray(values))
    else:
        host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def check_fits(longest: int, max_seq: int) -> None:
    """A step needs `longest` positions in some sequence: refuse one past max_seq in one line."""
    if longest > max_seq:
        raise FdppError(f"a sequence reached the engine's max sequence {max_seq}; rebuild with a larger --max-seq")


class SlotCache:
    def __init__(self, names: list, max_batch: int, max_seq: int, kv_heads: int, head_dim: int, dtype, device):
        self.names, self.max_batch, self.max_seq, self.device = list(names), max_batch, max_seq, device
        shape = (max_batch, kv_heads, max_seq, head_dim)
        self.tensors = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.names]
        self.past_len = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.lengths = [0] * max_batch

    def views(self, slots: slice, kv_len: int) -> dict:
        """{cache input name: its rows of `slots` over positions [:kv_len]} (views: steps write them in place)."""
        return {name: tensor[slots, :, :kv_len] for name, tensor in zip(self.names, self.tensors)}

    def check_fits(self, longest: int) -> None:
        check_fits(longest, self.max_seq)

    def set_length(self, slot: int, length: int) -> None:
        """A slot's length on the host and on the GPU, there in stream order with no host synchronization (an item
        assignment of a Python int is a pageable copy, which first waits for every kernel queued: a whole step)."""
        self.lengths[slot] = length
        self.past_len[slot:slot + 1].copy_(upload([length], self.device))

    def advance_first(self, count: int) -> None:
        """Slots [0, count) each took one token (a whole-batch decode step)."""
        self.past_len[:count] += 1
        for slot in range(count):
            self.lengths[slot] += 1

    def advance(self, slots: list[int], bucket_batch: int) -> None:
        """`slots` each took one token; the GPU lengths of slots [0, bucket_batch) follow in one copy."""
        for slot in slots:
            self.lengths[slot] += 1
        self.sync(bucket_batch)

    def sync(self, count: int) -> None:
        """past_len[:count] <- the host lengths, in one stream-ordered copy."""
        self.past_len[:count].copy_(upload(self.lengths[:count], self.device))

    def reset(self) -> None:
        self.past_len.zero_()
        self.lengths = [0] * self.max_batch
