"""The attention planner's pure host heuristics, through the C ABI, without a GPU: the worked examples of
plugins/kernels/attention_heuristics.h."""

import pytest

from fdpp_rewrite.gpu import lib as fdpp_lib

pytestmark = pytest.mark.skipif(not fdpp_lib.library_path().exists(), reason="plugin library not built")

H200_SLOTS = 132 * 2


@pytest.mark.parametrize("units,tiles,expected", [
    (32, 16, 8),     # B=1, 32 KV heads, L=1K: 8 splits of 2 tiles, 256 CTAs in one wave
    (32, 512, 8),    # B=1, L=32K: still one wave, 2 MB per CTA
    (256, 128, 1),   # B=8, L=8K: 256 units already fill the slots
    (256, 16, 1),    # B=8, L=1K
    (256, 512, 2),   # B=8, L=32K: one wave of very long rows -> 2 splits (measured faster)
    (512, 512, 1),   # B=16, L=32K: two equal waves already
    (8, 128, 33),    # GQA, 8 KV heads, L=8K
    (8, 16, 16),     # capped by the number of tiles
    (512, 64, 1),    # more units than slots: one split, equal waves
    (1, 4096, 128),  # capped at 128 splits
    (5, 1, 1),       # a single tile cannot be split
])
def test_decode_splits_worked_examples(units, tiles, expected):
    from fdpp_rewrite.gpu.attention import decode_splits

    assert decode_splits(units, tiles, H200_SLOTS) == expected


def test_decode_splits_fill_but_never_exceed_one_wave():
    from fdpp_rewrite.gpu.attention import decode_splits

    for units in (1, 3, 7, 32, 100, 263):
        for tiles in (2, 17, 500):
            splits = decode_splits(units, tiles, H200_SLOTS)
            assert 1 <= splits <= min(tiles, 128)
            assert units * splits <= H200_SLOTS


def test_decode_splits_long_rows_take_two_half_waves_only_when_one_split_fills_the_wave():
    from fdpp_rewrite.gpu.attention import decode_splits

    for units in (133, 200, 264):  # one split fills (most of) the wave
        assert decode_splits(units, 511, H200_SLOTS) == 1
        assert decode_splits(units, 512, H200_SLOTS) == 2
    assert decode_splits(265, 4096, H200_SLOTS) == 1  # more units than slots: equal waves already
    assert decode_splits(100, 4096, H200_SLOTS) == 2  # 264 // 100 = 2 by the one-wave rule anyway


@pytest.mark.parametrize("heads,seq,expected", [
    (32, 1024, 2),     # B=1, 32 heads, L=1K: 256 blocks of 128 rows (under two waves) -> 64-row blocks
    (32, 4096, 1),     # L=4K: 1024 blocks balance themselves -> 128-row blocks
    (32, 16384, 1),    # L=16K
    (8 * 32, 1024, 1),  # B=8 at L=1K: 2048 blocks
    (4, 200, 2),       # a short prompt
    (32, 2048, 2),     # 512 blocks <= 528
    (32, 2304, 1),     # 576 blocks > 528
])
def test_prefill_tile_config_worked_examples(heads, seq, expected):
    from fdpp_rewrite.gpu.attention import prefill_plan

    assert prefill_plan(heads, seq, H200_SLOTS)[0] == expected
