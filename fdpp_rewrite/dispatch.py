"""The FlatGemm dispatch rule in Python: which implementation serves a GEMM of M rows under a plan.

The kernel's owner of this rule is the C++ `select_impl` (plugins/kernels/gemm/gemm_heuristics.h, the C ABI's
`fdpp_gemm_select`), whose limits are generated from the FlatGemm contract (plugins/common/contract_constants.cmake).
This module is its one Python mirror, for the profiler, the CPU reference, the rewriter and gpu/gemm.py; it reads
the same limits from the same contract, and tests/fdpp_rewrite/test_dispatch.py pins the two rules equal over a
grid of M and plans. A plan is anything with `m1`, `m2` and optionally `m3`, `implc` and the ImplB loaders: a profile
entry or an engine's plan ({"implb": {"loader"}, "wgmma": {...}}), a FlatGemm node's attributes ("implb_loader"; the
wgmma range's config is the wgmma loader's by construction), `GemmChoice.attributes()`. An absent m3, or 0 (the
FlatGemm attribute's default), reads as m3 = m2: no wgmma range.

    select_impl(1, {"m1": 1, "m2": 32})                      -> "impla"
    select_impl(9, {"m1": 100, "m2": 200})                   -> "implb"   (ImplA stops at M = 8)
    select_impl(65, {"m1": 0, "m2": 200, "implc": "cutlass"}) -> "cutlass" (ImplB stops at M = 64)
    implb_range(100, {"m1": 0, "m2": 16, "m3": 128})           -> "wgmma"   (ImplB on the plan's wgmma config)
"""

from __future__ import annotations

from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.errors import FdppError

# The most rows each implementation takes, read once from the FlatGemm contract's "limits" (the C++ is generated
# from the same field): ImplA (GEMV) keeps M accumulators per row in registers; ImplB (flat GEMM) puts at most 8
# batch blocks of 8 on the MMA's N side; its k_tile 1024 pipelines hold 2.
_LIMITS = load_contract("FlatGemm").raw["limits"]
IMPLA_MAX_M = int(_LIMITS["impla_max_m"])
IMPLB_MAX_M = int(_LIMITS["implb_max_m"])
IMPLB_1024_MAX_M = int(_LIMITS["implb_1024_max_m"])
# The wgmma loader's rows (its batch on wgmma's N side): the cap of a wgmma ImplB config and of the range up to m3.
IMPLB_WGMMA_MAX_M = int(_LIMITS["implb_wgmma_max_m"])
WGMMA = "wgmma"  # the loader's name (the C ABI's loader 4)
# The implementations, in the order of gemm_heuristics.h's Impl enum (the C ABI codes 1..4; gpu/gemm.py numbers
# them from this tuple).
IMPLS = ("impla", "implb", "cublaslt", "cutlass")
# The plan's implc spellings -> the implementation it names ("cublas" in the contract means cuBLASLt).
IMPLC_NAMES = {"cublaslt": "cublaslt", "cublas": "cublaslt", "cutlass": "cutlass"}


def _loader(config) -> str | None:
    """A config's loader as a word (the C ABI's code 4 is 'wgmma'; gpu/gemm.py maps the others)."""
    loader = (config or {}).get("loader")
    return WGMMA if loader in (WGMMA, 4) else loader


def implb_loader(plan) -> str | None:
    """The loader of the plan's first ImplB config: a plan's implb.loader or a node's implb_loader."""
    return _loader(plan.get("implb")) if "implb" in plan else plan.get("implb_loader")


def wgmma_loader(plan) -> str | None:
    """The loader of the wgmma range's config: a plan's wgmma.loader (absent: the C ABI's default, tma); a node's
    attributes, which hold no such config, fix it to wgmma."""
    return _loader(plan["wgmma"]) or "tma" if "wgmma" in plan else WGMMA


def plan_m3(plan) -> int:
    """m3, with an absent m3 or 0 (the FlatGemm attribute's default) read as m2: no wgmma range."""
    return int(plan.get("m3") or plan["m2"])


def implb_max_m(loader) -> int:
    """The most rows an ImplB config takes (gemm_heuristics.h implb_max_m): 256 for the wgmma loader, else 64."""
    return IMPLB_WGMMA_MAX_M if loader == WGMMA else IMPLB_MAX_M


def plan_problem(plan) -> str | None:
    """Why a plan cannot dispatch, or None (gemm_heuristics.h plan_problem, the 1024-column check aside): thresholds
    ordered, implc known, and a wgmma range (m3 > m2) at most 256 rows high, after an m2 of at most 64, on the
    wgmma loader. Thresholds above what an implementation handles are allowed: select_impl caps them."""
    m1, m2, implc = plan["m1"], plan["m2"], plan.get("implc", "cublaslt")
    if m1 < 0:
        return "m1 must be >= 0"
    if m2 < m1:
        return "m2 must be >= m1"
    if implc not in IMPLC_NAMES:
        return f"implc must be one of {', '.join(IMPLC_NAMES)}, got {implc!r}"
    m3 = plan_m3(plan)
    if m3 < m2:
        return "m3 must be >= m2 (m3 = m2: no wgmma range)"
    if m3 > m2:
        if m3 > IMPLB_WGMMA_MAX_M:
            return (f"m3 must be <= {IMPLB_WGMMA_MAX_M} (the wgmma ImplB's widest batch): lower m3, or set m3 = m2 "
                    "for no wgmma range")
        if m2 > implb_max_m(implb_loader(plan)):
            return (f"with a wgmma range (m3 > m2), m2 must be <= {IMPLB_MAX_M}, the first ImplB config's last row "
                    "(else M 65..m2 fall to ImplC between the ranges): lower m2, or set m3 = m2")
        if wgmma_loader(plan) != WGMMA:
            return ("the ImplB config of the range m2 < M <= m3 must use the wgmma loader (4): set its loader, or "
                    "m3 = m2")
    return None


def implb_range(m: int, plan) -> str:
    """Which range serves M = m rows: 'impla', 'implb' (the plan's implb config), 'wgmma' (its wgmma config),
    'cublaslt' or 'cutlass' (the C ABI's fdpp_gemm_select_implb_config with fdpp_gemm_select).

    ImplA when M <= m1 and M <= 8; else ImplB's implb when M <= m2 and M <= 64 (256 for a wgmma implb); else ImplB's
    wgmma when m2 < M <= m3 and M <= 256; else the plan's ImplC. m1 = 0 means ImplA is never used, m2 = m1 that the
    first ImplB range is empty, m3 = m2 that there is no wgmma range.
    """
    if m < 1:
        raise FdppError(f"FlatGemm: M must be at least 1, got {m}")
    problem = plan_problem(plan)
    if problem:
        raise FdppError(f"FlatGemm plan {dict(plan)!r}: {problem}")
    if m <= plan["m1"] and m <= IMPLA_MAX_M:
        return "impla"
    if m <= plan["m2"] and m <= implb_max_m(implb_loader(plan)):
        return "implb"
    if plan["m2"] < m <= plan_m3(plan) and m <= IMPLB_WGMMA_MAX_M:
        return WGMMA
    return IMPLC_NAMES[plan.get("implc", "cublaslt")]


def select_impl(m: int, plan) -> str:
    """'impla', 'implb', 'cublaslt' or 'cutlass' for M = m rows: implb_range with both ImplB configs as 'implb'.

    Worked example, o_proj [4096, 4096] with m1 = 1, m2 = 32: M = 1 -> impla, M = 2 and M = 32 -> implb,
    M = 33 -> cublaslt. With m1 = 100, m2 = 200: M = 9 -> implb. With m1 = 0, m2 = 16, m3 = 128: M = 17 and
    M = 128 -> implb (the wgmma config), M = 129 -> cublaslt.
    """
    served = implb_range(m, plan)
    return "implb" if served == WGMMA else served


def describe_plan(plan) -> str:
    """The plan as the ranges of M each implementation serves, read off implb_range (past M = 256 nothing changes).
        {"m1": 0, "m2": 8} -> "implb for M 1-8, cublaslt for M >= 9"
        {"m1": 2, "m2": 100, "implc": "cutlass"} -> "impla for M 1-2, implb for M 3-64, cutlass for M >= 65"
        {"m1": 0, "m2": 16, "m3": 128} -> "implb for M 1-16, wgmma for M 17-128, cublaslt for M >= 129"
    """
    ranges = []  # [first M, last M, impl]
    for m in range(1, IMPLB_WGMMA_MAX_M + 2):
        impl = implb_range(m, plan)
        if ranges and ranges[-1][2] == impl:
            ranges[-1][1] = m
        else:
            ranges.append([m, m, impl])
    parts = [f"{impl} for M {lo}-{hi}" if lo != hi else f"{impl} for M = {lo}" for lo, hi, impl in ranges[:-1]]
    return ", ".join(parts + [f"{ranges[-1][2]} for M >= {ranges[-1][0]}"])
