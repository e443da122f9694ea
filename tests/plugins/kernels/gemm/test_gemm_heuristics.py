"""The heuristic dataflow's host code (plugins/kernels/gemm/gemm_heuristics.h) through the C ABI, on the CPU: the
worked examples in the header's comments, config validation and the profiler's candidate list."""

import pytest

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.gpu import lib as fdpp_lib

pytestmark = pytest.mark.skipif(not fdpp_lib.library_path().exists(), reason="plugin library not built (make lib)")

H200 = {"num_sms": 132, "cc_major": 9, "max_smem": 232448}
A100 = {"num_sms": 108, "cc_major": 8, "max_smem": 166912}


def gemm():
    from fdpp_rewrite.gpu import gemm as module

    return module


def plan(m1, m2, implc="cublaslt", **implb):
    config = {"n_tile": 16, "k_tile": 256, "stages": 4, "split_k": 1}
    config.update(implb)
    return {"m1": m1, "m2": m2, "implb": config, "implc": implc}


@pytest.mark.parametrize("m, expected",
                         [(1, "impla"), (2, "implb"), (32, "implb"), (33, "cublaslt"), (4096, "cublaslt")])
def test_select_worked_example(m, expected):
    # gemm_heuristics.h: o_proj with m1 = 1, m2 = 32, ImplC = cuBLASLt.
    assert gemm().select(m, plan(1, 32)) == expected


def test_select_without_impla_and_with_cutlass():
    assert gemm().select(1, plan(0, 16, "cutlass")) == "implb"
    assert gemm().select(17, plan(0, 16, "cutlass")) == "cutlass"
    assert gemm().select(5, plan(4, 4)) == "cublaslt"  # ImplB never used when m2 == m1


def test_select_caps_thresholds_at_what_each_implementation_handles():
    # The contract allows any m1/m2; ImplA stops at 8 rows and ImplB at 64.
    assert gemm().select(8, plan(100, 200)) == "impla"
    assert gemm().select(9, plan(100, 200)) == "implb"
    assert gemm().select(65, plan(100, 200)) == "cublaslt"


def test_select_accepts_the_contracts_cublas_spelling():
    assert gemm().select(100, plan(0, 16, "cublas")) == "cublaslt"


@pytest.mark.parametrize("bad, message", [
    (plan(-1, 4), "m1 must be >= 0"),
    (plan(8, 4), "m2 must be >= m1"),
])
def test_bad_plans_are_rejected(bad, message):
    with pytest.raises(FdppError, match=message):
        gemm().select(1, bad)


def test_unknown_implc_is_rejected():
    with pytest.raises(FdppError, match="implc"):
        gemm().select(1, plan(0, 4, "magma"))


@pytest.mark.parametrize("n, k, silu, expected", [
    (12288, 4096, False, {"n_tile": 32, "k_tile": 256, "stages": 3, "split_k": 1}),   # qkv
    (4096, 4096, False, {"n_tile": 16, "k_tile": 512, "stages": 3, "split_k": 2}),    # o
    (22016, 4096, True, {"n_tile": 64, "k_tile": 128, "stages": 3, "split_k": 1}),    # gate_up, silu_mul
    (576, 576, False, {"n_tile": 16, "k_tile": 512, "stages": 3, "split_k": 2}),      # smollm2 o
])
def test_default_plan_worked_examples(n, k, silu, expected):
    p = gemm().default_plan(n, k, "silu_mul" if silu else "none", num_sms=132, cc_major=9)
    assert p["implb"] == expected
    assert (p["m1"], p["m2"], p["implc"]) == (0, 8, "cublaslt")
    gemm().check_implb_config(p["implb"], 8, k, H200["max_smem"], 9)


def test_default_plan_never_splits_k_without_clusters():
    p = gemm().default_plan(4096, 4096, num_sms=108, cc_major=8)
    assert p["implb"]["split_k"] == 1


@pytest.mark.parametrize("config, message", [
    ({"n_tile": 48, "k_tile": 64, "stages": 2, "split_k": 1}, "n_tile"),
    ({"n_tile": 16, "k_tile": 96, "stages": 2, "split_k": 1}, "must be 32, 64, 128 or 256"),
    ({"n_tile": 64, "k_tile": 512, "stages": 2, "split_k": 1}, "must be 32, 64, 128 or 256"),
    ({"n_tile": 16, "k_tile": 256, "stages": 0, "split_k": 1}, "stages"),
    ({"n_tile": 16, "k_tile": 256, "stages": 9, "split_k": 1}, "stages"),
    ({"n_tile": 16, "k_tile": 256, "stages": 2, "split_k": 16}, "split_k"),
    ({"n_tile": 16, "k_tile": 1024, "stages": 8, "split_k": 1}, "2 to 4 stages"),
    ({"n_tile": 32, "k_tile": 1024, "stages": 3, "split_k": 1}, "TMA"),
    ({"n_tile": 16, "k_tile": 1024, "stages": 3, "split_k": 2}, "split_k 1"),
    ({"n_tile": 16, "k_tile": 2048, "stages": 3, "split_k": 1}, "k_tile 1024"),
    ({"n_tile": 16, "k_tile": 512, "stages": 2, "split_k": 8}, "k_tile steps"),
])
def test_invalid_implb_configs_name_the_problem(config, message):
    with pytest.raises(FdppError, match=message):
        gemm().check_implb_config(config, m=1, k=2048, max_smem=H200["max_smem"], cc_major=9)


def test_tma_configs_need_sm90_small_m_and_k_multiple_of_64():
    config = {"n_tile": 16, "k_tile": 1024, "stages": 3, "split_k": 1}
    gemm().check_implb_config(config, m=16, k=4096, max_smem=H200["max_smem"], cc_major=9)
    for kwargs, message in [({"m": 1, "k": 4096, "cc_major": 8}, "9.x"),
                            ({"m": 1, "k": 4096, "cc_major": 10}, "9.x"),
                            ({"m": 17, "k": 4096, "cc_major": 9}, "M <= 16"),
                            ({"m": 1, "k": 4128, "cc_major": 9}, "multiple of 64")]:
        with pytest.raises(FdppError, match=message):
            gemm().check_implb_config(config, max_smem=H200["max_smem"], **kwargs)
    with pytest.raises(FdppError, match="shared memory"):
        gemm().check_implb_config(config, m=1, k=4096, max_smem=64 * 1024, cc_major=9)


def test_split_k_needs_clusters():
    config = {"n_tile": 16, "k_tile": 256, "stages": 2, "split_k": 2}
    gemm().check_implb_config(config, m=1, k=4096, max_smem=H200["max_smem"], cc_major=9)
    for cc_major in (8, 10):  # 10: the library's cluster code is sm_90a; a Blackwell GPU runs the compute_80 PTX
        with pytest.raises(FdppError, match="clusters"):
            gemm().check_implb_config(config, m=1, k=4096, max_smem=A100["max_smem"], cc_major=cc_major)


@pytest.mark.parametrize("n, k", [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008), (960, 576), (576, 1536)])
@pytest.mark.parametrize("device", [H200, A100], ids=["h200", "a100"])
def test_candidates_are_valid_and_within_the_contract(n, k, device):
    configs = gemm().implb_candidates(n, k, 1, device["num_sms"], device["max_smem"], device["cc_major"])
    assert 10 <= len(configs) <= 200
    assert len({tuple(c.values()) for c in configs}) == len(configs)
    for c in configs:
        gemm().check_implb_config(c, 1, k, device["max_smem"], device["cc_major"])
        assert c["n_tile"] in (16, 32, 64) and c["stages"] <= 4 and c["split_k"] <= 8
        assert c["k_tile"] <= 512 or (c["k_tile"] == 1024 and c["n_tile"] == 16 and c["split_k"] == 1)
        assert ("loader" in c) == (c["k_tile"] == 1024)
        if device["cc_major"] < 9:  # no clusters, no TMA; the rows kernel is plain cp.async
            assert c["split_k"] == 1 and (c["k_tile"] <= 512 or c["loader"] in ("rows", "rows1"))
    loaders = {c.get("loader") for c in configs}
    assert {"rows", "rows1"} <= loaders, "the rows configs (both leads) are candidates everywhere"
    assert ("tma" in loaders) == (device["cc_major"] == 9), "the TMA configs are candidates on sm_90 only"
    assert ("pair" in loaders) == (device["cc_major"] == 9), "the cluster-pair configs are candidates on sm_90 only"


def test_pair_candidates_only_up_to_m_16():
    at = {m: {c.get("loader") for c in gemm().implb_candidates(4096, 4096, m, H200["num_sms"], H200["max_smem"], 9)}
          for m in (1, 8, 9, 16, 17)}
    assert all("pair" in at[m] and "rows" in at[m] for m in (1, 8, 9, 16))
    assert "pair" not in at[17] and "rows" not in at[17]


@pytest.mark.parametrize("change, message", [
    ({"stages": 5}, "2 to 4 stages"),
    ({"n_tile": 32}, "n_tile 16, k_tile 1024 and split_k 1"),
    ({"split_k": 2}, "n_tile 16, k_tile 1024 and split_k 1"),
    ({"loader": "bulk"}, "loader must be one of"),
])
@pytest.mark.parametrize("loader", ["rows", "rows1", "pair"])
def test_rows_config_problems(change, message, loader):
    if loader == "pair" and "stages" in change:
        message = "2 or 3 stages"
    elif loader == "pair" and "loader" not in change:
        message = "n_tile 16, k_tile 1024 and split_k 1"

    config = {"n_tile": 16, "k_tile": 1024, "stages": 3, "split_k": 1, "loader": loader, **change}
    with pytest.raises(FdppError, match=message):
        gemm().check_implb_config(config, m=1, k=4096, max_smem=H200["max_smem"], cc_major=9)


def test_rows_config_limits():
    rows = {"n_tile": 16, "k_tile": 1024, "stages": 3, "split_k": 1, "loader": "rows"}
    for m in (1, 9, 16):  # any K that is a multiple of 8 (the problem check's rule), off sm_90 too
        gemm().check_implb_config(rows, m=m, k=1000, max_smem=H200["max_smem"], cc_major=9)
        gemm().check_implb_config(rows, m=m, k=1000, max_smem=A100["max_smem"], cc_major=8)
    with pytest.raises(FdppError, match="M <= 16"):
        gemm().check_implb_config(rows, m=17, k=4096, max_smem=H200["max_smem"], cc_major=9)
    with pytest.raises(FdppError, match="shared memory"):  # two stages of 16 + 16 rows x 2 KB = 128 KB
        gemm().check_implb_config(rows, m=16, k=4096, max_smem=100 * 1024, cc_major=9)
    pair = dict(rows, loader="pair")
    for m in (1, 8, 9, 16):
        gemm().check_implb_config(pair, m=m, k=1000, max_smem=H200["max_smem"], cc_major=9)
    with pytest.raises(FdppError, match="M <= 16"):
        gemm().check_implb_config(pair, m=17, k=4096, max_smem=H200["max_smem"], cc_major=9)
    with pytest.raises(FdppError, match="clusters"):
        gemm().check_implb_config(pair, m=1, k=4096, max_smem=A100["max_smem"], cc_major=8)
    # Without a loader a k_tile 1024 config is the TMA one, as in profiles written before the rows kernel.
    tma = {key: value for key, value in rows.items() if key != "loader"}
    with pytest.raises(FdppError, match="needs K to be a multiple of 64"):
        gemm().check_implb_config(tma, m=1, k=1000, max_smem=H200["max_smem"], cc_major=9)


def test_workspace_only_when_implc_is_reachable():
    g = gemm()
    assert g.workspace_bytes(16, 4096, "float16", plan=plan(1, 16)) == 0
    assert g.workspace_bytes(64, 4096, "float16", plan=plan(1, 200)) == 0
    plain = g.workspace_bytes(17, 4096, "float16", plan=plan(1, 16))
    silu = g.workspace_bytes(256, 22016, "float16", "silu_mul", plan=plan(1, 16))
    assert plain >= 8 << 20
    assert silu >= plain + 256 * 22016 * 2  # the pre-activation buffer for silu_mul


def test_query_functions_reject_bad_codes_and_shapes():
    """The C ABI's pure queries check what they are given, like the run functions do."""
    import ctypes

    library = gemm().library()
    size = ctypes.c_size_t()
    assert library.fdpp_gemm_workspace_bytes(16, 4096, 99, 0, None, ctypes.byref(size)) == 1
    assert b"epilogue must be" in fdpp_lib.load().fdpp_last_error()
    assert library.fdpp_gemm_workspace_bytes(16, 4096, 0, 77, None, ctypes.byref(size)) == 1
    assert b"dtype must be" in fdpp_lib.load().fdpp_last_error()
    with pytest.raises(FdppError, match="multiple of 8"):
        gemm().implb_candidates(4096, 7, 1, H200["num_sms"], H200["max_smem"], H200["cc_major"])
    with pytest.raises(FdppError, match="N must be"):
        gemm().implb_candidates(-5, 4096, 1, H200["num_sms"], H200["max_smem"], H200["cc_major"])


def test_a_1024_column_config_serves_at_most_16_rows():
    """The contract's limits.implb_1024_max_m: a plan that would send M = 17.. to a k_tile 1024 config is refused
    (the launcher runs such a config as given or not at all)."""
    bulk = {"k_tile": 1024, "stages": 3, "loader": "rows"}
    assert gemm().select(16, plan(0, 16, **bulk)) == "implb"
    assert gemm().select(17, plan(0, 16, **bulk)) == "cublaslt"
    assert gemm().select(5, plan(4, 4, **bulk)) == "cublaslt"  # ImplB never reached: any config will do
    for bad in (plan(0, 17, **bulk), plan(1, 64, **bulk), plan(100, 200, **bulk)):
        with pytest.raises(FdppError, match="serves M <= 16"):
            gemm().select(1, bad)


def test_the_kernel_limits_come_from_the_contract():
    from fdpp_rewrite import dispatch
    from fdpp_rewrite.contracts import load_contract

    limits = load_contract("FlatGemm").raw["limits"]
    g = gemm()
    assert (dispatch.IMPLA_MAX_M, dispatch.IMPLB_MAX_M, dispatch.IMPLB_1024_MAX_M, dispatch.IMPLB_WGMMA_MAX_M) == (
        limits["impla_max_m"], limits["implb_max_m"], limits["implb_1024_max_m"], limits["implb_wgmma_max_m"])
    # kImplBWgmmaMaxM (generated from limits.implb_wgmma_max_m): the wgmma range's and a wgmma config's last row
    top = limits["implb_wgmma_max_m"]
    three = {"m1": 0, "m2": 16, "implb": {"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1}, "m3": top,
             "wgmma": {"n_tile": 64, "k_tile": 64, "stages": 8, "split_k": 1, "loader": "wgmma"}}
    assert g.select_range(top, three) == "wgmma" and g.select_range(top + 1, three) == "cublaslt"
    with pytest.raises(FdppError, match=f"m3 must be <= {top}"):
        g.select(1, dict(three, m3=top + 1))
    wide = plan(100, 1000)
    assert g.select(limits["impla_max_m"], wide) == "impla" and g.select(limits["impla_max_m"] + 1, wide) == "implb"
    assert g.select(limits["implb_max_m"], wide) == "implb" and g.select(limits["implb_max_m"] + 1, wide) == "cublaslt"
    pair = {"n_tile": 16, "k_tile": 1024, "stages": 2, "split_k": 1, "loader": "pair"}
    g.check_implb_config(pair, m=limits["implb_1024_max_m"], k=4096, max_smem=H200["max_smem"], cc_major=9)
    with pytest.raises(FdppError, match="M <= 16"):
        g.check_implb_config(pair, m=limits["implb_1024_max_m"] + 1, k=4096, max_smem=H200["max_smem"], cc_major=9)


def test_every_loader_the_contract_allows_serves_exactly_the_1024_limit():
    """Every implb_loader choice of the FlatGemm contract runs M = limits.implb_1024_max_m and refuses one row more
    (the pair loader once took 16 while the contract said 8)."""
    from fdpp_rewrite.contracts import load_contract

    contract = load_contract("FlatGemm")
    limit = contract.raw["limits"]["implb_1024_max_m"]
    for loader in contract.attributes["implb_loader"]["choices"]:
        if loader == "wgmma":  # not a 1024-column pipeline: test_a_wgmma_plan_serves_up_to_256_rows
            continue
        config = {"n_tile": 16, "k_tile": 1024, "stages": 2, "split_k": 1, "loader": loader}
        gemm().check_implb_config(config, m=limit, k=4096, max_smem=H200["max_smem"], cc_major=9)
        with pytest.raises(FdppError, match=f"M <= {limit}"):
            gemm().check_implb_config(config, m=limit + 1, k=4096, max_smem=H200["max_smem"], cc_major=9)


def test_row_blocks_is_the_rule_or_one():
    config = {"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1}
    for row_blocks in (0, 1):
        gemm().check_implb_config({**config, "row_blocks": row_blocks}, 9, 4096, H200["max_smem"], 9)
    with pytest.raises(FdppError, match="row_blocks must be 0"):
        gemm().check_implb_config({**config, "row_blocks": 2}, 9, 4096, H200["max_smem"], 9)
    assert "row_blocks" not in gemm().ImplBConfig.from_dict(config).as_dict()  # the rule: not written to profiles
    assert gemm().ImplBConfig.from_dict({**config, "row_blocks": 1}).as_dict()["row_blocks"] == 1


WGMMA = {"n_tile": 64, "k_tile": 64, "stages": 8, "split_k": 4, "loader": "wgmma"}


def test_a_wgmma_plan_serves_up_to_256_rows():
    """The wgmma loader (kImplBWgmmaMaxM): ImplB up to min(m2, 256); every other config stops at 64."""
    g = gemm()
    wide = {"m1": 0, "m2": 1000, "implb": WGMMA, "implc": "cublaslt"}
    assert [g.select(m, wide) for m in (1, 64, 65, 256, 257)] == ["implb"] * 4 + ["cublaslt"]
    assert g.select(200, dict(wide, m2=128)) == "cublaslt"
    assert g.select(65, plan(0, 1000)) == "cublaslt"
    # No ImplC workspace while ImplB takes every M up to max_m.
    assert g.workspace_bytes(256, 4096, "float16", plan=wide) == 0
    assert g.workspace_bytes(257, 4096, "float16", plan=wide) >= 8 << 20
    assert g.workspace_bytes(65, 4096, "float16", plan=plan(0, 1000)) >= 8 << 20


@pytest.mark.parametrize("change, m, device, message", [
    ({}, 257, H200, "M <= 64 \\(256 with the wgmma loader"),
    ({"n_tile": 16}, 32, H200, "n_tile 64 and k_tile 64"),
    ({"k_tile": 128}, 32, H200, "n_tile 64 and k_tile 64"),
    ({"stages": 1}, 32, H200, "2 to 8 stages"),
    ({"stages": 9}, 32, H200, "2 to 8 stages"),
    ({"split_k": 9}, 32, H200, "split_k must be in 1..8"),
    ({}, 32, A100, "compute capability 9.x"),
    ({}, 32, dict(H200, max_smem=100 * 1024), "shared memory"),
])
def test_wgmma_config_problems(change, m, device, message):
    with pytest.raises(FdppError, match=message):
        gemm().check_implb_config({**WGMMA, **change}, m=m, k=4096, max_smem=device["max_smem"],
                                  cc_major=device["cc_major"])


def test_wgmma_config_limits():
    g = gemm()
    for m in (1, 17, 64, 100, 256):  # any M up to 256, any K that is a multiple of 8, every split up to the steps
        g.check_implb_config(WGMMA, m=m, k=1000, max_smem=H200["max_smem"], cc_major=9)
    g.check_implb_config(dict(WGMMA, split_k=7), m=32, k=448, max_smem=H200["max_smem"], cc_major=9)
    with pytest.raises(FdppError, match="split_k is larger than the number of 64-column steps"):
        g.check_implb_config(dict(WGMMA, split_k=8), m=32, k=448, max_smem=H200["max_smem"], cc_major=9)
    assert gemm().ImplBConfig.from_dict(WGMMA).as_dict() == WGMMA
    with pytest.raises(FdppError, match="loader must be one of"):
        gemm().ImplBConfig.from_dict(dict(WGMMA, loader="hgmma"))


def _loaders(m, device=H200, n=4096, k=4096):
    return [c.get("loader") for c in gemm().implb_candidates(n, k, m, device["num_sms"], device["max_smem"],
                                                             device["cc_major"])]


def test_wgmma_candidates_from_m_17_and_alone_above_64():
    assert "wgmma" not in _loaders(1) and "wgmma" not in _loaders(16)
    at_17, at_64 = _loaders(17), _loaders(64)
    assert "wgmma" in at_17 and None in at_17 and "wgmma" in at_64 and None in at_64
    for m in (65, 128, 256):
        assert set(_loaders(m)) == {"wgmma"}
    assert _loaders(128, A100) == []  # off Hopper nothing runs above 64
    with pytest.raises(FdppError, match="1 <= M <= 256"):
        _loaders(257)


@pytest.mark.parametrize("n, k, splits", [
    (4096, 4096, {4, 8}),  # o: 32 tiles; 4 and 8 splits fill the last wave to 97 %
    (12288, 4096, {4, 5, 6, 8}),  # qkv: 96 tiles
    (4096, 11008, {4, 8}),  # down
])
def test_wgmma_candidates_worked_examples(n, k, splits):
    """gemm_heuristics.h wgmma_candidates: 4 and 8 stages times the splits that fill the last wave to 85 %."""
    configs = gemm().implb_candidates(n, k, 128, H200["num_sms"], H200["max_smem"], 9)
    assert {c["split_k"] for c in configs} == splits
    assert {c["stages"] for c in configs} == {4, 8} and len(configs) == 2 * len(splits)
    for c in configs:
        gemm().check_implb_config(c, m=256, k=k, max_smem=H200["max_smem"], cc_major=9)
