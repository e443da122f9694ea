"""The comparison backends (ablations.py) on the CPU: TorchKernels replaces only the GEMM and the attention, every
ablation names what it switches and refuses a backend other than cuda in one line. Their GPU runs:
test_engine_gpu.py."""

import pytest
import torch

from fdpp_rewrite.engine import ablations
from fdpp_rewrite.engine.backends import CpuBackend
from fdpp_rewrite.errors import FdppError


def test_torch_kernels_replace_the_gemm_and_attention_and_keep_the_rest():
    inner = CpuBackend()
    wrapped = ablations.TorchKernels(inner)
    assert (wrapped.name, wrapped.device) == ("cpu", inner.device)
    attrs = {"epilogue": "residual", "has_bias": 0}
    x, weight, residual = torch.randn(2, 3, 8), torch.randn(5, 8), torch.randn(2, 3, 5)
    expected = inner.lower("FlatGemm", attrs, "g")(x, weight, residual)
    assert torch.allclose(wrapped.lower("FlatGemm", attrs, "g")(x, weight, residual), expected, atol=1e-5)
    norm = wrapped.lower("RMSNorm", {"epsilon": 1e-6}, "n")
    assert torch.equal(norm(x, torch.ones(8)), inner.lower("RMSNorm", {"epsilon": 1e-6}, "n")(x, torch.ones(8)))
    with pytest.raises(FdppError, match="mask_mode past_len"):
        wrapped.lower("AsyncSoftmaxAttention", {"mask_mode": "bias", "scale": 1.0}, "a")


def test_silu_mul_epilogue_in_torch_ops():
    y = torch.randn(4, 6)
    gate, up = y[:, :3], y[:, 3:]
    assert torch.allclose(ablations.torch_epilogue(y, "silu_mul", None), torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("name", list(ablations.ABLATIONS))
def test_each_ablation_describes_itself_and_needs_cuda(name):
    ablation = ablations.ABLATIONS[name]
    assert issubclass(ablation, ablations.Ablation) and ablation.description
    with pytest.raises(FdppError, match="--ablate needs the cuda backend") as error:
        ablation(CpuBackend())
    assert "\n" not in str(error.value)


def test_the_cublaslt_ablation_sends_every_m_to_implc_even_with_a_wgmma_range():
    from types import SimpleNamespace

    from fdpp_rewrite.dispatch import select_impl

    plan = {"m1": 0, "m2": 16, "implb": {"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1},
            "implc": "cublaslt", "m3": 128, "wgmma": {"n_tile": 64, "k_tile": 64, "stages": 4, "split_k": 2,
                                                      "loader": "wgmma"}}
    given = []
    inner = SimpleNamespace(name="cuda", device="cuda", gemm_plan=lambda name: plan,
                            flat_gemm=lambda attrs, name, p: given.append(p))
    ablations.CublasLtGemm(inner).replace("FlatGemm", {}, "g")
    assert all(select_impl(m, given[0]) == "cublaslt" for m in (1, 16, 17, 128, 256))


def test_sdpa_baseline_applies_the_window_and_refuses_a_soft_cap():
    # The torch peer must run the same model: a sliding window is part of its mask, a soft cap it cannot express
    # is refused in one line instead of timing another model.
    import numpy as np

    from fdpp_rewrite.engine.ablations import sdpa_attention
    from fdpp_rewrite.ref_ops import async_softmax_attention

    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 40, 16)
    v = torch.randn_like(k)
    past = torch.tensor([30, 12])
    attrs = {"scale": 0.25, "mask_mode": "past_len", "window": 5}
    out = sdpa_attention(attrs)(q, k, v, past)
    expected = async_softmax_attention(q.numpy(), k.numpy(), v.numpy(), past.numpy(), scale=0.25, phi=0.0,
                                       guard_lo=-1e3, guard_hi=1e3, mask_mode="past_len", window=5,
                                       softmax="synchronized")
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-5)
    with pytest.raises(FdppError, match="no logit soft-capping.*softcap 50"):
        sdpa_attention(dict(attrs, softcap=50.0))
