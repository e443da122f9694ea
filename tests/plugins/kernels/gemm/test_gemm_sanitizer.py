"""compute-sanitizer over small GEMMs of every implementation: memcheck (out-of-bounds and misaligned accesses,
including the tails of N and K), racecheck and synccheck (the shared-memory pipeline, the warps' K-split
reduction and the cluster's distributed-shared-memory split-K reduction, the TMA and wgmma pipelines' mbarriers).

Slow (torch starts under the sanitizer), so marked slow as well as gpu."""

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# Runs in a child process under the sanitizer. ImplC (cuBLASLt) is only in the memcheck run: racecheck of
# cuBLAS's own kernels is slow and not ours to fix.
CASE = r"""
import sys, torch
from fdpp_rewrite.gpu import gemm
with_lt = sys.argv[1] == "1"
torch.manual_seed(0)
cc = gemm.device_info()["cc_major"]


def inputs(m, n, k, ep):
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, device="cuda", dtype=torch.float16)
    n_out = n // 2 if ep == "silu_mul" else n
    return x, w, b, torch.randn(m, n_out, device="cuda", dtype=torch.float16), n_out


for (n, k) in [(200, 264), (88, 520), (9000, 136)]:  # the last: many tiles per persistent CTA
    for m in (1, 3, 9, 17):
        for ep in ("none", "silu_mul"):
            x, w, b, r, n_out = inputs(m, n, k, ep)
            if m <= 8:
                for split in (1, 2, 4) if cc == 9 else (1,):
                    out = torch.empty(m, n_out, device="cuda", dtype=torch.float16)
                    gemm.run_impl(gemm.make_args(x, w, b, r, out, ep), "impla", impla_split_k=split)
            for cfg in ({"n_tile": 16, "k_tile": 128, "stages": 3, "split_k": 2 if cc == 9 else 1},
                        {"n_tile": 64, "k_tile": 64, "stages": 2, "split_k": 1},
                        {"n_tile": 32, "k_tile": 64, "stages": 1, "split_k": (4 if k >= 256 else 2) if cc == 9 else 1}):
                out = torch.empty(m, n_out, device="cuda", dtype=torch.float16)
                gemm.run_impl(gemm.make_args(x, w, b, r, out, ep), "implb", cfg)
            if with_lt:
                for impl in ("cublaslt", "cutlass"):
                    out = torch.empty(m, n_out, device="cuda", dtype=torch.float16)
                    gemm.linear(x, w, b, r, epilogue=ep, impl=impl, out=out)
# ImplB's 1024-column pipelines: TMA (sm_90; rows past N zero-filled by the copy engine), rows (cp.async zero
# fill) and pair (sm_90: clusters, the sums through distributed shared memory), a short last K unit, many blocks per
# CTA; rows and pair also with K a multiple of 8 only.
for (n, k) in [(136, 1088), (4100, 192), (200, 1048)]:
    for m in (1, 7, 9, 16):  # 7: rows copies a zero eighth activation row
        for ep in ("none", "silu_mul"):
            x, w, b, r, n_out = inputs(m, n, k, ep)
            for stages in (2, 3):
                for loader in ("tma", "rows", "rows1", "pair"):
                    if (loader == "tma" and (cc != 9 or k % 64)) or (loader == "pair" and cc != 9):
                        continue
                    out = torch.empty(m, n_out, device="cuda", dtype=torch.float16)
                    cfg = {"n_tile": 16, "k_tile": 1024, "stages": stages, "split_k": 1, "loader": loader}
                    gemm.run_impl(gemm.make_args(x, w, b, r, out, ep), "implb", cfg)
# The pair pipeline at the largest M of each batch tile count (8 and 16 activation rows per stage, two row tiles
# per cluster; at 16 the warps' sums go through their own ring slots), and with K whole 512-column units (an odd
# number of pairs; K = 512: no units for the second half).
if cc == 9:
    for (n, k, m) in [(136, 1088, 8), (4100, 192, 8), (80, 1024, 8), (80, 1024, 1), (80, 512, 3), (136, 1088, 16),
                      (80, 512, 13)]:
        for ep in ("none", "silu_mul"):
            x, w, b, r, n_out = inputs(m, n, k, ep)
            out = torch.empty(m, n_out, device="cuda", dtype=torch.float16)
            cfg = {"n_tile": 16, "k_tile": 1024, "stages": 2, "split_k": 1, "loader": "pair"}
            gemm.run_impl(gemm.make_args(x, w, b, r, out, ep), "implb", cfg)
# The rows pipeline with one reduction buffer (M = 2 at 3 stages) and three blocks per CTA: the barrier that keeps
# the next block's sums off the buffer until warp 0 has read it.
for ep in ("none", "silu_mul"):
    x, w, b, r, n_out = inputs(2, 9608, 136, ep)
    out = torch.empty(2, n_out, device="cuda", dtype=torch.float16)
    cfg = {"n_tile": 16, "k_tile": 1024, "stages": 3, "split_k": 1, "loader": "rows"}
    gemm.run_impl(gemm.make_args(x, w, b, r, out, ep), "implb", cfg)
# The wgmma pipeline (sm_90a): every batch width (M 17 -> 32, 64, 100 -> 128, 256), one and two CTAs per SM (8 and
# 4 stages), split-K over clusters reduced in distributed shared memory, rows past N and columns past K zero-filled.
if cc == 9:
    for (n, k) in [(200, 264), (1000, 1096)]:
        for m in (17, 64, 100, 256):
            for ep in ("none", "silu_mul"):
                x, w, b, r, n_out = inputs(m, n, k, ep)
                for stages, split in ((8, 1), (4, 3)):
                    out = torch.empty(m, n_out, device="cuda", dtype=torch.float16)
                    cfg = {"n_tile": 64, "k_tile": 64, "stages": stages, "split_k": split, "loader": "wgmma"}
                    gemm.run_impl(gemm.make_args(x, w, b, r, out, ep), "implb", cfg)
torch.cuda.synchronize()
print("CASE DONE")
"""


def _sanitizer():
    path = shutil.which("compute-sanitizer")
    if path is None and os.path.exists("/usr/local/cuda/bin/compute-sanitizer"):
        path = "/usr/local/cuda/bin/compute-sanitizer"
    return path


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_sanitizer_clean(tool):
    sanitizer = _sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found")
    with_lt = "1" if tool == "memcheck" else "0"
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", "99", sys.executable, "-c", CASE, with_lt]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert "CASE DONE" in proc.stdout, f"the case did not finish under {tool}:\n{tail}"
    assert proc.returncode == 0, f"{tool} reported errors (exit {proc.returncode}):\n{tail}"
    text = proc.stdout + proc.stderr
    assert "ERROR SUMMARY: 0 errors" in text or "RACECHECK SUMMARY: 0 hazards" in text, tail
