"""The portable kernels' pure host heuristics (plugins/kernels/portable/portable_heuristics.h) through the C ABI,
without a GPU: the header's worked examples for the MI210 (104 CUs, 64-lane wavefronts) and the H200 (132 SMs)."""

import pytest

from fdpp_rewrite.gpu import lib as fdpp_lib

pytestmark = pytest.mark.skipif(not fdpp_lib.library_path().exists(), reason="plugin library not built")

MI210_CUS, H200_SMS = 104, 132


def _portable():
    from fdpp_rewrite.gpu import portable

    return portable


@pytest.mark.parametrize("rows,kv_len,cus,expected", [
    (32, 4096, MI210_CUS, 7),     # B=1, 32 heads, L=4K: ceil(208 / 32)
    (32, 1024, MI210_CUS, 4),     # L=1K: no split shorter than 256 keys
    (256, 4096, MI210_CUS, 1),    # B=8: 256 blocks fill the GPU
    (1, 32768, MI210_CUS, 64),    # one row, L=32K: at most 64 splits
    (8, 300, MI210_CUS, 1),       # 300 keys: one split of 256 or more
    (32, 4096, H200_SMS, 9),      # the same rule on the H200: ceil(264 / 32)
    (8, 256, MI210_CUS, 1),       # at most 256 keys: never split
])
def test_decode_splits_worked_examples(rows, kv_len, cus, expected):
    assert _portable().decode_splits(rows, kv_len, cus) == expected


def test_decode_splits_stay_in_bounds():
    portable = _portable()
    for rows in (1, 3, 32, 104, 1000):
        for kv_len in (1, 257, 5000, 70000):
            splits = portable.decode_splits(rows, kv_len, MI210_CUS)
            assert 1 <= splits <= 64
            assert splits == 1 or kv_len // splits >= 256
            # never more blocks than two per CU once one split is enough
            assert splits == 1 or rows * (splits - 1) < 2 * MI210_CUS


@pytest.mark.parametrize("m,kernel,m_tile", [
    (1, "gemv", 1), (2, "gemv", 2), (3, "gemv", 4), (4, "gemv", 4),
    (5, "flat", 8), (8, "flat", 8), (9, "flat", 16), (16, "flat", 16),
])
def test_gemm_kernel_and_row_padding(m, kernel, m_tile):
    plan = _portable().gemm_plan(m, 4096, MI210_CUS)
    assert (plan["kernel"], plan["m_tile"]) == (kernel, m_tile)
    if kernel == "gemv":
        assert plan["pairs_per_warp"] == 1


@pytest.mark.parametrize("n,epilogue,cus,expected", [
    (4096, "none", MI210_CUS, 2),      # 2048 pairs: 256 blocks of 2 pairs >= 208
    (4096, "none", H200_SMS, 1),       # ... < 264 on the H200
    (22016, "silu_mul", MI210_CUS, 2),  # 11008 pairs
    (22016, "silu_mul", H200_SMS, 2),
    (1000, "none", MI210_CUS, 1),      # 500 pairs: 63 blocks
])
def test_flat_gemm_rows_per_warp_worked_examples(n, epilogue, cus, expected):
    assert _portable().gemm_plan(16, n, cus, epilogue=epilogue)["pairs_per_warp"] == expected


def test_flat_gemm_stages_one_16_byte_load_per_lane():
    portable = _portable()
    assert portable.gemm_plan(16, 4096, MI210_CUS, warp=64)["k_chunk"] == 512
    assert portable.gemm_plan(16, 4096, H200_SMS, warp=32)["k_chunk"] == 256


def test_the_cuda_library_builds_the_portable_kernels_for_32_lanes():
    assert _portable().warp_size() == 32


def test_gemm_plan_rejects_m_beyond_16_and_bad_arguments():
    portable = _portable()
    with pytest.raises(portable.FdppError, match="M 17 is outside 1..16"):
        portable.gemm_plan(17, 4096, MI210_CUS)
    with pytest.raises(portable.FdppError, match="warp_size 32 or 64"):
        portable.gemm_plan(4, 4096, MI210_CUS, warp=48)
    with pytest.raises(portable.FdppError, match="unknown epilogue"):
        portable.gemm_plan(4, 4096, MI210_CUS, epilogue="gelu")
