"""The portable GEMV / flat GEMM (plugins/kernels/portable/, the source the AMD build compiles) on the H200, through
the checks of the Hopper GEMM tests (tests/plugins/kernels/gemm/test_gemm.py, whose inputs, reference and
tolerance are reused): every M the portable kernels take, odd N and K, every epilogue, both dtypes, the output
poisoned with NaN so an unwritten element fails; a pairwise grid over those axes (tests/helpers/pairwise.py)."""

import sys
from pathlib import Path

import pytest

from pairwise import pairwise_params

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gemm"))
from test_gemm import DTYPES, EPILOGUES, SHAPES, _check, _inputs, _reference  # noqa: E402

pytestmark = pytest.mark.gpu

MS = [1, 2, 3, 4, 5, 8, 9, 13, 16]  # GEMV (<= 4) and flat GEMM with tiles 8 and 16, full and padded


def _run(x, w, bias, residual, epilogue):
    import torch

    from fdpp_rewrite.gpu import portable

    silu = epilogue.startswith("silu_mul")
    n_out = w.shape[0] // 2 if silu else w.shape[0]
    out = torch.full((x.shape[0], n_out), float("nan"), device="cuda", dtype=x.dtype)
    portable.linear(x, w, bias, residual, epilogue="silu_mul" if silu else "none", out=out)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("m,shape,epilogue,dtype", pairwise_params(
    {"m": MS, "shape": SHAPES + [(22016, 4096)], "epilogue": EPILOGUES, "dtype": DTYPES},
    ids={"shape": lambda s: f"{s[0]}x{s[1]}"}))
def test_matches_fp32_reference(m, shape, epilogue, dtype):
    n, k = shape
    x, w, bias, residual = _inputs(m, n, k, dtype, epilogue)
    out = _run(x, w, bias, residual, epilogue)
    ref, peer = _reference(x, w, bias, residual, epilogue.startswith("silu_mul"), dtype)
    _check(out, ref, peer)


def test_odd_n_without_silu_writes_the_last_row():
    x, w, bias, residual = _inputs(3, 41, 64, "float16", "bias")
    out = _run(x, w, bias, residual, "bias")
    ref, peer = _reference(x, w, bias, residual, False, "float16")
    _check(out, ref, peer)


def test_agrees_with_the_hopper_gemv():
    import torch

    from fdpp_rewrite.gpu import gemm

    x, w, _, _ = _inputs(4, 4096, 4096, "float16", "none")
    ours = _run(x, w, None, None, "none").float()
    hopper = gemm.linear(x, w, impl="impla").float()
    assert (ours - hopper).abs().max().item() < 1e-2
    assert torch.isfinite(ours).all()


def test_m_beyond_16_and_bad_inputs_are_refused():
    import torch

    from fdpp_rewrite.gpu import portable

    x, w, _, _ = _inputs(17, 64, 64, "float16", "none")
    with pytest.raises(portable.FdppError, match="1 <= M <= 16"):
        portable.linear(x, w)
    with pytest.raises(portable.FdppError, match="K must be a multiple of 8"):
        portable.linear(torch.randn(2, 12, device="cuda", dtype=torch.float16),
                        torch.randn(8, 12, device="cuda", dtype=torch.float16))
