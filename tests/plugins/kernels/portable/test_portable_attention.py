"""The portable decode attention (plugins/kernels/portable/, the source the AMD build compiles) on the H200, through
the same checks as the Hopper kernels (tests/plugins/kernels/attention/test_attention.py, whose input builders are
reused): a float32 reference with torch's own low-precision error as the tolerance, GQA/MQA, variable lengths,
masks, adversarial scores that must come out exact and NaN-free, and the fallback counter."""

import sys
from pathlib import Path

import pytest

from attention_reference import check_close
from pairwise import pairwise_params

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "attention"))
from test_attention import DTYPES, HEADS, SOFTMAXES, _heads_id, make_inputs, reference_view  # noqa: E402

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _exact_fp32_matmul():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)


def _portable():
    from fdpp_rewrite.gpu import attention, portable

    return portable, attention


@pytest.mark.parametrize("dtype,dim,bhk,kv_len,softmax", pairwise_params(
    {"dtype": DTYPES, "dim": [64, 128], "bhk": HEADS, "kv_len": [1, 97, 4099], "softmax": SOFTMAXES},
    ids={"bhk": _heads_id}))
def test_decode_matches_reference(dtype, dim, bhk, kv_len, softmax):
    portable, att = _portable()
    batch, heads, kv_heads = bhk
    q, k, v, past = make_inputs(batch, heads, kv_heads, 1, kv_len, dim, dtype, capacity=kv_len + 5,
                                spread=kv_len > 64)
    counters = att.Counters()
    out = portable.attention(q, k, v, past, softmax=softmax, counters=counters)
    kr, vr = reference_view(k, v, past, 1)
    check_close(out, q, kr, vr, f"portable {dtype} d{dim} {batch}x{heads}/{kv_heads} L{kv_len} {softmax}",
                scale=dim ** -0.5, past_len=past)
    assert counters.fallback_rows == 0, "unit-scale scores stay inside the default window"
    assert counters.clamped_rows == 0


@pytest.mark.parametrize("num_splits", [1, 2, 7, 64])
def test_any_split_count_gives_the_same_result(num_splits):
    portable, _ = _portable()
    q, k, v, past = make_inputs(2, 8, 2, 1, 2000, 128, torch.float16, spread=True)
    out = portable.attention(q, k, v, past, num_splits=num_splits)
    kr, vr = reference_view(k, v, past, 1)
    check_close(out, q, kr, vr, f"portable splits={num_splits}", scale=128 ** -0.5, past_len=past)


@pytest.mark.parametrize("seq", [2, 8, 130])
@pytest.mark.parametrize("dtype", DTYPES)
def test_several_query_tokens_per_sequence_are_causal(dtype, seq):
    """The portable kernel takes any seq (each query row its own blocks): decode steps and a short prefill."""
    portable, _ = _portable()
    q, k, v, past = make_inputs(3, 9, 3, seq, 300, 128, dtype, spread=True)
    out = portable.attention(q, k, v, past)
    kr, vr = reference_view(k, v, past, seq)
    check_close(out, q, kr, vr, f"portable seq={seq}", scale=128 ** -0.5, past_len=past)


def test_float32_matches_reference():
    portable, _ = _portable()
    q, k, v, past = make_inputs(2, 6, 3, 4, 333, 64, torch.float32, spread=True)
    out = portable.attention(q, k, v, past)
    kr, vr = reference_view(k, v, past, 4)
    check_close(out, q, kr, vr, "portable float32", scale=64 ** -0.5, past_len=past)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_mask_with_fully_masked_rows(dtype):
    portable, _ = _portable()
    q, k, v, _ = make_inputs(2, 4, 2, 3, 300, 128, dtype)
    bias = torch.randn(2, 1, 3, 300, device="cuda").to(dtype)
    bias[:, :, :, 250:] = float("-inf")
    bias[:, :, :, 100:110] = -10000.0
    bias[1, 0, 1, :] = float("-inf")  # one fully masked row in every head of sequence 1
    out = portable.attention(q, k, v, bias=bias, mask_mode="bias")
    check_close(out, q, k, v, "portable bias", scale=128 ** -0.5, mask_mode="bias", bias=bias)
    assert out[1, :, 1].abs().max().item() == 0.0


def test_mask_mode_none_sees_every_key():
    portable, _ = _portable()
    q, k, v, _ = make_inputs(2, 8, 4, 2, 500, 64, torch.float16)
    out = portable.attention(q, k, v, mask_mode="none")
    check_close(out, q, k, v, "portable none", scale=64 ** -0.5, mask_mode="none")


@pytest.mark.parametrize("dtype,seq_splits,softmax", pairwise_params(
    {"dtype": DTYPES, "seq_splits": [(1, 0), (1, 1), (4, 0), (4, 3)], "softmax": SOFTMAXES},
    ids={"seq_splits": lambda s: "S{}-splits{}".format(*s)}))
def test_adversarial_scores_stay_exact(dtype, seq_splits, softmax):
    """Scores up to +-1e4 in one key tile per head group: never NaN/Inf, within tolerance; the unified kernel sends
    exactly the out-of-window rows to the exact fallback, the synchronized one never falls back."""
    portable, att = _portable()
    seq, splits = seq_splits
    q, k, v, past = make_inputs(2, 8, 2, seq, 1500, 128, dtype, spread=True)
    kr, vr = reference_view(k, v, past, seq)
    k[:, 0, 700] = q[:, 0, 0] * 8
    k[:, 1, 900] = -q[:, 4, 0] * 8
    kr[:, 0, 700], kr[:, 1, 900] = k[:, 0, 700], k[:, 1, 900]
    for scale in (128 ** -0.5, 30.0):  # 30: ordinary scores ~ +-1e4
        counters = att.Counters()
        out = portable.attention(q, k, v, past, softmax=softmax, scale=scale, num_splits=splits, counters=counters)
        check_close(out, q, kr, vr, f"portable adversarial {softmax} scale={scale}", scale=scale, past_len=past)
        if softmax == "unified":
            assert counters.fallback_rows > 0
        else:
            assert counters.fallback_rows == 0


@pytest.mark.parametrize("num_splits", [0, 1])
def test_fallback_counter_counts_every_row_outside_the_window(num_splits):
    portable, att = _portable()
    q, k, v, past = make_inputs(2, 6, 3, 3, 400, 128, torch.float16)
    rows = 2 * 6 * 3
    kr, vr = reference_view(k, v, past, 3)
    counters = att.Counters()
    for phi in (-50.0, 75.0):  # every s - phi ~ 50 > guard_hi; then ~ -75 < guard_lo
        counters.reset()
        out = portable.attention(q, k, v, past, phi=phi, num_splits=num_splits, counters=counters)
        check_close(out, q, kr, vr, f"portable phi={phi}", scale=128 ** -0.5, past_len=past)
        assert counters.fallback_rows == rows
    counters.reset()
    portable.attention(q, k, v, past, phi=2.0, num_splits=num_splits, counters=counters)
    assert counters.fallback_rows == 0


def test_agrees_with_the_hopper_decode_kernel():
    portable, att = _portable()
    q, k, v, past = make_inputs(4, 32, 8, 1, 3000, 128, torch.float16, spread=True)
    ours = portable.attention(q, k, v, past).float()
    hopper = att.attention(q, k, v, past, kernel="decode").float()
    assert (ours - hopper).abs().max().item() < 2e-3


def test_kv_length_beyond_the_cache_is_clamped_and_counted():
    portable, att = _portable()
    q, k, v, _ = make_inputs(2, 4, 4, 1, 64, 64, torch.float16)
    past = torch.tensor([63, 500], dtype=torch.int64, device="cuda")  # sequence 1 claims more keys than the cache
    counters = att.Counters()
    out = portable.attention(q, k, v, past, counters=counters, max_kv_len=64)
    assert torch.isfinite(out).all()
    assert counters.clamped_rows == 4


def test_library_counters_when_none_passed():
    portable, att = _portable()
    q, k, v, past = make_inputs(1, 4, 4, 1, 200, 64, torch.float16)
    att.read_library_counters(reset=True)
    portable.attention(q, k, v, past, phi=-60.0)
    assert att.read_library_counters()[0] == 4


def test_cuda_graph_capture_and_replay():
    portable, _ = _portable()
    q, k, v, past = make_inputs(2, 8, 2, 1, 1000, 128, torch.float16)
    out = torch.empty_like(q)
    workspace = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
    portable.attention(q, k, v, past, out=out, workspace=workspace)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        portable.attention(q, k, v, past, out=out, workspace=workspace)
    q.copy_(torch.randn_like(q))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    kr, vr = reference_view(k, v, past, 1)
    check_close(out, q, kr, vr, "portable graph replay", scale=128 ** -0.5, past_len=past)


def test_bad_inputs_raise_one_line_errors():
    portable, att = _portable()
    q, k, v, past = make_inputs(1, 4, 4, 1, 64, 64, torch.float16)
    q80, k80, v80, past80 = make_inputs(1, 4, 4, 1, 64, 80, torch.float16)
    with pytest.raises(att.FdppError, match="head_dim 80"):
        portable.attention(q80, k80, v80, past80)
    with pytest.raises(att.FdppError, match="workspace holds"):
        portable.attention(q, k, v, past, num_splits=4, workspace=torch.empty(16, dtype=torch.uint8, device="cuda"))
