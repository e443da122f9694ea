"""The attention planner's pure host heuristics, through the C ABI, without a GPU: the worked examples of
plugins/kernels/attention/attention_heuristics.h."""

import pytest

from fdpp_rewrite.gpu import lib as fdpp_lib

pytestmark = pytest.mark.skipif(not fdpp_lib.library_path().exists(), reason="plugin library not built")

H200_SMS, H200_DECODE_CTAS_PER_SM = 132, 2
H200_PREFILL_SLOTS = 132 * 2


@pytest.mark.parametrize("units,tiles,expected", [
    (32, 16, 4),     # B=1, 32 KV heads, L=1K: 4 splits of 4 tiles, one CTA per SM
    (32, 512, 4),    # B=1, L=32K: 4 MB per CTA
    (256, 16, 1),    # B=8, L=1K: 256 units already fill the GPU
    (256, 128, 1),   # B=8, L=8K
    (256, 512, 4),   # B=8, L=32K: one wave of very long rows -> 4 splits (measured faster)
    (512, 512, 1),   # B=16, L=32K: two equal waves already
    (8, 128, 16),    # GQA 32/8, B=1, L=8K
    (8, 16, 16),     # GQA, L=1K: 16 splits of 1 tile
    (64, 128, 2),    # GQA 32/8, B=8, L=8K (one row block per KV head)
    (64, 512, 4),    # GQA 32/8, B=8, L=32K: long rows, at most 2 splits by the main rule -> 4
    (1, 4096, 128),  # capped at 128 splits
    (5, 1, 1),       # a single tile cannot be split
])
def test_decode_splits_worked_examples(units, tiles, expected):
    from fdpp_rewrite.gpu.attention import decode_splits

    assert decode_splits(units, tiles, H200_SMS, H200_DECODE_CTAS_PER_SM) == expected


@pytest.mark.parametrize("splits,cc_major,ctas,expected", [
    (2, 9, 128, True),    # GQA 32/8, B=8, L=1K-8K: 64 units x 2 splits, one CTA per SM
    (4, 9, 128, True),    # B=1, 32 heads (the launcher then finds too few clusters of 4 resident: kernel)
    (8, 9, 64, True),     # the portable cluster size
    (16, 9, 128, False),  # GQA B=1: 16 splits, more than a cluster of 8
    (1, 9, 256, False),   # one split: nothing to combine
    (4, 9, 256, False),   # GQA B=8 L=32K: 256 CTAs, two per SM
    (2, 8, 128, False),   # not sm_90: no cluster code in the library there
    (2, 10, 128, False),  # a newer GPU runs the compute_80 PTX
])
def test_cluster_combine_rule(splits, cc_major, ctas, expected):
    from fdpp_rewrite.gpu.attention import cluster_combine_ok

    assert cluster_combine_ok(splits, cc_major, ctas, H200_SMS) == expected


@pytest.mark.parametrize("ctas,cluster,tiles_per_split,expected", [
    (256, False, 16, 2),   # MHA B=8 L=1K: one split, two CTAs per SM
    (1024, False, 128, 2),  # MHA B=8 L=32K: 4 splits, four waves' worth
    (256, False, 128, 2),  # GQA 32/8 B=8 L=32K: 4 splits
    (128, False, 32, 4),   # GQA B=1 L=32K: 16 splits of 32 tiles, one CTA per SM
    (128, False, 128, 4),  # MHA B=1 L=32K: 4 splits of 128 tiles
    (128, False, 8, 3),    # GQA B=1 L=8K: 16 splits of 8 tiles
    (128, False, 1, 3),    # GQA B=1 L=1K: 16 splits of one tile
    (128, True, 64, 3),    # GQA B=8 L=8K in clusters of 2: the cluster kernel has 3 stages
    (96, True, 6, 3),      # MHA B=1 L=1K: 3 splits in clusters
])
def test_decode_stages_worked_examples(ctas, cluster, tiles_per_split, expected):
    from fdpp_rewrite.gpu.attention import decode_stages

    assert decode_stages(ctas, H200_SMS, cluster, tiles_per_split) == expected


def test_decode_splits_give_at_most_one_cta_per_sm_unless_rows_are_long():
    from fdpp_rewrite.gpu.attention import decode_splits

    for units in (1, 3, 7, 32, 100, 131):
        for tiles in (2, 17, 500):
            splits = decode_splits(units, tiles, H200_SMS, H200_DECODE_CTAS_PER_SM)
            assert 1 <= splits <= min(tiles, 128)
            assert units * splits <= H200_SMS


def test_decode_splits_long_rows_take_four_splits_only_when_the_rule_gives_at_most_two_in_one_wave():
    from fdpp_rewrite.gpu.attention import decode_splits

    for units in (45, 60, 67, 133, 200, 264):  # at most 2 splits by the one-CTA-per-SM rule, one wave at 1 split
        assert decode_splits(units, 511, H200_SMS, H200_DECODE_CTAS_PER_SM) == max(1, H200_SMS // units)
        assert decode_splits(units, 512, H200_SMS, H200_DECODE_CTAS_PER_SM) == 4
    assert decode_splits(265, 4096, H200_SMS, H200_DECODE_CTAS_PER_SM) == 1  # more units than slots: equal waves
    assert decode_splits(33, 4096, H200_SMS, H200_DECODE_CTAS_PER_SM) == 4  # 132 // 33 = 4 by the main rule
    assert decode_splits(8, 4096, H200_SMS, H200_DECODE_CTAS_PER_SM) == 16  # long rows, many splits: unchanged


@pytest.mark.parametrize("heads,seq,expected", [
    (32, 1024, (2, True)),     # B=1, 32 heads, L=1K: 256 blocks of 128 rows (under two waves) -> 64-row blocks,
                               # where the synchronized softmax measured faster
    (32, 4096, (1, False)),    # L=4K: 1024 blocks balance themselves -> 128-row blocks, unified max
    (32, 16384, (1, False)),   # L=16K
    (8 * 32, 1024, (1, False)),  # B=8 at L=1K: 2048 blocks
    (4, 200, (2, True)),       # a short prompt
    (32, 2048, (2, True)),     # 512 blocks <= 528
    (32, 2304, (1, False)),    # 576 blocks > 528
])
def test_prefill_plan_worked_examples(heads, seq, expected):
    from fdpp_rewrite.gpu.attention import prefill_plan

    assert prefill_plan(heads, seq, H200_PREFILL_SLOTS) == expected
