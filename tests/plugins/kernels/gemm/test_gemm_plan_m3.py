"""The plan's third range (gemm_heuristics.h: ImplB on a wgmma config for m2 < M <= m3) through the C ABI, on the
CPU: select_impl and plan_implb_config, plan_problem's refusals (each names what to do), workspace_bytes, the
default plan (no range), and that a plan dict reaches the C struct (C ABI 7) unchanged."""

import pytest

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.gpu import lib as fdpp_lib

pytestmark = pytest.mark.skipif(not fdpp_lib.library_path().exists(), reason="plugin library not built (make lib)")

MMA = {"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1}
WGMMA = {"n_tile": 64, "k_tile": 64, "stages": 8, "split_k": 4, "loader": "wgmma"}


def gemm():
    from fdpp_rewrite.gpu import gemm as module

    return module


def plan3(m1=0, m2=16, m3=128, implb=MMA, wgmma=WGMMA, implc="cublaslt"):
    return {"m1": m1, "m2": m2, "implb": dict(implb), "implc": implc, "m3": m3, "wgmma": dict(wgmma)}


def test_the_abi_version_is_7():
    assert fdpp_lib.load().fdpp_abi_version() == fdpp_lib.EXPECTED_ABI_VERSION == 7


@pytest.mark.parametrize("m, expected", [(1, "implb"), (16, "implb"), (17, "wgmma"), (128, "wgmma"),
                                         (129, "cublaslt"), (4096, "cublaslt")])
def test_the_header_worked_example(m, expected):
    # gemm_heuristics.h: m1 = 0, m2 = 16, m3 = 128.
    assert gemm().select_range(m, plan3()) == expected
    assert gemm().select(m, plan3()) == ("implb" if expected == "wgmma" else expected)


def test_impla_then_both_implb_ranges_then_cutlass():
    p = plan3(m1=4, m2=16, m3=256, implc="cutlass")
    assert [gemm().select_range(m, p) for m in (4, 5, 16, 17, 256, 257)] == [
        "impla", "implb", "implb", "wgmma", "wgmma", "cutlass"]


def test_m3_equal_to_m2_is_no_range_and_reads_no_wgmma_config():
    p = plan3(m2=16, m3=16, wgmma={"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1})  # not read
    assert gemm().select_range(17, p) == "cublaslt"
    no_m3 = {"m1": 0, "m2": 16, "implb": MMA, "implc": "cublaslt"}  # an ABI 6 plan's dict: m3 absent reads as m2
    assert gemm().Plan.from_dict(no_m3).m3 == 16
    assert gemm().select_range(17, no_m3) == "cublaslt"
    assert gemm().Plan.from_dict(dict(no_m3, m3=0)).m3 == 16  # the FlatGemm attribute's 0


def test_a_zeroed_m3_in_the_c_struct_is_no_range():
    # A C caller that zero-initialises ABI 7's new fields keeps ABI 6's plan, as the FlatGemm attribute's 0 does.
    import ctypes

    p = gemm().Plan.from_dict({"m1": 0, "m2": 16, "implb": MMA, "implc": "cublaslt"})
    p.m3, p.wgmma = 0, gemm().ImplBConfig()
    out = ctypes.c_int32()
    for m, expected in ((16, 1), (17, 0)):  # ImplB's first range, then nothing of ImplB's: ImplC
        fdpp_lib.check(gemm().library().fdpp_gemm_select_implb_config(m, ctypes.byref(p), ctypes.byref(out)),
                       "fdpp_gemm_select_implb_config")
        assert out.value == expected


@pytest.mark.parametrize("bad, message", [
    (plan3(m2=16, m3=8), "m3 must be >= m2"),
    (plan3(m2=16, m3=257), "m3 must be <= 256.*set m3 = m2"),
    (plan3(m1=0, m2=100, m3=200), "m2 must be <= 64.*lower m2, or set m3 = m2"),
    (plan3(wgmma=MMA), "must use the wgmma loader.*set its loader, or m3 = m2"),
    (plan3(wgmma=dict(WGMMA, loader="pair", k_tile=1024, n_tile=16)), "must use the wgmma loader"),
])
def test_the_c_abi_refuses_bad_third_ranges_saying_what_to_do(bad, message):
    with pytest.raises(FdppError, match=message):
        gemm().select(1, bad)
    with pytest.raises(FdppError, match=message):
        gemm().select_range(1, bad)
    with pytest.raises(FdppError, match=message):
        gemm().workspace_bytes(16, 4096, "float16", plan=bad)


def test_m2_above_256_without_a_range_is_still_valid():
    # Every plan made before m3 keeps working: m3 = m2 whatever m2 is.
    p = {"m1": 0, "m2": 1000, "implb": MMA, "implc": "cublaslt"}
    assert gemm().select_range(64, p) == "implb" and gemm().select_range(65, p) == "cublaslt"


def test_workspace_counts_the_wgmma_range():
    g = gemm()
    assert g.workspace_bytes(128, 4096, "float16", plan=plan3()) == 0
    assert g.workspace_bytes(129, 4096, "float16", plan=plan3()) >= 8 << 20
    assert g.workspace_bytes(256, 4096, "float16", plan=plan3(m3=256)) == 0
    assert g.workspace_bytes(257, 4096, "float16", plan=plan3(m3=256)) >= 8 << 20
    # m1 = m2 = 16: ImplA to 8, the first ImplB config 9..16 (select_impl caps ImplA), then wgmma: no ImplC.
    assert g.workspace_bytes(64, 4096, "float16", plan=plan3(m1=16, m2=16, m3=64)) == 0


def test_the_default_plan_has_no_wgmma_range():
    p = gemm().default_plan(4096, 4096, num_sms=132, cc_major=9)
    assert "m3" not in p and "wgmma" not in p  # as_dict writes them only for a range
    struct = gemm().Plan()
    gemm()._lib.check(gemm().library().fdpp_gemm_default_plan(4096, 4096, 0, 132, 9, gemm().ctypes.byref(struct)),
                      "fdpp_gemm_default_plan")
    assert struct.m3 == struct.m2 == 8
    assert struct.wgmma.loader == gemm().LOADERS["wgmma"]  # a valid wgmma config, should a caller raise m3


def test_a_plan_dict_reaches_the_c_struct():
    s = gemm().Plan.from_dict(plan3(m1=1, m2=16, m3=200))
    assert (s.m1, s.m2, s.m3, s.implb.n_tile, s.implb.k_tile) == (1, 16, 200, 16, 256)
    assert (s.wgmma.n_tile, s.wgmma.k_tile, s.wgmma.stages, s.wgmma.split_k, s.wgmma.loader) == (64, 64, 8, 4, 4)
    assert s.as_dict() == plan3(m1=1, m2=16, m3=200)
    with pytest.raises(FdppError, match="no wgmma config"):
        gemm().Plan.from_dict({"m1": 0, "m2": 16, "m3": 64, "implb": MMA})
