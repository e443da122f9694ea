"""The Python dispatch rule (fdpp_rewrite.dispatch) against the C ABI's fdpp_gemm_select over a grid of M and
plans, and its worked examples."""

import pytest

from fdpp_rewrite.dispatch import IMPLA_MAX_M, IMPLB_MAX_M, select_impl
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.resources import plugin_library_path

MS = list(range(1, 81)) + [96, 128, 255, 256, 1000, 4096]
THRESHOLDS = [0, 1, 2, 4, 7, 8, 9, 16, 63, 64, 65, 100]


def grid_plans():
    for m1 in THRESHOLDS:
        for m2 in sorted({m1, m1 + 1, 8, 9, 16, 64, 65, 200}):
            if m2 >= m1:
                for implc in ("cublaslt", "cutlass", "cublas"):
                    yield {"m1": m1, "m2": m2, "implc": implc}


@pytest.mark.parametrize("m, plan, expected", [
    (1, {"m1": 1, "m2": 32}, "impla"), (2, {"m1": 1, "m2": 32}, "implb"), (32, {"m1": 1, "m2": 32}, "implb"),
    (33, {"m1": 1, "m2": 32}, "cublaslt"),                      # gemm_heuristics.h's o_proj example
    (1, {"m1": 0, "m2": 16, "implc": "cutlass"}, "implb"),       # m1 = 0: never ImplA
    (5, {"m1": 4, "m2": 4}, "cublaslt"),                        # m2 = m1: never ImplB
    (8, {"m1": 100, "m2": 200}, "impla"), (9, {"m1": 100, "m2": 200}, "implb"),  # ImplA stops at M = 8
    (64, {"m1": 0, "m2": 200}, "implb"), (65, {"m1": 0, "m2": 200}, "cublaslt"),  # ImplB stops at M = 64
    (100, {"m1": 0, "m2": 16, "implc": "cublas"}, "cublaslt"),  # the contract's spelling of cuBLASLt
])
def test_worked_examples(m, plan, expected):
    assert select_impl(m, plan) == expected


@pytest.mark.parametrize("m, plan, message", [
    (0, {"m1": 1, "m2": 16}, "M must be at least 1"),
    (1, {"m1": -1, "m2": 16}, "m1 must be >= 0"),
    (1, {"m1": 8, "m2": 4}, "m2 must be >= m1"),
    (1, {"m1": 0, "m2": 4, "implc": "magma"}, "implc must be one of"),
])
def test_bad_input_is_refused(m, plan, message):
    with pytest.raises(FdppError, match=message):
        select_impl(m, plan)


def test_caps_are_the_kernels_limits():
    assert (IMPLA_MAX_M, IMPLB_MAX_M) == (8, 64)


@pytest.mark.skipif(not plugin_library_path().exists(),
                    reason=f"plugin library {plugin_library_path()} not built (make lib, or set FDPP_PLUGIN_LIB)")
def test_equals_fdpp_gemm_select_over_a_grid():
    from fdpp_rewrite.gpu import gemm

    checked = 0
    for plan in grid_plans():
        c_plan = dict(plan, implb={"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1})
        for m in MS:
            assert select_impl(m, plan) == gemm.select(m, c_plan), (m, plan)
            checked += 1
    assert checked > 10000


@pytest.mark.skipif(not plugin_library_path().exists(),
                    reason=f"plugin library {plugin_library_path()} not built (make lib, or set FDPP_PLUGIN_LIB)")
@pytest.mark.parametrize("m, plan", [(0, {"m1": 1, "m2": 16}), (1, {"m1": -1, "m2": 16}), (1, {"m1": 8, "m2": 4})])
def test_refuses_what_fdpp_gemm_select_refuses(m, plan):
    from fdpp_rewrite.gpu import gemm

    c_plan = dict(plan, implb={"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1})
    with pytest.raises(FdppError):
        gemm.select(m, c_plan)
    with pytest.raises(FdppError):
        select_impl(m, plan)


@pytest.mark.parametrize("plan, text", [
    ({"m1": 0, "m2": 8}, "implb for M 1-8, cublaslt for M >= 9"),
    ({"m1": 2, "m2": 100, "implc": "cutlass"}, "impla for M 1-2, implb for M 3-64, cutlass for M >= 65"),
    ({"m1": 1, "m2": 1}, "impla for M = 1, cublaslt for M >= 2"),
])
def test_describe_plan(plan, text):
    from fdpp_rewrite.dispatch import describe_plan

    assert describe_plan(plan) == text
