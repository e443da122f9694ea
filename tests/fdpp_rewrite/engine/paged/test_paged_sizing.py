"""Sizing the KV block pool (engine/paged/sizing.py): --kv-memory parsing, bytes per token, blocks that fit, and
the capacity bar of issue 39 (8K-token sequences admitted within 5% of free KV memory / (bytes per token x 8K))."""

import pytest

from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE
from fdpp_rewrite.engine.paged.sizing import capacity_sequences, kv_bytes_per_token, parse_kv_memory, pool_blocks
from fdpp_rewrite.errors import FdppError

GIB = 2**30


@pytest.mark.parametrize("text, parsed", [
    ("0.9", ("fraction", 0.9)), ("1", ("fraction", 1.0)), (" .25 ", ("fraction", 0.25)),
    ("20GiB", ("bytes", 20 * GIB)), ("20G", ("bytes", 20 * GIB)), ("20gib", ("bytes", 20 * GIB)),
    ("20GB", ("bytes", 20 * 10**9)), ("512MiB", ("bytes", 512 * 2**20)), ("512MB", ("bytes", 512 * 10**6)),
    ("1.5GiB", ("bytes", 3 * GIB // 2)), ("2 TiB", ("bytes", 2 * 2**40)),
])
def test_parse_kv_memory_takes_a_fraction_or_a_size(text, parsed):
    assert parse_kv_memory(text) == parsed


@pytest.mark.parametrize("text", ["1.5", "0", "0.0", "-0.5", "40", "20XB", "GiB", "", "0GiB", "nan", "0.9 0.1"])
def test_parse_kv_memory_refuses_anything_else_in_one_line(text):
    with pytest.raises(FdppError) as caught:
        parse_kv_memory(text)
    message = str(caught.value)
    assert message.startswith(f"--kv-memory {text}: give a fraction") and "GiB" in message and "GB" in message
    assert "\n" not in message


def test_kv_bytes_per_token_counts_k_and_v_of_every_layer():
    assert kv_bytes_per_token(layers=32, kv_heads=32, head_dim=128, dtype_bytes=2) == 512 * 1024  # llama-2-7b
    assert kv_bytes_per_token(layers=3, kv_heads=5, head_dim=64, dtype_bytes=4) == 2 * 3 * 5 * 64 * 4


def test_pool_blocks_fit_the_budget_null_block_included():
    per_token = kv_bytes_per_token(32, 8, 128, 2)
    block = per_token * KV_BLOCK_SIZE  # 8 MiB
    assert pool_blocks(("fraction", 0.9), 120 * GIB, per_token) == int(0.9 * 120 * GIB) // block == 13824
    assert pool_blocks("0.5", 100 * GIB, per_token, reserve_bytes=20 * GIB) == 40 * GIB // block
    assert pool_blocks("20GiB", 100 * GIB, per_token) == 20 * GIB // block == 2560
    assert pool_blocks(("bytes", 20 * GIB), 100 * GIB, per_token) == 2560
    assert pool_blocks("20GB", 100 * GIB, per_token) == 20 * 10**9 // block
    assert pool_blocks("16MiB", GIB, per_token) == 2  # the least that works: the null block and one more


@pytest.mark.parametrize("kv_memory, free, reserve, words", [
    ("15MiB", GIB, 0, "less than 2 blocks"),
    ("0.01", GIB, 0, "less than 2 blocks"),
    ("0.9", GIB, 2 * GIB, "less than 2 blocks"),
    ("200GiB", 100 * GIB, 0, "more than the 100.00 GiB"),
    ("90GiB", 100 * GIB, 20 * GIB, "more than the 80.00 GiB"),
    ("1.5", 100 * GIB, 0, "give a fraction"),
])
def test_pool_blocks_refuses_a_pool_that_cannot_work_in_one_line(kv_memory, free, reserve, words):
    with pytest.raises(FdppError, match=words) as caught:
        pool_blocks(kv_memory, free, kv_bytes_per_token(32, 8, 128, 2), reserve_bytes=reserve)
    assert f"--kv-memory {kv_memory}" in str(caught.value) and "\n" not in str(caught.value)


def test_capacity_sequences_counts_whole_sequences():
    assert capacity_sequences(2, 64) == 1 and capacity_sequences(2, 65) == 0
    assert capacity_sequences(129, 8192) == 1 and capacity_sequences(257, 8192) == 2
    assert capacity_sequences(1001, 100) == 500  # 2 blocks each


@pytest.mark.parametrize("layers, kv_heads, head_dim, free_gib", [
    (32, 32, 128, 126.0),   # llama-2-7b fp16 on an H200
    (32, 8, 128, 124.5),    # llama-3-8b (GQA)
    (80, 8, 128, 60.0),     # a 70B-class model, 2.5 GiB per 8K sequence: 21 of them
    (30, 3, 64, 139.0),     # smollm2-135m-like
])
def test_capacity_at_kv_memory_0_9_is_within_5_percent_of_ideal(layers, kv_heads, head_dim, free_gib):
    per_token = kv_bytes_per_token(layers, kv_heads, head_dim, 2)
    free = int(free_gib * GIB)
    admitted = capacity_sequences(pool_blocks("0.9", free, per_token), 8192)
    ideal = 0.9 * free / (per_token * 8192)
    # what is lost: the null block and the budget's last partial block, so at most one sequence below the ideal
    assert int(ideal) - 1 <= admitted <= ideal and admitted >= 0.95 * ideal, (admitted, ideal)
