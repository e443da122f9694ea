"""fdpp::RMSNorm on the GPU against a float64 torch reference of the contract's semantics (normed rounded to the
dtype, then times the weight), fresh random inputs and NaN-poisoned outputs; in place, CUDA-graph capture and bad
input."""

import pytest

from pairwise import pairwise_params
from pdl_chain import assert_pdl_chain_exact

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _norm():
    from fdpp_rewrite.gpu import norm

    return norm


def reference(x, weight, eps):
    x64 = x.double()
    normed = (x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (normed.double() * weight.double()).to(x.dtype)


def tolerance(dtype):
    from fdpp_rewrite.contracts import load_contract

    return load_contract("RMSNorm").tolerance(str(dtype).replace("torch.", ""))


def fresh_inputs(shape, dtype, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    hidden = shape[-1]
    # rows of very different magnitudes: the norm must not depend on the scale
    scale = torch.logspace(-2, 2, shape[0] if len(shape) > 1 else 1, device="cuda").reshape(-1, *[1] * (len(shape) - 1))
    x = (torch.randn(shape, device="cuda", generator=generator) * scale).to(dtype)
    weight = (1 + 0.5 * torch.randn(hidden, device="cuda", generator=generator)).to(dtype)
    return x, weight


@pytest.mark.parametrize("hidden,rows,dtype", pairwise_params(
    {"hidden": [576, 4096, 5120], "rows": [1, 7, 64], "dtype": [torch.float16, torch.bfloat16]}))
def test_matches_float64_reference(hidden, rows, dtype):
    x, weight = fresh_inputs((rows, hidden), dtype, seed=hidden * 100 + rows)
    out = torch.full_like(x, float("nan"))
    y = _norm().rms_norm(x, weight, 1e-5, out=out)
    assert y is out and torch.isfinite(y).all()
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(y.float(), reference(x, weight, 1e-5).float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("shape, dtype", [((2, 3, 16384), torch.float16), ((5, 8), torch.bfloat16),
                                          ((3, 1, 4096), torch.float32), ((4, 16384), torch.float32)])
def test_edges_of_the_supported_range(shape, dtype):
    x, weight = fresh_inputs(shape, dtype, seed=7)
    y = _norm().rms_norm(x, weight, 1e-6)
    assert y.shape == x.shape and y.dtype == dtype
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(y.float(), reference(x, weight, 1e-6).float(), atol=atol, rtol=rtol)


def test_in_place_and_on_a_given_stream():
    x, weight = fresh_inputs((7, 4096), torch.float16, seed=3)
    expected = reference(x, weight, 1e-5)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = _norm().rms_norm(x, weight, 1e-5, out=x, stream=stream)
    torch.cuda.current_stream().wait_stream(stream)
    atol, rtol = tolerance(torch.float16)
    assert y is x
    torch.testing.assert_close(x.float(), expected.float(), atol=atol, rtol=rtol)


def test_cuda_graph_capture_and_replay():
    norm = _norm()
    x, weight = fresh_inputs((8, 5120), torch.bfloat16, seed=11)
    out = torch.empty_like(x)
    norm.rms_norm(x, weight, 1e-5, out=out)  # warm-up outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            norm.rms_norm(x, weight, 1e-5, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    for step in range(3):
        x.copy_(fresh_inputs((8, 5120), torch.bfloat16, seed=100 + step)[0])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, norm.rms_norm(x, weight, 1e-5)), f"replay {step} differs from eager"


@pytest.mark.parametrize("rows", [1, 16])
def test_between_two_pdl_gemms_it_reads_its_input_only_after_the_gemm_and_its_weight_stays_right(rows):
    """GEMM -> RMSNorm -> GEMM, each launched with programmatic dependent launch (on compute capability 9.x): the
    first GEMM lets the norm start at once; the norm loads its weight before its wait but x only after it, and the
    second GEMM reads the norm's output only after the norm is done. The buffers between them are NaN before every
    chain; the result must equal the chain without PDL bit for bit, eagerly and replayed from a CUDA graph."""
    from fdpp_rewrite.gpu import gemm

    norm = _norm()
    hidden = 4096
    x, weight = fresh_inputs((rows, hidden), torch.float16, seed=5)
    w1 = torch.randn(hidden, hidden, device="cuda", dtype=torch.float16) / hidden**0.5
    w2 = torch.randn(3000, hidden, device="cuda", dtype=torch.float16) / hidden**0.5
    h, normed = torch.empty_like(x), torch.empty_like(x)
    out = torch.empty(rows, 3000, device="cuda", dtype=torch.float16)
    plan = {"m1": 0, "m2": 16, "implb": {"n_tile": 16, "k_tile": 1024, "stages": 3, "split_k": 1, "loader": "rows"},
            "implc": "cublaslt"}

    def chain(pdl):
        h.fill_(float("nan"))
        normed.fill_(float("nan"))
        gemm.run(gemm.make_args(x, w1, out=h), plan, pdl=pdl)
        norm.rms_norm(h, weight, 1e-5, out=normed)
        gemm.run(gemm.make_args(normed, w2, out=out), plan, pdl=pdl)

    assert_pdl_chain_exact(chain, out)


def test_bad_inputs_raise_clear_errors():
    from fdpp_rewrite.errors import FdppError

    norm = _norm()
    x, weight = fresh_inputs((4, 576), torch.float16, seed=1)
    with pytest.raises(FdppError, match="hidden size 100 is not supported"):
        norm.rms_norm(torch.zeros(2, 100, device="cuda", dtype=torch.float16),
                      torch.ones(100, device="cuda", dtype=torch.float16), 1e-5)
    with pytest.raises(FdppError, match="contiguous"):
        norm.rms_norm(x.t(), weight[:4], 1e-5)
    with pytest.raises(FdppError, match="weight must be a contiguous \\[576\\] float16"):
        norm.rms_norm(x, weight.float(), 1e-5)
    with pytest.raises(FdppError, match="runs on a CUDA GPU"):
        norm.rms_norm(x.cpu(), weight.cpu(), 1e-5)
    with pytest.raises(FdppError, match="float16, bfloat16 or float32"):
        norm.rms_norm(x.double(), weight.double(), 1e-5)
    with pytest.raises(FdppError, match="eps must be a finite number"):
        norm.rms_norm(x, weight, float("nan"))
    with pytest.raises(FdppError, match="16-byte aligned"):  # the C ABI's own check: a view 2 bytes in
        flat = torch.zeros(577 * 2, device="cuda", dtype=torch.float16)
        norm.rms_norm(flat[1:577], weight, 1e-5)
