"""The Python dispatch rule (fdpp_rewrite.dispatch) against the C ABI's fdpp_gemm_select over a grid of M and
plans, and its worked examples."""

import pytest

from fdpp_rewrite.dispatch import IMPLA_MAX_M, IMPLB_MAX_M, IMPLB_WGMMA_MAX_M, implb_range, plan_problem, select_impl
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.resources import plugin_library_path

MS = list(range(1, 81)) + [96, 127, 128, 129, 200, 255, 256, 257, 300, 1000, 4096]
THRESHOLDS = [0, 1, 2, 4, 7, 8, 9, 16, 63, 64, 65, 100]
MMA = {"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1}
WGMMA_CONFIG = {"n_tile": 64, "k_tile": 64, "stages": 8, "split_k": 2, "loader": "wgmma"}


def grid_plans():
    """m1 <= m2 plans without a third range, then third ranges (m3 from below m2 to past 256, a first config of
    either kind, a wgmma range's config of either kind: valid and refused ones), and a wgmma first config with
    m2 300 (ImplB up to 256)."""
    for m1 in THRESHOLDS:
        for m2 in sorted({m1, m1 + 1, 8, 9, 16, 64, 65, 200}):
            if m2 >= m1:
                for implc in ("cublaslt", "cutlass", "cublas"):
                    yield {"m1": m1, "m2": m2, "implc": implc}
                for m3 in sorted({m2 - 1, m2, m2 + 1, 17, 64, 128, 256, 257}):
                    for wgmma in (WGMMA_CONFIG, MMA):
                        yield {"m1": m1, "m2": m2, "m3": m3, "wgmma": wgmma}
    yield {"m1": 0, "m2": 300, "implb": WGMMA_CONFIG}
    yield {"m1": 0, "m2": 16, "implb": WGMMA_CONFIG, "m3": 200, "wgmma": WGMMA_CONFIG}


def c_plan(plan):
    """The plan as the C ABI takes it: the grid's first config where it names none."""
    return {"implb": MMA, **plan}


@pytest.mark.parametrize("m, plan, expected", [
    (1, {"m1": 1, "m2": 32}, "impla"), (2, {"m1": 1, "m2": 32}, "implb"), (32, {"m1": 1, "m2": 32}, "implb"),
    (33, {"m1": 1, "m2": 32}, "cublaslt"),                      # gemm_heuristics.h's o_proj example
    (1, {"m1": 0, "m2": 16, "implc": "cutlass"}, "implb"),       # m1 = 0: never ImplA
    (5, {"m1": 4, "m2": 4}, "cublaslt"),                        # m2 = m1: never ImplB
    (8, {"m1": 100, "m2": 200}, "impla"), (9, {"m1": 100, "m2": 200}, "implb"),  # ImplA stops at M = 8
    (64, {"m1": 0, "m2": 200}, "implb"), (65, {"m1": 0, "m2": 200}, "cublaslt"),  # ImplB stops at M = 64
    (100, {"m1": 0, "m2": 16, "implc": "cublas"}, "cublaslt"),  # the contract's spelling of cuBLASLt
    (17, {"m1": 0, "m2": 16, "m3": 128}, "implb"), (128, {"m1": 0, "m2": 16, "m3": 128}, "implb"),  # wgmma range
    (129, {"m1": 0, "m2": 16, "m3": 128}, "cublaslt"),
    (200, {"m1": 0, "m2": 300, "implb_loader": "wgmma"}, "implb"),  # a node's wgmma first config: up to 256
])
def test_worked_examples(m, plan, expected):
    assert select_impl(m, plan) == expected


@pytest.mark.parametrize("m, plan, expected", [
    (16, {"m1": 0, "m2": 16, "m3": 128}, "implb"), (17, {"m1": 0, "m2": 16, "m3": 128}, "wgmma"),
    (17, {"m1": 0, "m2": 16, "m3": 0}, "cublaslt"),      # the FlatGemm attribute's default 0: m3 = m2
    (17, {"m1": 0, "m2": 16, "m3": 16}, "cublaslt"),     # m3 = m2: no range
    (9, {"m1": 16, "m2": 16, "m3": 64}, "implb"),        # ImplA stops at 8, the first ImplB config takes 9..16
    (17, {"m1": 16, "m2": 16, "m3": 64}, "wgmma"),
    (17, {"m1": 0, "m2": 16, "m3": 64, "implb_wgmma_stages": 4}, "wgmma"),  # node attributes: wgmma by construction
])
def test_implb_range_tells_the_configs_apart(m, plan, expected):
    assert implb_range(m, plan) == expected


@pytest.mark.parametrize("plan, message", [
    ({"m1": 0, "m2": 16, "m3": 8}, "m3 must be >= m2"),
    ({"m1": 0, "m2": 16, "m3": 257}, "m3 must be <= 256"),
    ({"m1": 0, "m2": 100, "m3": 200}, "m2 must be <= 64"),
    ({"m1": 0, "m2": 16, "m3": 64, "wgmma": MMA}, "must use the wgmma loader"),
])
def test_third_range_refusals(plan, message):
    assert message in plan_problem(plan)
    with pytest.raises(FdppError, match=message):
        select_impl(20, plan)


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
    assert (IMPLA_MAX_M, IMPLB_MAX_M, IMPLB_WGMMA_MAX_M) == (8, 64, 256)


@pytest.mark.skipif(not plugin_library_path().exists(),
                    reason=f"plugin library {plugin_library_path()} not built (make lib, or set FDPP_PLUGIN_LIB)")
def test_equals_fdpp_gemm_select_over_a_grid():
    from fdpp_rewrite.gpu import gemm

    checked = refused = 0
    for plan in grid_plans():
        if plan_problem(plan):  # refused by both (the messages are pinned in the tests above and the C ABI's)
            with pytest.raises(FdppError):
                gemm.select(1, c_plan(plan))
            refused += 1
            continue
        for m in MS:
            assert select_impl(m, plan) == gemm.select(m, c_plan(plan)), (m, plan)
            assert implb_range(m, plan) == gemm.select_range(m, c_plan(plan)), (m, plan)
            checked += 1
    assert checked > 40000 and refused > 100


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
    ({"m1": 0, "m2": 16, "m3": 128}, "implb for M 1-16, wgmma for M 17-128, cublaslt for M >= 129"),
    ({"m1": 0, "m2": 300, "implb": WGMMA_CONFIG}, "implb for M 1-256, cublaslt for M >= 257"),
])
def test_describe_plan(plan, text):
    from fdpp_rewrite.dispatch import describe_plan

    assert describe_plan(plan) == text
