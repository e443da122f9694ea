"""Head sizes 80, 96 and 256, logit soft-capping and the sliding window on the GPU (contract version 4), beyond the
head sizes test_attention.py's decode and prefill grids cover: padded dims never written, rowwise, paged caches, a
cap and a window in every kernel against the float32 reference with torch's own low-precision error as the
tolerance; adversarial scores (+-1e4) with a cap and a window: never a non-finite
output; the shapes a case is not built for refused. Grids are pairwise (tests/helpers/pairwise.py).

    python3 -m pytest -q -m gpu tests/plugins/kernels/attention/test_attention_heads_softcap_window.py
"""

import pytest

from attention_reference import exact_fp32_matmul  # noqa: F401 - an autouse fixture
from attention_reference import (attention_api, check_close, make_inputs, pad_to_blocks, paginate, prefill_shape_built,
                                 reference_view)
from pairwise import pairwise_params

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

DTYPES = [torch.float16, torch.bfloat16]
NEW_DIMS = [80, 96, 256]


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
     "dim": [64, 96, 128, 256], "dtype": DTYPES, "softcap": [0.0, 30.0], "window": [0, 1, 700]},
    valid=lambda c: bool(c["softcap"] or c["window"]) and (
        c["path"][0] != "prefill" or prefill_shape_built(c["dim"], c["path"][1], c["softcap"], c["window"])),
    ids={"path": lambda p: f"{p[0]}-cfg{p[1]}-splits{p[2]}"}))
def test_softcap_and_window_match_reference(path, dim, dtype, softcap, window):
    """Every kernel with a cap and/or a window (1: each query sees only itself; 700: the decode splits start past
    key 0 and the prefill skips whole tiles) against the reference that caps and windows the same way."""
    kernel, config, splits = path
    if config in (4, 5) and not _hopper():
        pytest.skip(f"prefill_config {config} is an sm_90 (Hopper) wgmma kernel")
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
