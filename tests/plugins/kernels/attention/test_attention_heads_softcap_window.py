"""Head sizes 80, 96 and 256, logit soft-capping and the sliding window on the GPU (contract version 4), beyond the
head sizes test_attention.py's decode and prefill grids cover: padded dims never written, rowwise, paged caches, a
cap and a window in every kernel against the float32 reference with torch's own low-precision error as the
tolerance; adversarial scores (+-1e4) with a cap and a window: never a non-finite
output; the shapes a case is not built for refused. Head dims 80/96 read from rows 128 elements apart whose extra
columns hold NaN (an over-read shows), the window's first and last excluded key probed, empty decode splits under a
window in every combine, and a cap with an additive bias. Grids are pairwise (tests/helpers/pairwise.py).

    python3 -m pytest -q -m gpu tests/plugins/kernels/attention/test_attention_heads_softcap_window.py
"""

import pytest

from attention_reference import exact_fp32_matmul  # noqa: F401 - an autouse fixture
from attention_reference import (attention_api, attention_reference, check_close, in_wide_buffers, make_inputs,
                                 pad_to_blocks, paginate, prefill_shape_built, reference_view)
from pairwise import pairwise_params

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

DTYPES = [torch.float16, torch.bfloat16]
NEW_DIMS = [80, 96, 256]
SOFTMAXES = ["unified", "synchronized"]


def _att():
    return attention_api()


def _hopper():
    return torch.cuda.get_device_capability()[0] == 9


@pytest.mark.parametrize("dim", [80, 96])
def test_padded_head_dims_write_only_their_own_columns(dim):
    """An output that is a column slice of a wider buffer (stride 128): the columns past head_dim keep their
    sentinel in decode, prefill and rowwise."""
    att = _att()
    q, k, v, past = make_inputs(2, 4, 2, 3, 300, dim, torch.float16)
    kr, vr = reference_view(k, v, past, 3)
    for kernel in ("decode", "prefill", "rowwise"):
        wide = torch.full((2, 4, 3, 128), 7.0, device="cuda", dtype=torch.float16)
        out = att.attention(q, k, v, past, kernel=kernel, out=wide[..., :dim])
        check_close(out, q, kr, vr, f"{kernel} d{dim} into a wider buffer", scale=dim ** -0.5, past_len=past)
        assert (wide[..., dim:] == 7.0).all(), f"{kernel} wrote past head_dim {dim}"


@pytest.mark.parametrize("dim", NEW_DIMS)
def test_rowwise_float32_new_head_sizes(dim):
    att = _att()
    q, k, v, past = make_inputs(2, 6, 2, 4, 200, dim, torch.float32, spread=True)
    out = att.attention(q, k, v, past, kernel="rowwise")
    kr, vr = reference_view(k, v, past, 4)
    check_close(out, q, kr, vr, f"rowwise float32 d{dim}", scale=dim ** -0.5, past_len=past)


@pytest.mark.parametrize("kernel,dim,dtype,window", pairwise_params(
    {"kernel": ["decode", "prefill", "rowwise"], "dim": NEW_DIMS, "dtype": DTYPES, "window": [0, 100]}))
def test_paged_new_head_sizes_equal_contiguous(kernel, dim, dtype, window):
    """Through a block table (random block order, NaN in the null and spare blocks) the same bits as on the
    contiguous caches, with and without a window that skips whole blocks."""
    att = _att()
    lengths = [97, 300, 130]
    seq = 1 if kernel == "decode" else 16
    k = torch.full((3, 2, max(lengths), dim), float("nan"), device="cuda", dtype=dtype)
    v = torch.full_like(k, float("nan"))
    for b, n in enumerate(lengths):
        k[b, :, :n] = torch.randn(2, n, dim, device="cuda").to(dtype)
        v[b, :, :n] = torch.randn(2, n, dim, device="cuda").to(dtype)
    k, v = pad_to_blocks(k), pad_to_blocks(v)
    q = torch.randn(3, 6, seq, dim, device="cuda").to(dtype)
    past = torch.tensor([n - seq for n in lengths], device="cuda")
    (kp, vp), table = paginate((k, v), lengths)
    options = dict(kernel=kernel, window=window, max_kv_len=k.shape[2])
    ref = att.attention(q, k, v, past, **options)
    out = att.attention(q, kp, vp, past, block_table=table, **options)
    assert torch.isfinite(ref).all() and torch.equal(out, ref), f"paged {kernel} d{dim} window {window}"
    kr, vr = reference_view(k, v, past, seq)
    check_close(ref, q, kr, vr, f"{kernel} d{dim} window {window}", scale=dim ** -0.5, past_len=past, window=window)


@pytest.mark.parametrize("path,dim,dtype,softcap,window", pairwise_params(
    {"path": [("decode", 0, 0), ("decode", 0, 3), ("prefill", 0, 0), ("prefill", 2, 0), ("prefill", 4, 0),
              ("prefill", 5, 0), ("rowwise", 0, 0)],
     "dim": [64, 80, 96, 128, 256], "dtype": DTYPES, "softcap": [0.0, 30.0], "window": [0, 1, 700]},
    valid=lambda c: bool(c["softcap"] or c["window"]) and (
        c["path"][0] != "prefill" or prefill_shape_built(c["dim"], c["path"][1], c["softcap"], c["window"])),
    ids={"path": lambda p: f"{p[0]}-cfg{p[1]}-splits{p[2]}"}))
def test_softcap_and_window_match_reference(path, dim, dtype, softcap, window):
    """Every kernel with a cap and/or a window (1: each query sees only itself; 700: the decode splits start past
    key 0 and the prefill skips whole tiles) against the reference that caps and windows the same way."""
    kernel, config, splits = path
    if config == 4 and not _hopper():
        pytest.skip("prefill_config 4 is an sm_90 (Hopper) wgmma kernel")
    att = _att()
    seq = {"decode": 4, "prefill": 150, "rowwise": 3}[kernel]
    q, k, v, past = make_inputs(2, 8, 2, seq, 1500, dim, dtype, spread=True, q_scale=4.0)
    counters = att.Counters()
    out = att.attention(q, k, v, past, kernel=kernel, prefill_config=config, num_splits=splits, softcap=softcap,
                        window=window, counters=counters)
    kr, vr = reference_view(k, v, past, seq)
    check_close(out, q, kr, vr, f"{kernel} cfg{config} d{dim} {dtype} softcap {softcap} window {window}",
                scale=dim ** -0.5, past_len=past, softcap=softcap, window=window)
    assert counters.clamped_rows == 0


@pytest.mark.parametrize("kernel,config", [("decode", 0), ("prefill", 2), ("prefill", 4), ("prefill", 5),
                                           ("rowwise", 0)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_adversarial_scores_with_softcap_and_window_stay_exact(kernel, config, dtype):
    """Scores of order +-1e4 (scale 30), capped at 50, inside a window of 512: with phi = 0 and guard_hi = cap (the
    setting docs/notes-attention.md gives for a cap) no row falls back and none is non-finite; forcing every row to
    the fallback (phi far off) gives the same result."""
    if config in (4, 5) and not _hopper():
        pytest.skip(f"prefill_config {config} is an sm_90 (Hopper) wgmma kernel")
    att = _att()
    seq = 1 if kernel == "decode" else 64
    q, k, v, past = make_inputs(2, 8, 2, seq, 1500, 128, dtype, spread=True)
    kr, vr = reference_view(k, v, past, seq)
    k[:, 0, 1200] = q[:, 0, 0] * 8  # one huge positive score for group 0, a huge negative one for group 1
    k[:, 1, 1300] = -q[:, 4, 0] * 8
    kr[:, 0, 1200], kr[:, 1, 1300] = k[:, 0, 1200], k[:, 1, 1300]
    results = []
    for phi, guard_hi in ((0.0, 50.0), (-1000.0, 10.0)):
        counters = att.Counters()
        out = att.attention(q, k, v, past, kernel=kernel, prefill_config=config, scale=30.0, softcap=50.0,
                            window=512, phi=phi, guard_hi=guard_hi, counters=counters)
        assert torch.isfinite(out).all(), f"{kernel}: {int((~torch.isfinite(out)).sum())} non-finite outputs"
        check_close(out, q, kr, vr, f"adversarial {kernel} cfg{config} phi {phi}", scale=30.0, past_len=past,
                    softcap=50.0, window=512)
        results.append((out, counters.fallback_rows))
    (_, fallbacks), (_, forced_fallbacks) = results
    if kernel == "decode":  # prefill anchors each row on its own max; the rowwise kernel is the fallback itself
        assert fallbacks == 0 and forced_fallbacks == 2 * 8 * seq


@pytest.mark.parametrize("dim,options,message", [
    (256, {"prefill_config": 1}, "prefill_config 1 is not built for head_dim 256"),
    (256, {"prefill_config": 4}, "prefill_config 4 is not built for head_dim 256"),
    (256, {"prefill_config": 5}, "prefill_config 5 is not built for head_dim 256"),
    (96, {"prefill_config": 1}, "prefill_config 1 is not built for head_dim 96"),
    (128, {"prefill_config": 1, "softcap": 50.0}, "with softcap or window"),
    (128, {"window": 8, "mask_mode": "none"}, "window"),
])
def test_shapes_not_built_are_refused(dim, options, message):
    from fdpp_rewrite.errors import FdppError

    att = _att()
    q, k, v, past = make_inputs(1, 2, 2, 200, 200, dim, torch.float16)
    with pytest.raises(FdppError, match=message):
        att.attention(q, k, v, None if options.get("mask_mode") == "none" else past, kernel="prefill", **options)


# --- head dims 80/96 from strided rows: reads past head_dim fetch NaN ---

# (kernel, prefill_config, num_splits, decode_combine): the split kernel with the combine kernel and with the plan's
# combine, the 64-row and wgmma prefill shapes, the rowwise kernel. (Shape 5 refuses 80 and 96: test_attention.py.)
STRIDED_PATHS = [("decode", 0, 4, "kernel"), ("decode", 0, 3, "auto"), ("prefill", 2, 0, "auto"),
                 ("prefill", 4, 0, "auto"), ("rowwise", 0, 0, "auto")]


@pytest.mark.parametrize("path,dim,dtype", pairwise_params(
    {"path": STRIDED_PATHS, "dim": [80, 96], "dtype": DTYPES},
    ids={"path": lambda p: f"{p[0]}-cfg{p[1]}-splits{p[2]}-{p[3]}"}))
def test_padded_head_dims_never_read_past_the_row(path, dim, dtype):
    """q, k and v are [..., :dim] views of 128-wide buffers whose other columns hold NaN, the output one of a buffer
    holding a sentinel: a Q or K chunk read past head_dim makes scores NaN, seen in the output or, where the NaN
    flags the row for the exact recompute, in the fallback count (0 for these unit-scale scores)."""
    kernel, config, splits, combine = path
    if config == 4 and not _hopper():
        pytest.skip("prefill_config 4 is an sm_90 (Hopper) wgmma kernel")
    att = _att()
    seq = {"decode": 4, "prefill": 150, "rowwise": 3}[kernel]
    q, k, v, past = make_inputs(2, 8, 2, seq, 1500, dim, dtype, spread=True)
    kr, vr = reference_view(k, v, past, seq)
    q, k, v = in_wide_buffers(q, k, v)
    assert q.stride(2) == k.stride(2) == 128, "the views must keep the 128-element rows"
    wide = torch.full((2, 8, seq, 128), 7.0, device="cuda", dtype=dtype)
    counters = att.Counters()
    out = att.attention(q, k, v, past, kernel=kernel, prefill_config=config, num_splits=splits,
                        decode_combine=combine, counters=counters, out=wide[..., :dim])
    what = f"strided d{dim} {kernel} cfg{config} splits {splits} {combine} {dtype}"
    check_close(out, q, kr, vr, what, scale=dim ** -0.5, past_len=past)
    assert (wide[..., dim:] == 7.0).all(), f"{what}: wrote past head_dim"
    if kernel != "rowwise":  # the rowwise kernel is the exact path itself
        assert counters.fallback_rows == 0, f"{what}: rows flagged (a NaN score from a read past the row?)"


@pytest.mark.parametrize("kernel,config", [("decode", 0), ("prefill", 2), ("prefill", 4), ("prefill", 5)])
@pytest.mark.parametrize("dim", [80, 96])
def test_padded_head_dims_fallback_never_reads_past_the_row(kernel, config, dim):
    """The exact recompute reads Q and K itself: on the strided NaN-padded views it stays finite and exact. Decode:
    phi far off flags every row (4 splits, so the combine recomputes); prefill: one key scoring far above row
    590's anchor (test_prefill_fallback_counts_rows_beyond_their_anchor's spike) sends that row to the fallback."""
    if config in (4, 5) and not _hopper():
        pytest.skip(f"prefill_config {config} is an sm_90 (Hopper) wgmma kernel")
    att = _att()
    counters = att.Counters()
    if kernel == "decode":
        q, k, v, past = make_inputs(2, 8, 2, 4, 1500, dim, torch.float16, spread=True)
        kr, vr = reference_view(k, v, past, 4)
        q, k, v = in_wide_buffers(q, k, v)
        out = att.attention(q, k, v, past, kernel="decode", num_splits=4, phi=-1000.0, guard_hi=10.0,
                            counters=counters)
        assert counters.fallback_rows == 2 * 8 * 4
    else:
        q, k, v, past = make_inputs(1, 2, 2, 600, 600, dim, torch.float16)
        k[0, 0, 200] = q[0, 0, 590] * 4
        kr, vr = reference_view(k, v, past, 600)
        q, k, v = in_wide_buffers(q, k, v)
        out = att.attention(q, k, v, past, kernel="prefill", prefill_config=config, softmax="unified",
                            guard_hi=11.0, counters=counters)
        assert counters.fallback_rows >= 1, "the spike should send row 590 to the fallback"
    check_close(out, q, kr, vr, f"fallback {kernel} cfg{config} d{dim} strided", scale=dim ** -0.5, past_len=past)


# --- the window's boundary: the last key outside and the first key inside ---

PROBE_OUT, PROBE_IN, PROBE_Q = 40.0, 9.0, 8.0  # scores of the boundary keys (9 < the default guard_hi 10), q entry


def window_probe(seq, dim, dtype, window, edge, heads=4, kv_heads=2):
    """Inputs probing query rows 0, 10, 20, ... and the last (at least 2 apart), each owning one of the first head
    dims (zero in every other query and key): for probe p (position past_len + i) key p - window, just outside its
    window, scores PROBE_OUT for it alone and has V = -4; key p - window + 1, just inside, scores PROBE_IN and has V =
    +4; other scores are ~N(0, 1). Query row 0's window (and so every 64-row prefill block's first row's) starts
    `edge` keys past a 128-key boundary (a tile edge at every head dim) in sequence 0, one key later in sequence 1;
    the caches hold NaN past each sequence. Returns q, k, v, past, probe rows."""
    probes = []
    for i in sorted(set(range(0, seq, 10)) | {seq - 1}):
        if not probes or i - probes[-1] >= 2:  # adjacent probes would share a boundary key
            probes.append(i)
    assert len(probes) <= dim // 4
    start = 128 * (-(-seq // 128) + 4)  # whole tiles before the window, which the kernels skip
    past0 = start + edge + window - 1  # query 0 at position past0 sees keys from past0 - window + 1 = start + edge
    past = torch.tensor([past0, past0 + 1], dtype=torch.int64)
    capacity = -(-(past0 + 1 + seq) // 64) * 64 + 64
    q = torch.randn(2, heads, seq, dim, device="cuda")
    q[..., :len(probes)] = 0
    k = torch.full((2, kv_heads, capacity, dim), float("nan"), device="cuda")
    v = torch.full_like(k, float("nan"))
    for b in range(2):
        n = int(past[b]) + seq
        k[b, :, :n] = torch.randn(kv_heads, n, dim, device="cuda")
        k[b, :, :n, :len(probes)] = 0
        v[b, :, :n] = torch.randn(kv_heads, n, dim, device="cuda")
        for j, i in enumerate(probes):
            q[b, :, i, j] = PROBE_Q
            first = int(past[b]) + i - window + 1
            assert first - 1 >= 0
            for key, score, value in ((first - 1, PROBE_OUT, -4.0), (first, PROBE_IN, 4.0)):
                k[b, :, key] = 0
                k[b, :, key, j] = score * dim ** 0.5 / PROBE_Q
                v[b, :, key] = value
    return q.to(dtype), k.to(dtype), v.to(dtype), past.cuda(), probes


# (kernel, prefill_config, num_splits); the rowwise kernel runs float32
PROBE_PATHS = [("decode", 0, 0), ("decode", 0, 4), ("prefill", 2, 0), ("prefill", 4, 0), ("rowwise", 0, 0)]


@pytest.mark.parametrize("path,dim,dtype,window,edge", pairwise_params(
    {"path": PROBE_PATHS, "dim": [64, 80, 128, 256], "dtype": DTYPES + [torch.float32], "window": [1, 64, 700],
     "edge": [0, 32, 17]},
    valid=lambda c: (c["path"][0] == "rowwise") == (c["dtype"] == torch.float32) and (
        c["path"][0] != "prefill" or prefill_shape_built(c["dim"], c["path"][1], 0.0, c["window"])),
    ids={"path": lambda p: f"{p[0]}-cfg{p[1]}-splits{p[2]}"}))
def test_window_boundary_keys(path, dim, dtype, window, edge):
    """Window starts on a 64-key tile edge (edge 0), on a 32-key edge (the fallback's and the paged lookup's step)
    and off both (17): for every probe row the key just outside the window (score 40: it would take all the weight
    and, in the unified kernels, flag the row) has no effect, and the key just inside (score 9 against ~N(0, 1):
    most of the weight, V = +4) does."""
    kernel, config, splits = path
    if config == 4 and not _hopper():
        pytest.skip("prefill_config 4 is an sm_90 (Hopper) wgmma kernel")
    att = _att()
    seq = {"decode": 4, "prefill": 150, "rowwise": 3}[kernel]
    q, k, v, past, probes = window_probe(seq, dim, dtype, window, edge)
    kr, vr = reference_view(k, v, past, seq)
    counters = att.Counters()
    out = att.attention(q, k, v, past, kernel=kernel, prefill_config=config, num_splits=splits, window=window,
                        counters=counters)
    what = f"window {window} edge {edge} {kernel} cfg{config} splits {splits} d{dim} {dtype}"
    check_close(out, q, kr, vr, what, scale=dim ** -0.5, past_len=past, window=window)
    means = out[:, :, probes].float().mean(-1)  # [B, H, probes]: ~+4 x the inside key's weight (>= 0.85)
    assert (means > 2.0).all(), f"{what}: a probe row lost its first visible key or saw the one before: " \
                                f"mean {means.min().item():.3f}"
    if kernel != "rowwise":
        assert counters.fallback_rows == 0, f"{what}: rows flagged (the excluded key scored?)"


# --- empty decode splits under a window, every combine ---

@pytest.mark.parametrize("mode,combine,splits,dtype", pairwise_params(
    {"mode": [("unified", 0.0), ("unified", -1000.0), ("synchronized", 0.0)],
     "combine": ["kernel", "last_block", "auto"], "splits": [8, 16], "dtype": DTYPES},
    ids={"mode": lambda m: f"{m[0]}-phi{m[1]:g}"}))
def test_window_with_empty_splits_matches_reference(mode, combine, splits, dtype):
    """Window 700 over rows of 8192, 5001, 701 and 40 keys in one call (the grid sized by the 8K row): the shorter
    rows' splits, and the ones before the window, see no visible key. Every combine (auto: the cluster where it fits,
    else the last block, given combine_counters) stays finite and exact, leaves the counters zero, and with phi
    far off recomputes every row of the unified softmax."""
    softmax, phi = mode
    att = _att()
    lengths, seq, window = [8192, 5001, 701, 40], 2, 700
    q = torch.randn(4, 8, seq, 128, device="cuda").to(dtype)
    k = torch.full((4, 2, 8192, 128), float("nan"), device="cuda", dtype=dtype)
    v = torch.full_like(k, float("nan"))
    for b, n in enumerate(lengths):
        k[b, :, :n] = torch.randn(2, n, 128, device="cuda").to(dtype)
        v[b, :, :n] = torch.randn(2, n, 128, device="cuda").to(dtype)
    past = torch.tensor([n - seq for n in lengths], device="cuda")
    kr, vr = reference_view(k, v, past, seq)
    combine_counters = torch.zeros(att.combine_counters_size(q, k), dtype=torch.int32, device="cuda")
    counters = att.Counters()
    out = att.attention(q, k, v, past, kernel="decode", softmax=softmax, num_splits=splits, decode_combine=combine,
                        window=window, phi=phi, counters=counters, combine_counters=combine_counters,
                        max_kv_len=8192)
    what = f"window {window}, {splits} splits, {combine} combine, {softmax}, phi {phi}, {dtype}"
    check_close(out, q, kr, vr, what, scale=128 ** -0.5, past_len=past, window=window)
    assert not combine_counters.any().item(), f"{what}: the call left its combine counters non-zero"
    expected = 4 * 8 * seq if softmax == "unified" and phi else 0
    assert counters.fallback_rows == expected and counters.clamped_rows == 0, what


# --- a soft cap with an additive bias: cap first, then the bias ---

def _bias_before_cap(q, k, v, bias, scale, softcap):
    """The wrong order, cap(s + bias), in float32: the test below must tell it from the right one."""
    group = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    scores = (q.float() @ kf.transpose(-1, -2)) * scale + bias.float()
    scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(bias.float() <= -10000.0, float("-inf"))
    return torch.softmax(scores, dim=-1) @ vf


@pytest.mark.parametrize("kernel,config,dtype", [
    pytest.param("decode", 0, torch.float16, id="decode-float16"),
    pytest.param("prefill", 2, torch.bfloat16, id="prefill-cfg2-bfloat16"),
    pytest.param("prefill", 4, torch.float16, id="prefill-cfg4-float16"),
    pytest.param("rowwise", 0, torch.float32, id="rowwise-float32")])
def test_softcap_before_bias_matches_reference(kernel, config, dtype):
    """mask_mode bias with softcap 5 on scores ~N(0, 16) and a bias of +-3 nats (and -inf over keys 300-349): the
    kernels cap the score, then add the bias, as the reference does; the other order differs by far more than the
    tolerance."""
    if config == 4 and not _hopper():
        pytest.skip("prefill_config 4 is an sm_90 (Hopper) wgmma kernel")
    att = _att()
    seq, softcap = {"decode": 2, "prefill": 130, "rowwise": 3}[kernel], 5.0
    q, k, v, _ = make_inputs(2, 8, 2, seq, 400, 128, dtype, q_scale=4.0)
    bias = torch.rand(2, 1, seq, 400, device="cuda") * 6 - 3
    bias[..., 300:350] = float("-inf")
    bias = bias.to(dtype)
    counters = att.Counters()
    out = att.attention(q, k, v, bias=bias, mask_mode="bias", kernel=kernel, prefill_config=config, softcap=softcap,
                        counters=counters)
    what = f"softcap {softcap} + bias, {kernel} cfg{config} {dtype}"
    check_close(out, q, k, v, what, scale=128 ** -0.5, mask_mode="bias", bias=bias, softcap=softcap)
    right = attention_reference(q, k, v, scale=128 ** -0.5, mask_mode="bias", bias=bias, softcap=softcap)
    wrong = _bias_before_cap(q, k, v, bias, 128 ** -0.5, softcap)
    assert (right - wrong).abs().max().item() > 0.05, "the inputs cannot tell cap-then-bias from bias-then-cap"
    assert (out.float() - wrong).abs().max().item() > 0.05, f"{what}: equals bias-then-cap"
    assert counters.clamped_rows == 0
