"""How big the KV block pool is: --kv-memory parsed, and the number of 64-token blocks that fit.

    parse_kv_memory("0.9")        # ("fraction", 0.9): 90% of the GPU memory free after the weights
    parse_kv_memory("40GiB")      # ("bytes", 42949672960); "40G" is the same, "40GB" is 40 * 10**9
    per_token = kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)   # 131072: K and V
    pool_blocks(("fraction", 0.9), free_bytes=120 * 2**30, bytes_per_token=per_token)   # 13824 (incl. null)
    capacity_sequences(13824, 8192)   # 107 sequences of 8K tokens

The pool is one tensor [num_blocks, Hkv, 64, D] per K and V of each layer, so a block costs 64 tokens' K/V over all
layers, and the null block (blocks.py) is counted like any other.
"""

from __future__ import annotations

import re

from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE, blocks_for
from fdpp_rewrite.errors import FdppError

# binary units (with or without the "i") and decimal ones, matched case-insensitively
_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_ACCEPTED = ("give a fraction of free GPU memory in (0, 1] or a size such as 40GiB (KiB, MiB, GiB, TiB or K, M, G, "
             "T are powers of 2; KB, MB, GB, TB powers of 10)")


def parse_kv_memory(text: str) -> tuple[str, float | int]:
    """("fraction", f) for 0 < f <= 1, ("bytes", n) for a size with a unit; a one-line FdppError otherwise."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", str(text))
    if found:
        number, unit = float(found.group(1)), found.group(2).lower()
        if not unit and 0 < number <= 1:
            return ("fraction", number)
        if unit in _UNITS and int(number * _UNITS[unit]) > 0:
            return ("bytes", int(number * _UNITS[unit]))
    raise FdppError(f"--kv-memory {text}: {_ACCEPTED}")


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes one token's K and V take over all layers."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def pool_blocks(kv_memory, free_bytes: int, bytes_per_token: int, reserve_bytes: int = 0) -> int:
    """Blocks (the null block included) the KV pool gets. `kv_memory`: parse_kv_memory's result or its text;
    `free_bytes`: free GPU memory after the weights; `reserve_bytes`: kept back from it for what is allocated after
    the pool (activations, graph memory). A fraction takes that share of free - reserve; a size must fit in it."""
    kind, amount = parse_kv_memory(kv_memory) if isinstance(kv_memory, str) else kv_memory
    available = free_bytes - reserve_bytes
    shown = kv_memory.strip() if isinstance(kv_memory, str) else f"{amount:g}" if kind == "fraction" else _gib(amount)
    if kind == "bytes" and amount > available:
        raise FdppError(f"--kv-memory {shown} is more than the {_gib(available)} of GPU memory free for the KV "
                        f"cache ({_gib(free_bytes)} free, {_gib(reserve_bytes)} kept back); give at most that, or a "
                        "fraction such as 0.9")
    budget = int(amount * max(available, 0)) if kind == "fraction" else amount
    block_bytes = bytes_per_token * KV_BLOCK_SIZE
    blocks = budget // block_bytes
    if blocks < 2:
        raise FdppError(f"--kv-memory {shown} gives the KV cache {_gib(budget)}, less than 2 blocks of "
                        f"{_gib(block_bytes)} ({KV_BLOCK_SIZE} tokens); give it more memory (a larger --kv-memory) "
                        "or free GPU memory (a smaller model or fewer other processes)")
    return blocks


def capacity_sequences(num_blocks: int, seq_len: int) -> int:
    """How many sequences of `seq_len` tokens a pool of `num_blocks` (null block included) holds at once."""
    return (num_blocks - 1) // blocks_for(seq_len)


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"
