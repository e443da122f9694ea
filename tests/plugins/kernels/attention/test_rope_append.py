"""fdpp::RopeAppend on the GPU (gpu.attention.rope_append with rope_dim and inv_freq) against the CPU reference
(fdpp_rewrite.ref_ops.rope_append): full, partial and zero rotary, both pairings, the model's table or the theta
formula; untouched cache rows stay bit-exact; CUDA-graph capture; bad input."""

import numpy as np
import pytest

from pairwise import pairwise_params

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _att():
    from fdpp_rewrite.gpu import attention

    return attention


def tolerance(dtype):
    from fdpp_rewrite.contracts import load_contract

    return load_contract("RopeAppend").tolerance(str(dtype).replace("torch.", ""))


def make_inputs(batch, heads, kv_heads, seq, dim, cap, dtype, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, device="cuda", generator=generator).to(dtype)  # noqa: E731
    return (randn(batch, heads, seq, dim), randn(batch, kv_heads, seq, dim), randn(batch, kv_heads, seq, dim),
            randn(batch, kv_heads, cap, dim), randn(batch, kv_heads, cap, dim))


def cpu_reference(q, k_new, v_new, k_cache, v_cache, past, inv_freq, rope_dim, interleaved):
    from fdpp_rewrite.ref_ops import rope_append

    as_np = lambda t: t.float().cpu().numpy()  # noqa: E731
    outs = rope_append(as_np(q), as_np(k_new), as_np(v_new), as_np(k_cache), as_np(v_cache), past.cpu().numpy(),
                       inv_freq, rope_dim=rope_dim, interleaved=interleaved)
    return [torch.from_numpy(o).cuda() for o in outs]


@pytest.mark.parametrize("rope,interleaved,dtype,table", pairwise_params(
    {"rope": [(64, 1.0), (128, 1.0), (128, 0.5), (64, 0.25), (64, 0.0), (128, 0.0)], "interleaved": [0, 1],
     "dtype": [torch.float16, torch.bfloat16], "table": ["model", "theta"]},
    ids={"rope": lambda r: "d{}-rope{}".format(*r)}))
def test_matches_cpu_reference(rope, interleaved, dtype, table):
    att = _att()
    dim, rope_fraction = rope
    rope_dim = int(dim * rope_fraction)
    batch, heads, kv_heads, seq, cap, theta = 3, 8, 2, 4, 40, 10000.0
    q, k_new, v_new, k_cache, v_cache = make_inputs(batch, heads, kv_heads, seq, dim, cap, dtype,
                                                     seed=dim + rope_dim + 7 * interleaved)
    past = torch.tensor([0, 17, 38], dtype=torch.int64, device="cuda")  # tokens 40, 41 of sequence 2 overflow
    inv_np = (1.0 / theta ** (np.arange(0, rope_dim, 2, dtype=np.float64) / max(rope_dim, 1))).astype(np.float32)
    if table == "model":  # a scaled table (e.g. linear rope scaling by 2): must be used as given
        inv_np = inv_np / 2
    inv_freq = torch.from_numpy(inv_np).cuda() if table == "model" else None
    want_q, want_k, want_v = cpu_reference(q, k_new, v_new, k_cache, v_cache, past, inv_np, rope_dim, interleaved)
    q_out = torch.full_like(q, float("nan"))  # pass-through channels must be copied, not left behind
    counters = att.Counters()
    got = att.rope_append(q, k_new, v_new, k_cache, v_cache, past, rope_theta=theta, interleaved=bool(interleaved),
                          q_out=q_out, counters=counters, rope_dim=rope_dim, inv_freq=inv_freq)
    assert got is q_out
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(q_out.float(), want_q, atol=atol, rtol=rtol)
    torch.testing.assert_close(k_cache.float(), want_k, atol=atol, rtol=rtol)
    assert torch.equal(v_cache.float(), want_v)  # values (and every row not written) bit-exact
    written = torch.zeros(batch, cap, dtype=torch.bool)
    for b in range(batch):
        written[b, int(past[b]):int(past[b]) + seq] = True
    for b in range(batch):  # rows the op did not write keep their exact bits (the reference copied them)
        rows = ~written[b]
        assert torch.equal(k_cache[b][:, rows.cuda()].float(), want_k[b][:, rows.cuda()])
    if rope_dim == 0:
        assert torch.equal(q_out, q) and torch.equal(k_cache.float(), want_k)
    assert counters.clamped_rows == 2 * kv_heads


def test_partial_rotary_in_place_keeps_pass_through_channels():
    att = _att()
    q, k_new, v_new, k_cache, v_cache = make_inputs(2, 4, 4, 1, 128, 16, torch.float16, seed=5)
    original = q.clone()
    past = torch.tensor([3, 9], dtype=torch.int64, device="cuda")
    att.rope_append(q, k_new, v_new, k_cache, v_cache, past, interleaved=True, rope_dim=64)
    assert torch.equal(q[..., 64:], original[..., 64:])
    assert not torch.equal(q[..., :64], original[..., :64])


def test_cuda_graph_capture_and_replay():
    att = _att()
    dim, rope_dim = 128, 64
    q, k_new, v_new, k_cache, v_cache = make_inputs(2, 8, 2, 1, dim, 64, torch.bfloat16, seed=9)
    past = torch.tensor([5, 40], dtype=torch.int64, device="cuda")
    inv_freq = (1.0 / 10000 ** (torch.arange(0, rope_dim, 2, device="cuda").float() / rope_dim)) * 0.5
    q_out = torch.empty_like(q)
    att.rope_append(q, k_new, v_new, k_cache, v_cache, past, interleaved=True, q_out=q_out, rope_dim=rope_dim,
                    inv_freq=inv_freq)  # warm-up
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            att.rope_append(q, k_new, v_new, k_cache, v_cache, past, interleaved=True, q_out=q_out,
                            rope_dim=rope_dim, inv_freq=inv_freq)
    torch.cuda.current_stream().wait_stream(stream)
    for step in range(3):
        fresh = make_inputs(2, 8, 2, 1, dim, 64, torch.bfloat16, seed=50 + step)
        q.copy_(fresh[0])
        k_new.copy_(fresh[1])
        v_new.copy_(fresh[2])
        past += 1
        kc, vc = k_cache.clone(), v_cache.clone()
        graph.replay()
        torch.cuda.synchronize()
        expected_q = att.rope_append(q, k_new, v_new, kc, vc, past, interleaved=True, q_out=torch.empty_like(q),
                                     rope_dim=rope_dim, inv_freq=inv_freq)
        assert torch.equal(q_out, expected_q), f"replay {step}: rotated q differs"
        assert torch.equal(k_cache, kc) and torch.equal(v_cache, vc), f"replay {step}: caches differ"


def test_bad_inputs_raise_clear_errors():
    from fdpp_rewrite.errors import FdppError

    att = _att()
    q, k_new, v_new, k_cache, v_cache = make_inputs(1, 4, 4, 1, 64, 16, torch.float16, seed=1)
    past = torch.tensor([2], dtype=torch.int64, device="cuda")
    with pytest.raises(FdppError, match="rope_dim 3 must be even"):
        att.rope_append(q, k_new, v_new, k_cache, v_cache, past, rope_dim=3)
    with pytest.raises(FdppError, match="rope_dim 66 must be even and in \\[0, head_dim 64\\]"):
        att.rope_append(q, k_new, v_new, k_cache, v_cache, past, rope_dim=66)
    with pytest.raises(FdppError, match="inv_freq must be a contiguous float32 \\[16\\]"):
        att.rope_append(q, k_new, v_new, k_cache, v_cache, past, rope_dim=32,
                        inv_freq=torch.ones(8, device="cuda"))
