"""The cuda backend's attention lowering with the last-block combine (the engine's only path for multi-head
attention): one zeroed counters buffer for every layer, grown while tracing a larger shape, never
allocated inside a CUDA-graph capture, and one kernel per attention call where no cluster fits."""

import pytest
from gpu_kernels import kernels_launched

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _attention_layer(backend, name):
    from fdpp_rewrite.contracts import load_contract

    defaults = load_contract("AsyncSoftmaxAttention").defaults()
    attrs = {"scale": 128 ** -0.5, "phi": defaults["phi"], "guard_lo": defaults["guard_lo"],
             "guard_hi": defaults["guard_hi"], "mask_mode": "past_len"}
    return backend.lower("AsyncSoftmaxAttention", attrs, name)


def _decode_inputs(batch, heads, kv_len=8192):
    """One query token per sequence against an MHA cache of kv_len keys (head_dim 128, fp16)."""
    q = torch.randn(batch, heads, 1, 128, device="cuda").half()
    k = torch.randn(batch, heads, kv_len, 128, device="cuda").half()
    v = torch.randn_like(k)
    past = torch.full((batch,), kv_len - 1, dtype=torch.int64, device="cuda")
    return q, k, v, past


def test_cuda_backend_last_block_counters_are_shared_grown_while_tracing_and_never_made_in_a_capture():
    from fdpp_rewrite.engine.backends import CudaBackend
    from fdpp_rewrite.gpu.attention import attention, decode_combines_in_cluster

    backend = CudaBackend({})
    layers = [_attention_layer(backend, f"layer{i}.attention") for i in range(2)]
    buffers = backend.combine_counter_buffers

    small = _decode_inputs(1, 8)  # traced first: the buffer is made for 1 x 8 KV heads
    for layer in layers:
        layer(*small)
    assert [b.numel() for b in buffers] == [8]

    large = _decode_inputs(1, 32)  # B=1, 32 heads, L=8K: a larger shape grows it; both layers share the new one
    outs = [layer(*large) for layer in layers]
    assert [b.numel() for b in buffers] == [8, 32]
    launched = kernels_launched(lambda: layers[1](*large))
    assert len(launched) == 1, launched  # the last-block combine (the H200: 4 splits), or a cluster where one fits
    if not decode_combines_in_cluster(*large):
        expected = attention(*large, decode_combine="kernel")  # the same bits through the combine kernel
        assert all(torch.equal(out, expected) for out in outs)

    # A shape the backend first sees inside a capture (its plan's device queries ran before, as a trace would run
    # them): nothing is allocated there, and the call keeps its plan without the counters.
    unseen = _decode_inputs(2, 32)
    expected = attention(*unseen)
    out = torch.empty_like(unseen[0])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out.copy_(layers[0](*unseen))
    torch.cuda.current_stream().wait_stream(stream)
    assert [b.numel() for b in buffers] == [8, 32]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    assert not any(b.any().item() for b in buffers), "a call left the engine's combine counters non-zero"


def test_cuda_backend_keeps_the_combine_kernel_for_grouped_query_attention():
    from fdpp_rewrite.engine.backends import CudaBackend
    from fdpp_rewrite.gpu.attention import attention, decode_combines_in_cluster

    backend = CudaBackend({})  # the last-block combine is for multi-head attention only
    layer = _attention_layer(backend, "layer0.attention")
    q = torch.randn(1, 32, 1, 128, device="cuda").half()
    k = torch.randn(1, 8, 32768, 128, device="cuda").half()  # GQA 32/8 at 32K: 16 splits, no cluster
    v = torch.randn_like(k)
    past = torch.full((1,), 32767, dtype=torch.int64, device="cuda")
    assert not decode_combines_in_cluster(q, k, v, past)
    launched = kernels_launched(lambda: layer(q, k, v, past))
    assert len(launched) == 2, launched  # the split kernel, then the combine kernel
    assert backend.combine_counter_buffers == []
    assert torch.equal(layer(q, k, v, past), attention(q, k, v, past, decode_combine="kernel"))


@pytest.mark.parametrize("softcap, window", [(1.0, 0), (0.0, 100), (2.0, 700)])
def test_cuda_backend_passes_the_nodes_softcap_and_window_to_the_kernels(softcap, window):
    # The cuda lowering must hand the node's soft cap and sliding window to the kernels: the CPU backend (the
    # reference ops) applies them, so the two agree only if the cuda path does too. Scores of order 4 make the
    # cap bite (tanh(s) is far from s) and 1K keys make the window hide most of them.
    from fdpp_rewrite.engine.backends import CpuBackend, CudaBackend

    defaults = {"phi": 0.0, "guard_lo": -1000.0, "guard_hi": 1000.0}
    attrs = {"scale": 0.5, "mask_mode": "past_len", "softcap": softcap, "window": window, **defaults}
    torch.manual_seed(0)
    q = torch.randn(2, 4, 3, 64, device="cuda").half()
    k = torch.randn(2, 4, 1024, 64, device="cuda").half()
    v = torch.randn_like(k)
    past = torch.tensor([1000, 400], dtype=torch.int64, device="cuda")
    cuda_out = CudaBackend({}).lower("AsyncSoftmaxAttention", attrs, "layer0.attention")(q, k, v, past)
    cpu = CpuBackend({}).lower("AsyncSoftmaxAttention", attrs, "layer0.attention")
    cpu_out = cpu(q.cpu(), k.cpu(), v.cpu(), past.cpu())
    torch.testing.assert_close(cuda_out.float().cpu(), cpu_out.float(), atol=2e-3, rtol=2e-3)
    plain = CudaBackend({}).lower("AsyncSoftmaxAttention", dict(attrs, softcap=0.0, window=0), "layer0.attention")
    assert (plain(q, k, v, past) - cuda_out).abs().max() > 0.05  # the options change the answer
