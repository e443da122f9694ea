"""The FlatGemm dispatch rule in Python: which implementation serves a GEMM of M rows under a plan.

The kernel's owner of this rule is the C++ `select_impl` (plugins/kernels/gemm/gemm_heuristics.h, the C ABI's
`fdpp_gemm_select`), whose limits are generated from the FlatGemm contract (plugins/common/contract_constants.cmake).
This module is its one Python mirror, for the profiler, the CPU reference, the rewriter and gpu/gemm.py; it reads
the same limits from the same contract, and tests/fdpp_rewrite/test_dispatch.py pins the two rules equal over a
grid of M and plans. A plan is anything with `m1`, `m2` and optionally `implc` keys: a profile entry, a FlatGemm node's
attributes, `GemmChoice.attributes()`.

    select_impl(1, {"m1": 1, "m2": 32})                      -> "impla"
    select_impl(9, {"m1": 100, "m2": 200})                   -> "implb"   (ImplA stops at M = 8)
    select_impl(65, {"m1": 0, "m2": 200, "implc": "cutlass"}) -> "cutlass" (ImplB stops at M = 64)
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
# The implementations, in the order of gemm_heuristics.h's Impl enum (the C ABI codes 1..4; gpu/gemm.py numbers
# them from this tuple).
IMPLS = ("impla", "implb", "cublaslt", "cutlass")
# The plan's implc spellings -> the implementation it names ("cublas" in the contract means cuBLASLt).
IMPLC_NAMES = {"cublaslt": "cublaslt", "cublas": "cublaslt", "cutlass": "cutlass"}


def plan_problem(plan) -> str | None:
    """Why a plan cannot dispatch, or None (gemm_heuristics.h plan_problem): thresholds ordered, implc known.
    Thresholds above what an implementation handles are allowed: select_impl caps them."""
    m1, m2, implc = plan["m1"], plan["m2"], plan.get("implc", "cublaslt")
    if m1 < 0:
        return "m1 must be >= 0"
    if m2 < m1:
        return "m2 must be >= m1"
    if implc not in IMPLC_NAMES:
        return f"implc must be one of {', '.join(IMPLC_NAMES)}, got {implc!r}"
    return None


def select_impl(m: int, plan) -> str:
    """'impla', 'implb', 'cublaslt' or 'cutlass' for M = m rows.

    ImplA when M <= m1 and M <= 8; else ImplB when M <= m2 and M <= 64; else the plan's ImplC. m1 = 0 means ImplA
    is never used, m2 = m1 that ImplB is never used. Worked example, o_proj [4096, 4096] with m1 = 1, m2 = 32:
    M = 1 -> impla, M = 2 and M = 32 -> implb, M = 33 -> cublaslt. With m1 = 100, m2 = 200: M = 9 -> implb.
    """
    if m < 1:
        raise FdppError(f"FlatGemm: M must be at least 1, got {m}")
    problem = plan_problem(plan)
    if problem:
        raise FdppError(f"FlatGemm plan {dict(plan)!r}: {problem}")
    if m <= plan["m1"] and m <= IMPLA_MAX_M:
        return "impla"
    if m <= plan["m2"] and m <= IMPLB_MAX_M:
        return "implb"
    return IMPLC_NAMES[plan.get("implc", "cublaslt")]


def describe_plan(plan) -> str:
    """The plan as the ranges of M each implementation serves, read off select_impl (past M = 64 nothing changes).
        {"m1": 0, "m2": 8} -> "implb for M 1-8, cublaslt for M >= 9"
        {"m1": 2, "m2": 100, "implc": "cutlass"} -> "impla for M 1-2, implb for M 3-64, cutlass for M >= 65"
    """
    ranges = []  # [first M, last M, impl]
    for m in range(1, IMPLB_MAX_M + 2):
        impl = select_impl(m, plan)
        if ranges and ranges[-1][2] == impl:
            ranges[-1][1] = m
        else:
            ranges.append([m, m, impl])
    parts = [f"{impl} for M {lo}-{hi}" if lo != hi else f"{impl} for M = {lo}" for lo, hi, impl in ranges[:-1]]
    return ", ".join(parts + [f"{ranges[-1][2]} for M >= {ranges[-1][0]}"])
