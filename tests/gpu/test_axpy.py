"""The trivial kernel through the C ABI on a real GPU: proves build -> C ABI -> Python end to end."""

import pytest

pytestmark = pytest.mark.gpu


def test_axpy_matches_torch():
    import torch

    from fdpp_rewrite.gpu import lib as fdpp_lib

    x = torch.randn(1_000_003, device="cuda")
    y = torch.randn_like(x)
    expected = 2.5 * x + y
    status = fdpp_lib.load().fdpp_axpy_f32(2.5, x.data_ptr(), y.data_ptr(), x.numel(), fdpp_lib.stream_handle())
    fdpp_lib.check(status, "fdpp_axpy_f32")
    torch.cuda.synchronize()
    torch.testing.assert_close(y, expected)
