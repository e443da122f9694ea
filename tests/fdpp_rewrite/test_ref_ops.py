"""The CPU reference of the fdpp ops (fdpp_rewrite.ref_ops) against plain numpy, and running fdpp nodes in
onnxruntime through make_reference_session."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from fdpp_rewrite import ref_ops, ref_session
from fdpp_rewrite.contracts import load_contract
from fdpp_rewrite.errors import FdppError

ATOL32, RTOL32 = load_contract("AsyncSoftmaxAttention").tolerance("float32")


def plain_attention(q, k, v, visible, scale, bias=None, softcap=0.0):
    """Textbook softmax attention in float64: the truth to compare with (softcap > 0: cap * tanh(s / cap))."""
    groups = q.shape[1] // k.shape[1]
    k = np.repeat(k.astype(np.float64), groups, axis=1)
    v = np.repeat(v.astype(np.float64), groups, axis=1)
    s = scale * q.astype(np.float64) @ np.swapaxes(k, -1, -2)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    s = np.where(visible, s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    p = np.where(visible, np.exp(s - row_max), 0.0)
    den = p.sum(axis=-1, keepdims=True)
    return np.divide(p @ v, den, out=np.zeros(q.shape), where=den > 0)


def causal(past_len, seq, kv_len):
    past_len = np.asarray(past_len)
    return (np.arange(kv_len)[None, None, :] <= (past_len[:, None] + np.arange(seq))[:, :, None])[:, None]


def windowed(past_len, seq, kv_len, window):
    """Causal with a sliding window, written out: key j visible to query i iff j <= p + i and p + i - j < window."""
    visible = np.zeros((len(past_len), 1, seq, kv_len), bool)
    for b, past in enumerate(past_len):
        for i in range(seq):
            for j in range(kv_len):
                visible[b, 0, i, j] = j <= past + i and past + i - j < window
    return visible


def random_qkv(rng, batch, heads, kv_heads, seq, kv_len, dim, spread=1.0):
    q = (spread * rng.standard_normal((batch, heads, seq, dim))).astype(np.float32)
    k = rng.standard_normal((batch, kv_heads, kv_len, dim)).astype(np.float32)
    v = rng.standard_normal((batch, kv_heads, kv_len, dim)).astype(np.float32)
    return q, k, v


def attention(q, k, v, mask_input, mode, scale, phi=0.0, lo=-60.0, hi=10.0, counters=None, tile=64, **extra):
    counters = counters or ref_ops.OpCounters()
    out = ref_ops.async_softmax_attention(q, k, v, mask_input, scale=scale, phi=phi, guard_lo=lo, guard_hi=hi,
                                          mask_mode=mode, tile=tile, counters=counters, **extra)
    return out, counters


# batch 3, 9 query heads over 3 KV heads, kv_len 1 and 97 (not multiples of the 64-key tile), seq 1 and 5
@pytest.mark.parametrize("batch, heads, kv_heads, seq, kv_len, dim", [
    (1, 1, 1, 1, 1, 8), (3, 9, 3, 1, 97, 16), (2, 4, 4, 5, 97, 8), (3, 9, 1, 3, 130, 32), (2, 6, 2, 4, 64, 64),
])
def test_unified_max_equals_plain_softmax(batch, heads, kv_heads, seq, kv_len, dim):
    rng = np.random.default_rng(batch * 100 + kv_len)
    q, k, v = random_qkv(rng, batch, heads, kv_heads, seq, kv_len, dim)
    past_len = rng.integers(0, kv_len - seq + 1, batch)
    scale = 1.0 / np.sqrt(dim)
    out, counters = attention(q, k, v, past_len, "past_len", scale)
    expected = plain_attention(q, k, v, causal(past_len, seq, kv_len), scale)
    np.testing.assert_allclose(out, expected, atol=ATOL32, rtol=RTOL32)
    assert counters.fallback_rows == 0 and counters.attention_rows == batch * heads * seq  # all in range


def test_adversarial_scores_take_the_exact_fallback():
    """Scores of +-1e4 would overflow e^(s - phi); the guard sends those rows to the online-max path."""
    rng = np.random.default_rng(1)
    q, k, v = random_qkv(rng, 2, 4, 2, 3, 97, 16)
    q[0, 1, 2] *= 3000.0  # one row with scores of order +-1e4
    q[1] *= -5000.0       # a whole sequence far below phi
    scale = 0.25
    out, counters = attention(q, k, v, np.array([90, 40]), "past_len", scale)
    expected = plain_attention(q, k, v, causal([90, 40], 3, 97), scale)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, expected, atol=ATOL32, rtol=RTOL32)
    assert counters.fallback_rows == 1 + 4 * 3  # the one row, and every row of sequence 1
    # without the guard (an infinite window) the same inputs break the fixed-max softmax
    with np.errstate(over="ignore", invalid="ignore"):
        unguarded = ref_ops._unified_max(np.array([[1e4, 0.0]], np.float32), np.ones((1, 2), bool),
                                         np.ones((1, 2, 1), np.float32), 0.0, 64)
    assert not np.isfinite(unguarded[0]).all()


def test_row_mixing_in_range_and_out_of_range_tiles():
    """Only one tile of the row sees a score beyond guard_hi: the whole row must be recomputed."""
    rng = np.random.default_rng(2)
    q, k, v = random_qkv(rng, 1, 2, 1, 1, 200, 8)
    k[0, 0, 150] = 40.0 * q[0, 0, 0] / np.linalg.norm(q[0, 0, 0]) ** 2  # q.k = 40 in the third tile only
    out, counters = attention(q, k, v, np.array([199]), "past_len", 1.0, hi=10.0)
    expected = plain_attention(q, k, v, causal([199], 1, 200), 1.0)
    np.testing.assert_allclose(out, expected, atol=ATOL32, rtol=RTOL32)
    assert counters.fallback_rows == 1  # head 0 only; head 1 has no outlier
    assert np.abs(out[0, 0, 0] - v[0, 0, 150]).max() < 1e-3  # the outlier dominates, as it should


def test_fallback_is_the_same_math_as_the_fast_path():
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, 2, 4, 2, 2, 97, 8)
    fast, c1 = attention(q, k, v, np.array([95, 30]), "past_len", 0.3, lo=-80.0, hi=60.0)
    forced, c2 = attention(q, k, v, np.array([95, 30]), "past_len", 0.3, phi=-1000.0)  # every row out of range
    assert c1.fallback_rows == 0 and c2.fallback_rows == 2 * 4 * 2
    np.testing.assert_allclose(fast, forced, atol=ATOL32, rtol=RTOL32)


def test_masked_positions_never_trip_the_guard_and_full_masks_give_zero():
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(rng, 2, 2, 1, 3, 10, 8)
    k[:, :, 7:] = 1e4  # huge keys, but masked for every query below
    bias = np.zeros((2, 1, 3, 10), np.float32)
    bias[:, :, :, 7:] = -np.inf
    bias[1, 0, 1, :] = np.finfo(np.float16).min  # a fully masked row (Hugging Face's min value counts as masked)
    out, counters = attention(q, k, v, bias, "bias", 0.5)
    assert counters.fallback_rows == 0
    assert np.isfinite(out).all() and (out[1, :, 1] == 0).all()
    visible = bias > load_contract("AsyncSoftmaxAttention").raw["bias_mask_threshold"]
    expected = plain_attention(q, k, v, visible, 0.5, np.where(visible, bias, 0.0))
    np.testing.assert_allclose(out, expected, atol=ATOL32, rtol=RTOL32)


@pytest.mark.parametrize("dim", [80, 96, 256])
def test_softcap_matches_plain_softmax_of_capped_scores(dim):
    """Gemma 2's cap: scores of order +-1e3 become cap * tanh(s / cap), within +-cap; with phi = 0 and the guard
    the notes give for a cap (guard_lo = -2 cap, guard_hi = cap) no row falls back, and the output is the plain
    softmax of the capped scores (not of the raw ones)."""
    rng = np.random.default_rng(dim)
    q, k, v = random_qkv(rng, 2, 4, 2, 3, 97, dim, spread=40.0)
    past_len = np.array([94, 50])
    cap, scale = 30.0, dim ** -0.5
    out, counters = attention(q, k, v, past_len, "past_len", scale, phi=0.0, lo=-2 * cap, hi=cap, softcap=cap)
    expected = plain_attention(q, k, v, causal(past_len, 3, 97), scale, softcap=cap)
    np.testing.assert_allclose(out, expected, atol=ATOL32, rtol=RTOL32)
    assert counters.fallback_rows == 0 and np.isfinite(out).all()
    uncapped = plain_attention(q, k, v, causal(past_len, 3, 97), scale)
    assert np.abs(uncapped - expected).max() > 0.1  # the cap changes the result: the test would see it missing


def test_window_matches_plain_softmax_over_the_window():
    """A sliding window of 7 keys (Mistral / Gemma local layers) with prompts of 5 tokens over caches of 0 to 40
    tokens: each query sees keys (p + i) - 6 .. p + i only; a window wider than the cache is plain causal."""
    rng = np.random.default_rng(5)
    q, k, v = random_qkv(rng, 3, 4, 2, 5, 45, 16)
    past_len = np.array([40, 0, 17])
    out, counters = attention(q, k, v, past_len, "past_len", 0.25, window=7)
    expected = plain_attention(q, k, v, windowed(past_len, 5, 45, 7), 0.25)
    np.testing.assert_allclose(out, expected, atol=ATOL32, rtol=RTOL32)
    assert counters.fallback_rows == 0
    causal_out, _ = attention(q, k, v, past_len, "past_len", 0.25)
    wide, _ = attention(q, k, v, past_len, "past_len", 0.25, window=1000)
    np.testing.assert_array_equal(wide, causal_out)
    assert np.abs(causal_out - out).max() > 0.05


def test_softcap_and_window_together_on_adversarial_scores():
    """Scores of +-1e4 capped at 50 inside a window of 64 over 200 keys, with the fallback forced for half the rows
    (phi far off): finite everywhere, and fast and exact rows agree with the plain softmax."""
    rng = np.random.default_rng(6)
    q, k, v = random_qkv(rng, 2, 2, 1, 4, 200, 16, spread=2500.0)
    past_len = np.array([196, 120])
    visible = windowed(past_len, 4, 200, 64)
    expected = plain_attention(q, k, v, visible, 0.25, softcap=50.0)
    for phi, fallbacks in ((0.0, 0), (-1000.0, 2 * 2 * 4)):
        out, counters = attention(q, k, v, past_len, "past_len", 0.25, phi=phi, lo=-80.0, hi=60.0, softcap=50.0,
                                  window=64)
        assert np.isfinite(out).all() and counters.fallback_rows == fallbacks
        np.testing.assert_allclose(out, expected, atol=ATOL32, rtol=RTOL32)


@pytest.mark.parametrize("extra, message", [
    ({"window": 8, "mode": "bias"}, "window 8 needs mask_mode 'past_len'"),
    ({"window": -1}, "must be >= 0"),
    ({"softcap": -2.0}, "must be >= 0"),
])
def test_softcap_and_window_errors(extra, message):
    rng = np.random.default_rng(7)
    q, k, v = random_qkv(rng, 1, 2, 1, 2, 10, 8)
    mode = extra.pop("mode", "past_len")
    mask = np.zeros((1, 1, 2, 10), np.float32) if mode == "bias" else np.array([8])
    with pytest.raises(FdppError, match=message):
        attention(q, k, v, mask, mode, 0.5, **extra)


def test_bias_values_are_added_and_broadcast():
    rng = np.random.default_rng(5)
    q, k, v = random_qkv(rng, 3, 4, 2, 2, 17, 8)
    bias = rng.standard_normal((1, 1, 2, 17)).astype(np.float32)  # broadcast over the batch
    out, _ = attention(q, k, v, bias, "bias", 0.4)
    expected = plain_attention(q, k, v, np.ones((3, 1, 2, 17), bool), 0.4, bias)
    np.testing.assert_allclose(out, expected, atol=ATOL32, rtol=RTOL32)
    none, _ = attention(q, k, v, None, "none", 0.4)
    np.testing.assert_allclose(none, plain_attention(q, k, v, np.ones((3, 1, 2, 17), bool), 0.4),
                               atol=ATOL32, rtol=RTOL32)


def test_float16_inputs_give_float16_output():
    rng = np.random.default_rng(6)
    q, k, v = (t.astype(np.float16) for t in random_qkv(rng, 2, 4, 2, 1, 33, 16))
    out, _ = attention(q, k, v, np.array([32, 3]), "past_len", 0.25)
    atol, rtol = load_contract("AsyncSoftmaxAttention").tolerance("float16")
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), plain_attention(q, k, v, causal([32, 3], 1, 33), 0.25),
                               atol=atol, rtol=rtol)


def test_attention_shape_errors():
    q, k, v = random_qkv(np.random.default_rng(0), 1, 4, 3, 1, 5, 8)
    with pytest.raises(FdppError, match="multiple of Hkv"):
        attention(q, k, v, np.array([3]), "past_len", 1.0)
    q, k, v = random_qkv(np.random.default_rng(0), 1, 4, 2, 1, 5, 8)
    with pytest.raises(FdppError, match="num_heads=8"):
        ref_ops.async_softmax_attention(q, k, v, np.array([3]), scale=1.0, phi=0.0, guard_lo=-1.0, guard_hi=1.0,
                                        mask_mode="past_len", num_heads=8)


# --- FlatGemm ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("epilogue", ["none", "silu_mul", "residual"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_flat_gemm_epilogues(epilogue, with_bias):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 5, 24)).astype(np.float32)
    w = rng.standard_normal((14, 24)).astype(np.float32)
    b = rng.standard_normal(14).astype(np.float32) if with_bias else None
    r = rng.standard_normal((3, 5, 14)).astype(np.float32)
    counters = ref_ops.OpCounters()
    y = ref_ops.flat_gemm(x, w, b, r if epilogue == "residual" else None, epilogue=epilogue, m1=1, m2=16,
                          counters=counters)
    full = x.astype(np.float64) @ w.T.astype(np.float64) + (b if with_bias else 0.0)
    if epilogue == "silu_mul":
        gate, up = full[..., :7], full[..., 7:]
        expected = gate / (1 + np.exp(-gate)) * up
    elif epilogue == "residual":
        expected = full + r
    else:
        expected = full
    assert y.shape == expected.shape
    atol, rtol = load_contract("FlatGemm").tolerance("float32")
    np.testing.assert_allclose(y, expected, atol=atol, rtol=rtol)
    assert counters.gemm_impls == {"implb": 1}  # M = 15: 1 < 15 <= 16


def test_flat_gemm_records_the_impl_the_dispatch_rule_picks():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    counters = ref_ops.OpCounters()
    for rows in (1, 2, 16, 17):
        ref_ops.flat_gemm(rng.standard_normal((rows, 6)).astype(np.float32), w, m1=1, m2=16, counters=counters)
    for rows in (9, 65):  # past ImplA's and ImplB's own limits, whatever m1 and m2 say
        ref_ops.flat_gemm(rng.standard_normal((rows, 6)).astype(np.float32), w, m1=100, m2=200, implc="cutlass",
                          counters=counters)
    assert counters.gemm_impls == {"impla": 1, "implb": 3, "cublaslt": 1, "cutlass": 1}


def test_flat_gemm_errors():
    x = np.zeros((2, 6), np.float32)
    with pytest.raises(FdppError, match="K=6"):
        ref_ops.flat_gemm(x, np.zeros((4, 5), np.float32))
    with pytest.raises(FdppError, match="even N"):
        ref_ops.flat_gemm(x, np.zeros((5, 6), np.float32), epilogue="silu_mul")
    with pytest.raises(FdppError, match="residual input"):
        ref_ops.flat_gemm(x, np.zeros((4, 6), np.float32), epilogue="residual")


# --- running fdpp nodes in onnxruntime -----------------------------------------------------------------------

def _fdpp_model(dtype, mode):
    """x [2, 3, 16] -> FlatGemm(silu_mul, 512 -> 256) -> q [2, 4, 3, 64]; attention against k/v inputs; then
    FlatGemm(bias, residual) [256 -> 256]."""
    np_dtype = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    rng = np.random.default_rng(9)
    w1 = numpy_helper.from_array((0.3 * rng.standard_normal((512, 16))).astype(np_dtype), "w1")
    w2 = numpy_helper.from_array((0.1 * rng.standard_normal((256, 256))).astype(np_dtype), "w2")
    b2 = numpy_helper.from_array(rng.standard_normal(256).astype(np_dtype), "b2")
    shape = numpy_helper.from_array(np.array([2, 3, 4, 64], np.int64), "qshape")
    back = numpy_helper.from_array(np.array([2, 3, 256], np.int64), "back")
    attn_attrs = dict(scale=0.35, phi=0.0, guard_lo=-60.0, guard_hi=10.0, mask_mode=mode, num_heads=4,
                      num_kv_heads=2, head_dim=64)
    fourth = {"past_len": ["past_len"], "bias": ["bias"], "none": []}[mode]
    nodes = [
        helper.make_node("FlatGemm", ["x", "w1"], ["h"], domain="fdpp", name="up", epilogue="silu_mul", m1=1, m2=16),
        helper.make_node("Reshape", ["h", "qshape"], ["q_bshd"]),
        helper.make_node("Transpose", ["q_bshd"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("AsyncSoftmaxAttention", ["q", "k", "v"] + fourth, ["o"], domain="fdpp", name="att",
                         **attn_attrs),
        helper.make_node("Transpose", ["o"], ["o_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o_t", "back"], ["o_flat"]),
        helper.make_node("FlatGemm", ["o_flat", "w2", "b2", "o_flat"], ["y"], domain="fdpp", name="down",
                         epilogue="residual", has_bias=1, m1=4, m2=16),
    ]
    inputs = [helper.make_tensor_value_info("x", dtype, [2, 3, 16]),
              helper.make_tensor_value_info("k", dtype, [2, 2, 11, 64]),
              helper.make_tensor_value_info("v", dtype, [2, 2, 11, 64])]
    if mode == "past_len":
        inputs.append(helper.make_tensor_value_info("past_len", TensorProto.INT64, [2]))
    if mode == "bias":
        inputs.append(helper.make_tensor_value_info("bias", dtype, [2, 1, 3, 11]))
    graph = helper.make_graph(nodes, "fdpp", inputs, [helper.make_tensor_value_info("y", dtype, [2, 3, 256])],
                              initializer=[w1, w2, b2, shape, back])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("fdpp", 1)])
    return model, {"w1": w1, "w2": w2, "b2": b2}, attn_attrs


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
@pytest.mark.parametrize("mode", ["past_len", "bias", "none"])
def test_reference_session_runs_fdpp_nodes(dtype, mode):
    model, weights, attn_attrs = _fdpp_model(dtype, mode)
    np_dtype = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    rng = np.random.default_rng(10)
    feeds = {"x": rng.standard_normal((2, 3, 16)).astype(np_dtype),
             "k": rng.standard_normal((2, 2, 11, 64)).astype(np_dtype),
             "v": rng.standard_normal((2, 2, 11, 64)).astype(np_dtype)}
    mask_input = None
    if mode == "past_len":
        feeds["past_len"] = mask_input = np.array([8, 2], np.int64)
    if mode == "bias":
        feeds["bias"] = mask_input = np.where(causal([8, 2], 3, 11), 0.0, -np.inf).astype(np_dtype)
    session = ref_session.make_reference_session(model)
    (y,) = session.run(["y"], feeds)
    assert y.dtype == np_dtype and y.shape == (2, 3, 256)
    assert any(node.domain == "fdpp" for node in model.graph.node)  # the caller's model keeps its fdpp nodes

    # the same computation with the numpy functions directly (float32 inside, rounded like the session)
    w1, w2, b2 = (numpy_helper.to_array(weights[n]) for n in ("w1", "w2", "b2"))
    h = ref_ops.flat_gemm(feeds["x"], w1, epilogue="silu_mul")
    q = h.reshape(2, 3, 4, 64).transpose(0, 2, 1, 3)
    o = ref_ops.async_softmax_attention(q, feeds["k"], feeds["v"], mask_input, **attn_attrs)
    o = o.transpose(0, 2, 1, 3).reshape(2, 3, 256)
    expected = ref_ops.flat_gemm(o, w2, b2, o, epilogue="residual")
    np.testing.assert_allclose(y.astype(np.float32), expected.astype(np.float32), atol=1e-5, rtol=1e-5)


def test_reference_session_counts_fallback_rows():
    model, _, _ = _fdpp_model(TensorProto.FLOAT, "past_len")
    rng = np.random.default_rng(11)
    feeds = {"x": 30 * rng.standard_normal((2, 3, 16)).astype(np.float32),  # scores far beyond guard_hi
             "k": 30 * rng.standard_normal((2, 2, 11, 64)).astype(np.float32),
             "v": rng.standard_normal((2, 2, 11, 64)).astype(np.float32),
             "past_len": np.array([8, 2], np.int64)}
    session = ref_session.make_reference_session(model)
    session.counters.reset()
    (y,) = session.run(["y"], feeds)
    assert np.isfinite(y).all()
    assert session.counters.attention_rows == 2 * 4 * 3 and session.counters.fallback_rows > 0
    assert session.counters.gemm_impls == {"implb": 2}  # M = 6: 1 < 6 <= 16 and 4 < 6 <= 16


def test_reference_session_missing_file(tmp_path):
    with pytest.raises(FdppError, match="no ONNX file"):
        ref_session.make_reference_session(tmp_path / "missing.onnx")


def test_gather_pages_reads_blocks_in_table_order_numpy_and_torch():
    import torch

    from fdpp_rewrite.ref_ops import gather_pages, kv_block_size

    assert kv_block_size() == 64
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((6, 2, 4, 3)).astype(np.float32)  # 6 blocks of 4 positions
    table = np.array([[3, 1, 0], [5, 2, 4]], dtype=np.int32)
    out = gather_pages(pool, table, 6)
    assert out.shape == (2, 2, 6, 3)
    np.testing.assert_array_equal(out[0, :, :4], pool[3])
    np.testing.assert_array_equal(out[0, :, 4:], pool[1][:, :2])
    np.testing.assert_array_equal(out[1, :, 4:], pool[2][:, :2])
    as_torch = gather_pages(torch.from_numpy(pool), torch.from_numpy(table).long(), 6)
    np.testing.assert_array_equal(as_torch.numpy(), out)
    with pytest.raises(FdppError, match="need 4 blocks"):
        gather_pages(pool, table, 13)


def test_rope_append_through_a_block_table_is_the_contiguous_append_in_pages():
    """The paged reference (pools and a table) writes what the contiguous one does, read back by gather_pages; a
    position past the table's W x block positions is dropped like one past a contiguous cache; no other block
    changes."""
    from fdpp_rewrite.ref_ops import gather_pages, rope_append

    rng = np.random.default_rng(3)
    batch, heads, kv_heads, seq, dim, block, width = 2, 4, 2, 5, 8, 4, 3  # capacity 12
    query = rng.standard_normal((batch, heads, seq, dim)).astype(np.float32)
    k_new, v_new = (rng.standard_normal((batch, kv_heads, seq, dim)).astype(np.float32) for _ in range(2))
    table = np.array([[5, 2, 7], [1, 6, 3]], dtype=np.int32)  # block 0 (null) and 4 in no row
    pools = [rng.standard_normal((8, kv_heads, block, dim)).astype(np.float32) for _ in range(2)]
    caches = [gather_pages(pool, table, width * block) for pool in pools]
    past = np.array([2, 9], dtype=np.int64)  # row 1 writes 9..13: 12 and 13 fall past the table
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim)
    want_q, want_k, want_v = rope_append(query, k_new, v_new, *caches, past, inv_freq, rope_dim=dim)
    got_q, got_k, got_v = rope_append(query, k_new, v_new, *pools, past, inv_freq, rope_dim=dim, block_table=table)
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(gather_pages(got_k, table, width * block), want_k)
    np.testing.assert_array_equal(gather_pages(got_v, table, width * block), want_v)
    assert not np.array_equal(want_k, caches[0])  # the append wrote something
    for got, pool in ((got_k, pools[0]), (got_v, pools[1])):
        np.testing.assert_array_equal(got[[0, 4]], pool[[0, 4]])
