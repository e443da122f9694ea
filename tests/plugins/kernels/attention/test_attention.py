"""fdpp::AsyncSoftmaxAttention on the GPU: decode (split-KV), prefill, rowwise, against a float32 reference with
torch's own low-precision error as the tolerance; odd sizes, GQA, variable lengths, masks, adversarial scores,
the fallback counter, CUDA-graph capture, the decode's three combines (cluster, combine kernel, last block), and bad
input. Grids over kernel axes are pairwise (tests/helpers/pairwise.py)."""

import pytest

from attention_reference import exact_fp32_matmul  # noqa: F401 - an autouse fixture
from attention_reference import (adversarial_inputs, attention_api, check_close, make_inputs, prefill_shape_built,
                                 reference_view)
from gpu_kernels import capture_graph, kernels_launched
from pairwise import pairwise_params

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _att():
    return attention_api()


HOPPER_CONFIGS = (4, 5)  # the wgmma tile shapes: 4 cp.async, 5 TMA with ping-pong warpgroups


def skip_unless_hopper(config):
    """Tile shapes 4 and 5 run warpgroup MMAs, which only sm_90 has."""
    if config in HOPPER_CONFIGS and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip(f"prefill_config {config} is an sm_90 (Hopper) wgmma kernel")


DTYPES = [torch.float16, torch.bfloat16]
HEADS = [(1, 32, 32), (3, 9, 3), (2, 8, 1)]  # (batch, query heads, kv heads): MHA, GQA 3:1, MQA
SOFTMAXES = ["unified", "synchronized"]
HEAD_DIMS = [64, 80, 96, 128, 256]  # the contract's choices: 80 and 96 run zero-filled inside the 128 kernels



def _heads_id(h):
    return "{}x{}/{}".format(*h)


@pytest.mark.parametrize("dtype,dim,bhk,kv_len,softmax", pairwise_params(
    {"dtype": DTYPES, "dim": HEAD_DIMS, "bhk": HEADS, "kv_len": [1, 97, 4099], "softmax": SOFTMAXES},
    ids={"bhk": _heads_id}))
def test_decode_matches_reference(dtype, dim, bhk, kv_len, softmax):
    att = _att()
    batch, heads, kv_heads = bhk
    q, k, v, past = make_inputs(batch, heads, kv_heads, 1, kv_len, dim, dtype, capacity=kv_len + 5,
                                spread=kv_len > 64)
    counters = att.Counters()
    out = att.attention(q, k, v, past, kernel="decode", softmax=softmax, counters=counters)
    kr, vr = reference_view(k, v, past, 1)
    check_close(out, q, kr, vr, f"decode {dtype} d{dim} {batch}x{heads}/{kv_heads} L{kv_len} {softmax}",
                scale=dim ** -0.5, past_len=past)
    assert counters.fallback_rows == 0, "unit-scale scores stay inside the default window"
    assert counters.clamped_rows == 0


@pytest.mark.parametrize("seq", [2, 5, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_several_query_tokens_per_sequence(dtype, seq):
    att = _att()
    q, k, v, past = make_inputs(3, 9, 3, seq, 300, 128, dtype, spread=True)
    out = att.attention(q, k, v, past, kernel="decode")
    kr, vr = reference_view(k, v, past, seq)
    check_close(out, q, kr, vr, f"decode seq={seq}", scale=128 ** -0.5, past_len=past)


@pytest.mark.parametrize("batch,heads,kv_heads", [(1, 32, 32), (1, 9, 3)])
def test_a_prompt_chunk_on_a_small_grid_runs_the_decode_kernel_exactly(batch, heads, kv_heads):
    """A 128-token chunk after 300 tokens of one sequence: the plan picks the split-KV decode kernel (its prefill
    grid would leave SMs idle), and the causal rows within the chunk match the reference."""
    att = _att()
    q, k, v, past = make_inputs(batch, heads, kv_heads, 128, 428, 128, torch.float16, capacity=512)
    assert att.plan(q, k, v, past)[0] == "decode"
    out = att.attention(q, k, v, past)
    kr, vr = reference_view(k, v, past, 128)
    check_close(out, q, kr, vr, "chunk on the decode kernel", scale=128 ** -0.5, past_len=past)
    from fdpp_rewrite.gpu import gemm

    fills = gemm.device_info()["num_sms"] // heads + 1  # sequences whose prefill grid covers every SM
    assert att.plan(q.expand(fills, -1, -1, -1), k.expand(fills, -1, -1, -1), v.expand(fills, -1, -1, -1),
                    past.expand(fills))[0] == "prefill"


@pytest.mark.parametrize("num_splits", [1, 3, 64])
def test_decode_any_split_count_gives_the_same_result(num_splits):
    att = _att()
    q, k, v, past = make_inputs(2, 8, 2, 1, 2000, 128, torch.float16)
    out = att.attention(q, k, v, past, kernel="decode", num_splits=num_splits)
    kr, vr = reference_view(k, v, past, 1)
    check_close(out, q, kr, vr, f"splits={num_splits}", scale=128 ** -0.5, past_len=past)


@pytest.mark.parametrize("depth,dim,softmax", pairwise_params(
    {"depth": [2, 4], "dim": [64, 128], "softmax": SOFTMAXES}))
def test_decode_pipeline_depths_match_reference(depth, dim, softmax):
    """The split kernel at the 2 and 4 stages decode_stages() picks: more CTAs than SMs (batch 8 x 32 heads, one
    split), and one CTA per SM streaming 33 key tiles (one split forced)."""
    from fdpp_rewrite.gpu.attention import decode_stages

    att = _att()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tile = 64 if dim == 128 else 128
    if depth == 2:
        batch, heads, kv_len, splits, ctas = 8, 32, 300, 0, 8 * 32
        if ctas <= sms:
            pytest.skip("this GPU has at least as many SMs as the grid has CTAs")
    else:
        batch, heads, kv_len, splits, ctas = 1, 4, 33 * tile - 5, 1, 4
    assert decode_stages(ctas, sms, False, (kv_len + tile - 1) // tile // max(splits, 1)) == depth
    q, k, v, past = make_inputs(batch, heads, heads, 1, kv_len, dim, torch.float16, spread=True)
    out = att.attention(q, k, v, past, kernel="decode", softmax=softmax, num_splits=splits)
    kr, vr = reference_view(k, v, past, 1)
    check_close(out, q, kr, vr, f"decode {depth} stages d{dim} {softmax}", scale=dim ** -0.5, past_len=past)


def _hopper():
    return torch.cuda.get_device_capability()[0] == 9


@pytest.mark.parametrize("dtype,dim,softmax,splits,seq", pairwise_params(
    {"dtype": DTYPES, "dim": [64, 128], "softmax": SOFTMAXES, "splits": [2, 3, 8], "seq": [1, 3]}))
def test_decode_cluster_combine_matches_the_combine_kernel(dtype, dim, softmax, splits, seq):
    """The splits of a row block combined inside a thread block cluster (distributed shared memory) against the
    combine kernel: both within the reference tolerance, the same fallback rows; uneven lengths (a sequence
    shorter than the splits leaves some empty), GQA with padded row blocks, and a row spiking out of the window."""
    if not _hopper():
        pytest.skip("the cluster combine runs on sm_90")
    att = _att()
    q, k, v, past = make_inputs(3, 12, 2, seq, 1500, dim, dtype, spread=True)
    past[2] = 40  # 41 + seq keys: fewer tiles than splits at d64 (128-key tiles), one tile at d128
    kr, vr = reference_view(k, v, past, seq)
    k[0, 1, 900] = q[0, 6, 0] * 12  # a key far above phi's window for one row of KV head 1
    kr[0, 1, 900] = k[0, 1, 900]
    results = {}
    for combine in ("kernel", "cluster"):
        counters = att.Counters()
        out = att.attention(q, k, v, past, kernel="decode", softmax=softmax, num_splits=splits,
                            decode_combine=combine, counters=counters)
        check_close(out, q, kr, vr, f"decode {combine} combine, {splits} splits, seq {seq}", scale=dim ** -0.5,
                    past_len=past)
        results[combine] = (out.float(), counters.fallback_rows)
    assert results["cluster"][1] == results["kernel"][1]
    assert (softmax == "unified") == (results["cluster"][1] > 0)
    assert (results["cluster"][0] - results["kernel"][0]).abs().max().item() < 2e-2


def test_decode_plan_combines_in_a_cluster_where_it_can():
    att = _att()
    q, k, v, past = make_inputs(8, 32, 8, 1, 8192, 128, torch.float16)  # 64 units: 2 splits
    assert att.plan(q, k, v, past) == ("decode", 2)
    assert att.decode_combines_in_cluster(q, k, v, past) == _hopper()
    assert not att.decode_combines_in_cluster(q, k, v, past, decode_combine="kernel")
    assert not att.decode_combines_in_cluster(q, k, v, past, num_splits=16)  # more than a cluster of 8
    # B=1, 32 heads, L=1K: 4 splits by the rule; where 32 clusters of 4 do not fit at once (the H200), 3 in clusters.
    q, k, v, past = make_inputs(1, 32, 32, 1, 1024, 128, torch.float16)
    _, splits = att.plan(q, k, v, past)
    assert splits in (3, 4) and att.decode_combines_in_cluster(q, k, v, past) == _hopper()
    if not _hopper():
        assert splits == 4
    out = att.attention(q, k, v, past)
    kr, vr = reference_view(k, v, past, 1)
    check_close(out, q, kr, vr, f"B1 L1K, {splits} splits as planned", scale=128 ** -0.5, past_len=past)
    if _hopper():
        with pytest.raises(att.FdppError, match="2 to 8 decode splits"):
            att.attention(q, k, v, past, num_splits=1, decode_combine="cluster")
    else:
        with pytest.raises(att.FdppError, match="sm_90"):
            att.attention(q, k, v, past, decode_combine="cluster")


def test_decode_grid_sized_for_the_cache_handles_short_sequences():
    """The split count comes from max_kv_len (the cache size in a captured graph); shorter sequences spread over
    the same splits."""
    att = _att()
    q, k, v, past = make_inputs(3, 8, 8, 1, 50, 128, torch.float16, capacity=8192, spread=True)
    out = att.attention(q, k, v, past, kernel="decode", max_kv_len=8192)
    kr, vr = reference_view(k, v, past, 1)
    check_close(out, q, kr, vr, "short sequences in a long cache", scale=128 ** -0.5, past_len=past)


# 128 rows x 32-key steps, 64 rows x 64-key steps, 128 rows on warpgroup MMAs (sm_90: cp.async, TMA)
@pytest.mark.parametrize("dtype,dim,bhk,seq_past,softmax,config", pairwise_params(
    {"dtype": DTYPES, "dim": HEAD_DIMS, "bhk": [(1, 4, 4), (3, 9, 3)],
     "seq_past": [(1000, 0), (97, 0), (300, 200), (129, 4000)], "softmax": SOFTMAXES, "config": [1, 2, 4, 5]},
    valid=lambda c: prefill_shape_built(c["dim"], c["config"]),
    ids={"bhk": _heads_id, "seq_past": lambda sp: "S{}past{}".format(*sp), "config": lambda c: f"cfg{c}"}))
def test_prefill_matches_reference(dtype, dim, bhk, seq_past, softmax, config):
    skip_unless_hopper(config)
    att = _att()
    (batch, heads, kv_heads), (seq, past_len) = bhk, seq_past
    q, k, v, past = make_inputs(batch, heads, kv_heads, seq, past_len + seq, dim, dtype)
    counters = att.Counters()
    out = att.attention(q, k, v, past, kernel="prefill", softmax=softmax, counters=counters, prefill_config=config)
    kr, vr = reference_view(k, v, past, seq)
    check_close(out, q, kr, vr, f"prefill {dtype} d{dim} S{seq} past{past_len} {softmax} cfg{config}",
                scale=dim ** -0.5, past_len=past)
    assert counters.fallback_rows == 0, "unit-scale scores stay inside every row's anchored window"


@pytest.mark.parametrize("dtype,dim,bhk,seq_past,softmax", pairwise_params(
    {"dtype": DTYPES, "dim": [64, 128], "bhk": [(1, 4, 4), (3, 9, 3)],
     "seq_past": [(1000, 0), (97, 0), (300, 200), (129, 4000)], "softmax": SOFTMAXES},
    ids={"bhk": _heads_id, "seq_past": lambda sp: "S{}past{}".format(*sp)}))
def test_prefill_tma_shape_matches_shape_4(dtype, dim, bhk, seq_past, softmax):
    """Shape 5 runs shape 4's arithmetic in shape 4's order (S, mask, exponentials; O += P V of a tile before the
    next tile's rescale); only the loads (TMA, cp.async for a block's last partial tile) and the schedule differ.
    Lengths vary per sequence, with NaN in the cache past each one: the same fallback counts, and the same bits but
    for a rare last-place difference (the H200, 2026-12-03: 0-4 of 512,000 outputs one unit apart, always in the
    second tile or later; cause open, docs/notes-attention.md)."""
    if not _hopper():
        pytest.skip("prefill_config 4 and 5 are sm_90 (Hopper) wgmma kernels")
    att = _att()
    (batch, heads, kv_heads), (seq, past_len) = bhk, seq_past
    q, k, v, past = make_inputs(batch, heads, kv_heads, seq, past_len + seq, dim, dtype, spread=True)
    outs, fallback_rows = [], []
    for config in HOPPER_CONFIGS:
        counters = att.Counters()
        outs.append(att.attention(q, k, v, past, kernel="prefill", softmax=softmax, counters=counters,
                                  prefill_config=config))
        fallback_rows.append(counters.fallback_rows)
    assert torch.isfinite(outs[1]).all()
    assert fallback_rows[0] == fallback_rows[1]
    differ = outs[0] != outs[1]
    assert int(differ.sum()) <= max(4, differ.numel() // 100_000), f"{int(differ.sum())} outputs differ"
    ulp = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[dtype]  # one unit at the element's magnitude
    gap = (outs[1].float() - outs[0].float()).abs()
    assert (gap <= ulp * outs[0].float().abs().clamp_min(2.0 ** -14)).all(), f"max |cfg5 - cfg4| = {gap.max()}"


def test_prefill_tma_shape_refuses_padded_head_dims():
    """80 and 96 (zero-filled inside the 128 kernel) gave non-finite rows from NaN-padded caches in shape 5 on the
    H200: it refuses them in one line, and the plan never picks it."""
    if not _hopper():
        pytest.skip("prefill_config 5 is an sm_90 (Hopper) wgmma kernel")
    from fdpp_rewrite.errors import FdppError

    att = _att()
    q, k, v, past = make_inputs(1, 4, 4, 64, 64, 80, torch.float16)
    with pytest.raises(FdppError, match="prefill_config 5 is not built for head_dim 80"):
        att.attention(q, k, v, past, kernel="prefill", prefill_config=5)


@pytest.mark.parametrize("config", HOPPER_CONFIGS)
@pytest.mark.parametrize("softmax", SOFTMAXES)
def test_prefill_wgmma_smoke(softmax, config):
    """The first check of the sm_90 kernels (scripts/device_job.sh runs it alone before anything else): one block
    of 128 rows and a ragged second one, against the reference. Off sm_90 the forced tile shape is an error, never
    another shape's result."""
    att = _att()
    q, k, v, past = make_inputs(1, 2, 2, 200, 200, 128, torch.float16)
    if not _hopper():
        with pytest.raises(att.FdppError, match="unsupported|not supported"):
            att.attention(q, k, v, past, kernel="prefill", softmax=softmax, prefill_config=config)
        return
    out = att.attention(q, k, v, past, kernel="prefill", softmax=softmax, prefill_config=config)
    kr, vr = reference_view(k, v, past, 200)
    check_close(out, q, kr, vr, f"wgmma smoke {softmax} cfg{config}", scale=128 ** -0.5, past_len=past)


@pytest.mark.parametrize("config", [0, 1, 2, 4, 5])
def test_prefill_grid_of_about_two_waves(config):
    """32 heads x 9 query blocks = 288 CTAs (128 rows; 576 at 64): the second wave runs in reverse (light-first)
    work order."""
    skip_unless_hopper(config)
    att = _att()
    q, k, v, past = make_inputs(1, 32, 32, 1100, 1100, 128, torch.float16)
    out = att.attention(q, k, v, past, kernel="prefill", prefill_config=config)
    kr, vr = reference_view(k, v, past, 1100)
    check_close(out, q, kr, vr, f"prefill 1100 rows cfg{config}", scale=128 ** -0.5, past_len=past)


@pytest.mark.parametrize("config", [1, 2, 4, 5])
def test_prefill_rows_with_nothing_visible_output_zero_in_every_tile_shape(config):
    """A bias mask that hides every key from some rows: those rows output exactly 0 (never NaN) in every tile
    shape, and the other rows still match the reference."""
    skip_unless_hopper(config)
    att = _att()
    q, k, v, past = make_inputs(1, 4, 4, 200, 200, 128, torch.float16)
    bias = torch.zeros(1, 1, 200, 200, device="cuda", dtype=torch.float16)
    bias[..., 70:140, :] = float("-inf")
    out = att.attention(q, k, v, bias=bias, mask_mode="bias", kernel="prefill", prefill_config=config)
    assert not torch.isnan(out).any()
    assert (out[:, :, 70:140] == 0).all()
    scores = (q.float() @ k.float().transpose(-1, -2)) * 128 ** -0.5 + bias.float()
    keep = torch.ones(200, dtype=torch.bool)
    keep[70:140] = False
    expected = torch.softmax(scores[:, :, keep], dim=-1) @ v.float()
    assert (out[:, :, keep].float() - expected).abs().max().item() < 2e-2


@pytest.mark.parametrize("config", [3, 6])  # 3, the rolled 128-row shape, is gone; 6 was never built
def test_prefill_rejects_an_unknown_tile_shape(config):
    from fdpp_rewrite.errors import FdppError

    att = _att()
    q, k, v, past = make_inputs(1, 4, 4, 64, 64, 128, torch.float16)
    with pytest.raises(FdppError, match="prefill_config"):
        att.attention(q, k, v, past, kernel="prefill", prefill_config=config)


@pytest.mark.parametrize("dim", [64, 128])
def test_rowwise_float32_matches_reference(dim):
    att = _att()
    q, k, v, past = make_inputs(2, 6, 3, 4, 333, dim, torch.float32, spread=True)
    out = att.attention(q, k, v, past)  # float32 -> rowwise
    kr, vr = reference_view(k, v, past, 4)
    check_close(out, q, kr, vr, "rowwise float32", scale=dim ** -0.5, past_len=past)


@pytest.mark.parametrize("kernel", ["decode", "prefill", "rowwise"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_mask_with_fully_masked_rows(dtype, kernel):
    """Additive bias with finite values, -inf, and the -10000 threshold; some rows fully masked: they give 0."""
    att = _att()
    seq = 3 if kernel == "decode" else 70
    q, k, v, _ = make_inputs(2, 4, 2, seq, 300, 128, dtype)
    bias = torch.randn(2, 1, seq, 300, device="cuda").to(dtype)
    bias[:, :, :, 250:] = float("-inf")
    bias[:, :, :, 100:110] = -10000.0
    bias[1, 0, 1, :] = float("-inf")  # one fully masked row in every head of sequence 1
    out = att.attention(q, k, v, bias=bias, mask_mode="bias", kernel=kernel)
    check_close(out, q, k, v, f"bias {kernel}", scale=128 ** -0.5, mask_mode="bias", bias=bias)
    assert out[1, :, 1].abs().max().item() == 0.0


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_mask_mode_none_sees_every_key(kernel):
    att = _att()
    seq = 2 if kernel == "decode" else 40
    q, k, v, _ = make_inputs(2, 8, 4, seq, 500, 64, torch.float16)
    out = att.attention(q, k, v, mask_mode="none", kernel=kernel)
    check_close(out, q, k, v, f"none {kernel}", scale=64 ** -0.5, mask_mode="none")


@pytest.mark.parametrize("dtype,path,softmax", pairwise_params(
    {"dtype": DTYPES, "path": [("decode", 1, 0), ("decode", 1, 1), ("decode", 4, 0), ("prefill", 200, 0)],
     "softmax": SOFTMAXES}, ids={"path": lambda p: "{}-S{}-splits{}".format(*p)}))
def test_adversarial_scores_stay_exact(dtype, path, softmax):
    """Scores up to +-1e4, rows mixing in-range and far-out-of-range tiles: never NaN/Inf, always within
    tolerance; the unified kernels send exactly the out-of-window rows to the fallback."""
    att = _att()
    kernel, seq, splits = path
    q, k, v, past, kr, vr = adversarial_inputs(seq, dtype)
    configs = (0,)
    if kernel == "prefill":  # every tile shape
        configs = (1, 2, *HOPPER_CONFIGS) if torch.cuda.get_device_capability()[0] == 9 else (1, 2)
    for scale, config in ((s, c) for s in (128 ** -0.5, 30.0) for c in configs):  # 30: ordinary scores ~ +-1e4
        counters = att.Counters()
        out = att.attention(q, k, v, past, kernel=kernel, softmax=softmax, scale=scale, num_splits=splits,
                            counters=counters, prefill_config=config)
        check_close(out, q, kr, vr, f"adversarial {kernel} {softmax} scale={scale} cfg{config}", scale=scale,
                    past_len=past)
        if softmax == "unified":
            assert counters.fallback_rows > 0
        else:
            assert counters.fallback_rows == 0


@pytest.mark.parametrize("num_splits", [0, 1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_low_side_flags_only_rows_that_can_lose_precision(dtype, num_splits):
    """The low guard (contract low_guard_tail): one -3000 score, or half a row underflowing under a max above
    guard_lo + tail, stays on the fast path and exact; a row whose max is below guard_lo + tail falls back.
    Split over the keys, the rule applies per split (a split does not see the row's max): head 1's first half,
    a split of its own whose max is -110, then falls back too; still exact, and never fewer rows."""
    from fdpp_rewrite.ref_ops import low_guard_tail

    att = _att()
    lo, tail, length = -60.0, low_guard_tail(), 4096
    q = torch.zeros(2, 4, 1, 64, device="cuda", dtype=dtype)
    q[..., 0] = 1.0  # with scale 1, s[j] = k[j, 0] exactly
    k = torch.zeros(2, 4, length, 64, device="cuda")
    k[:, 0, :, 0] = torch.randn(2, length, device="cuda") * 2 - 4
    k[:, 0, 123, 0] = -3000.0
    k[:, 1, :, 0] = torch.randn(2, length, device="cuda") + lo + tail + 4
    k[:, 1, : length // 2, 0] = -110.0  # underflows e^x in float32: lost, and negligible against the max
    k[:, 2, :, 0] = -140.0  # every term underflows: must fall back
    k[:, 3, :, 0] = lo - 30.0
    k[:, 3, 77, 0] = lo + tail - 0.5  # max just under guard_lo + tail: falls back
    k = k.to(dtype)
    v = torch.randn(2, 4, length, 64, device="cuda").to(dtype)
    past = torch.full((2,), length - 1, dtype=torch.int64, device="cuda")
    counters = att.Counters()
    out = att.attention(q, k, v, past, kernel="decode", scale=1.0, phi=0.0, guard_lo=lo, guard_hi=10.0,
                        num_splits=num_splits, counters=counters)
    check_close(out, q, k, v, f"low guard {dtype} splits={num_splits}", scale=1.0, past_len=past)
    contract_rows = 2 * 2  # heads 2 and 3 of both sequences
    per_split_rows = contract_rows + 2  # and head 1 of both, whose all -110 first half is a split of its own
    expected = {1: {contract_rows}, 4: {per_split_rows}}.get(num_splits, {contract_rows, per_split_rows})
    assert counters.fallback_rows in expected


@pytest.mark.parametrize("seq,num_splits,combine", pairwise_params(
    {"seq": [1, 3], "num_splits": [0, 1], "combine": ["auto", "kernel"]}))
def test_decode_fallback_counter_counts_rows(seq, num_splits, combine):
    """The decode kernel's unified max is the calibrated phi: rows outside [phi + guard_lo, phi + guard_hi]."""
    att = _att()
    q, k, v, past = make_inputs(2, 6, 3, seq, 400, 128, torch.float16)
    rows = 2 * 6 * seq
    counters = att.Counters()
    kr, vr = reference_view(k, v, past, seq)
    for phi in (-50.0, 75.0):  # every s - phi ~ 50 > guard_hi; then ~ -75 < guard_lo
        counters.reset()
        out = att.attention(q, k, v, past, kernel="decode", phi=phi, num_splits=num_splits, counters=counters,
                            decode_combine=combine)
        check_close(out, q, kr, vr, f"decode phi={phi} splits={num_splits}", scale=128 ** -0.5, past_len=past)
        assert counters.fallback_rows == rows
    counters.reset()
    att.attention(q, k, v, past, kernel="decode", phi=60.0, guard_lo=-80.0, num_splits=num_splits, counters=counters)
    att.attention(q, k, v, past, kernel="decode", phi=2.0, num_splits=num_splits, counters=counters)
    assert counters.fallback_rows == 0


def test_prefill_fallback_counts_rows_beyond_their_anchor():
    """The prefill kernel anchors each row's unified max on its first tiles (diagonal ones and tile 0): phi does
    not matter; a key elsewhere scoring far above a row's anchor sends that row to the fallback."""
    import math

    from fdpp_rewrite.calibration.prefill import anchored_prefill_fallbacks

    att = _att()
    seq, heads = 600, 2
    q, k, v, past = make_inputs(1, heads, heads, seq, seq, 128, torch.float16)
    counters = att.Counters()
    for phi in (-50.0, 0.0, 50.0):
        att.attention(q, k, v, past, kernel="prefill", phi=phi, counters=counters)
    assert counters.fallback_rows == 0
    # Key 200 of head 0 aligned with query 590, whose block (512..599) anchors on keys 0..63 and 448..599.
    k[0, 0, 200] = q[0, 0, 590] * 4
    counters.reset()
    # The simulation models 128-row blocks (tile shape 1); the guard_hi of 11 is the simulation's.
    out = att.attention(q, k, v, past, kernel="prefill", guard_hi=11.0, counters=counters, prefill_config=1)
    check_close(out, q, k, v, "prefill spike", scale=128 ** -0.5, past_len=past)
    if torch.cuda.get_device_capability()[0] == 9:  # the wgmma kernels: the same 128-row blocks and anchors
        for config in HOPPER_CONFIGS:
            hopper = att.Counters()
            out4 = att.attention(q, k, v, past, kernel="prefill", guard_hi=11.0, counters=hopper,
                                 prefill_config=config)
            check_close(out4, q, k, v, f"prefill spike, wgmma cfg{config}", scale=128 ** -0.5, past_len=past)
            assert hopper.fallback_rows == counters.fallback_rows, f"cfg{config}"
    scores = (q[:, :1].float() @ k[:, :1].float().transpose(-1, -2)) * 128 ** -0.5
    scores = scores.masked_fill(torch.ones(seq, seq, device="cuda").triu(1).bool(), -math.inf).cpu()
    expected = anchored_prefill_fallbacks(scores)  # the same rule, simulated on the CPU
    assert expected >= 1
    assert abs(counters.fallback_rows - expected) <= 1
    # 64-row blocks anchor every row on at least the keys a 128-row block does (the same 3 diagonal tiles end at
    # or after the row's 128-row block start - 64), so they never flag more rows; row 590 still falls back.
    counters.reset()
    out = att.attention(q, k, v, past, kernel="prefill", guard_hi=11.0, counters=counters, prefill_config=2)
    check_close(out, q, k, v, "prefill spike, 64-row blocks", scale=128 ** -0.5, past_len=past)
    assert 1 <= counters.fallback_rows <= expected + 1


def test_unified_equals_synchronized():
    att = _att()
    q, k, v, past = make_inputs(4, 32, 8, 1, 3000, 128, torch.float16, spread=True)
    a = att.attention(q, k, v, past, softmax="unified").float()
    b = att.attention(q, k, v, past, softmax="synchronized").float()
    assert (a - b).abs().max().item() < 4e-3


def test_library_counters_when_none_passed():
    att = _att()
    att.read_library_counters(reset=True)
    q, k, v, past = make_inputs(1, 4, 4, 1, 100, 64, torch.float16)
    att.attention(q, k, v, past, phi=-50.0)
    fallback, clamped = att.read_library_counters(reset=True)
    assert (fallback, clamped) == (4, 0)


def test_kv_length_beyond_the_cache_is_clamped_and_counted_on_device():
    att = _att()
    q, k, v, past = make_inputs(2, 4, 4, 1, 64, 64, torch.float16)
    past_bad = torch.tensor([63, 500], dtype=torch.int64, device="cuda")  # sequence 1 overruns the 64-row cache
    counters = att.Counters()
    out = att.attention(q, k, v, past_bad, counters=counters)
    assert torch.isfinite(out).all()
    assert counters.clamped_rows == 4


def test_cuda_graph_capture_and_replay():
    """rope_append + decode attention captured once, replayed after the inputs change in place."""
    att = _att()
    batch, heads, kv_heads, dim, cap = 2, 8, 2, 128, 1024
    q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=torch.float16)
    k_new = torch.randn(batch, kv_heads, 1, dim, device="cuda", dtype=torch.float16)
    v_new = torch.randn_like(k_new)
    k_cache = torch.randn(batch, kv_heads, cap, dim, device="cuda", dtype=torch.float16)
    v_cache = torch.randn_like(k_cache)
    past = torch.tensor([100, 700], dtype=torch.int64, device="cuda")
    q_rot = torch.empty_like(q)
    out = torch.empty_like(q)
    counters = att.Counters()
    probe = att.attention(q, k_cache, v_cache, past, max_kv_len=cap)  # sizes the workspace; warms up
    workspace = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            att.rope_append(q, k_new, v_new, k_cache, v_cache, past, q_out=q_rot, counters=counters)
            att.attention(q_rot, k_cache, v_cache, past, out=out, workspace=workspace, max_kv_len=cap,
                          counters=counters)
    torch.cuda.current_stream().wait_stream(stream)
    del probe
    for step in range(3):
        q.copy_(torch.randn_like(q))
        k_new.copy_(torch.randn_like(k_new))
        v_new.copy_(torch.randn_like(v_new))
        past += 1
        graph.replay()
        torch.cuda.synchronize()
        expected_q = q.clone()
        kc, vc = k_cache.clone(), v_cache.clone()
        att.rope_append(expected_q, k_new, v_new, kc, vc, past)
        expected = att.attention(expected_q, kc, vc, past)
        assert torch.equal(q_rot, expected_q), f"replay {step}: rotated q differs"
        assert torch.equal(out, expected), f"replay {step}: attention differs from eager"
    assert counters.fallback_rows == 0


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_append_matches_torch(dtype, interleaved):
    att = _att()
    batch, heads, kv_heads, seq, dim, cap, theta = 3, 8, 2, 4, 64, 40, 10000.0
    q = torch.randn(batch, heads, seq, dim, device="cuda").to(dtype)
    k_new = torch.randn(batch, kv_heads, seq, dim, device="cuda").to(dtype)
    v_new = torch.randn_like(k_new)
    k_cache = torch.zeros(batch, kv_heads, cap, dim, device="cuda", dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    past = torch.tensor([0, 17, 38], dtype=torch.int64, device="cuda")  # tokens 40, 41 of the last overflow
    counters = att.Counters()
    q_out = att.rope_append(q.clone(), k_new, v_new, k_cache, v_cache, past, rope_theta=theta,
                            interleaved=interleaved, counters=counters)

    def rotate(x, positions):
        inv = 1.0 / theta ** (torch.arange(0, dim, 2, device="cuda").float() / dim)
        ang = positions.float()[:, None] * inv[None]  # [S, D/2]
        cos, sin = ang.cos(), ang.sin()
        xf = x.float()
        if interleaved:
            x0, x1 = xf[..., 0::2], xf[..., 1::2]
            out = torch.empty_like(xf)
            out[..., 0::2], out[..., 1::2] = x0 * cos - x1 * sin, x1 * cos + x0 * sin
        else:
            x0, x1 = xf[..., : dim // 2], xf[..., dim // 2:]
            out = torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)
        return out

    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    for b in range(batch):
        pos = int(past[b]) + torch.arange(seq, device="cuda")
        torch.testing.assert_close(q_out[b].float(), rotate(q[b], pos), atol=tol, rtol=tol)
        keep = pos < cap
        torch.testing.assert_close(k_cache[b][:, pos[keep]].float(), rotate(k_new[b], pos)[:, keep], atol=tol, rtol=tol)
        assert torch.equal(v_cache[b][:, pos[keep]], v_new[b][:, keep])
    assert counters.clamped_rows == 2 * kv_heads  # tokens at 40 and 41 of sequence 2 do not fit


# --- bad input: a clear error, never a crash ----------------------------------------------------------------------

def test_bad_inputs_raise_clear_errors():
    from fdpp_rewrite.errors import FdppError

    att = _att()
    q, k, v, past = make_inputs(1, 4, 4, 1, 64, 128, torch.float16)
    with pytest.raises(FdppError, match="head_dim 72 is not supported"):  # 72 is no choice of the contract
        att.attention(q[..., :72].contiguous(), k[..., :72].contiguous(), v[..., :72].contiguous(), past)
    with pytest.raises(FdppError, match="float16, bfloat16 or float32"):
        att.attention(q.double(), k.double(), v.double(), past)
    with pytest.raises(FdppError, match="KV cache holds 64"):
        att.attention(q, k, v, torch.tensor([64]))
    with pytest.raises(FdppError, match="not a multiple"):
        att.attention(q[:, :3], k, v, past)
    with pytest.raises(FdppError, match=r"max_kv_len 65 is outside \[1, 64\] \(the KV cache length\)"):
        att.attention(q, k, v, past, max_kv_len=65)
    storage = torch.zeros(q.numel() + 1, dtype=torch.float16, device="cuda")
    misaligned = storage[1:].view(q.shape)
    with pytest.raises(FdppError, match="16-byte aligned"):
        att.attention(misaligned, k, v, past)
    with pytest.raises(FdppError, match="bfloat16 but query is torch.float16|is torch.bfloat16"):
        att.attention(q, k.bfloat16(), v, past)


def test_c_abi_rejects_bad_arguments_without_crashing():
    import ctypes

    att = _att()
    lib = att.library()
    q, k, v, past = make_inputs(1, 4, 4, 1, 64, 128, torch.float16)
    out = torch.empty_like(q)
    args = att._args(q, k, v, out, past, None, **att._defaults({}))
    args.kv_capacity = 64
    args.max_kv_len = 100
    assert lib.fdpp_attention_forward(ctypes.byref(args), None, 0, None) == 1
    assert b"max_kv_len 100 is outside [1, 64] (the KV cache length)" in lib.fdpp_last_error()
    args.max_kv_len = 0
    args.head_dim = 72
    assert lib.fdpp_attention_forward(ctypes.byref(args), None, 0, None) == 2
    args.head_dim = 128
    args.dtype = 7
    assert lib.fdpp_attention_forward(ctypes.byref(args), None, 0, None) == 1
    args.dtype = 0
    args.key = k.data_ptr() + 2
    assert lib.fdpp_attention_forward(ctypes.byref(args), None, 0, None) == 1
    assert b"16-byte aligned" in lib.fdpp_last_error()
    args.key = k.data_ptr()
    assert lib.fdpp_attention_forward(ctypes.byref(args), None, 0, None) == 1  # decode needs its workspace
    assert b"workspace" in lib.fdpp_last_error()


# --- programmatic dependent launch: a decode call that consumes the previous call's output -------------------------
# On sm_90 the decode split grid is launched programmatically: it may become resident while the kernel before it is
# still running and must read nothing that kernel writes before its griddepcontrol.wait. Call 1 is long and has few
# CTAs (the GPU has room for call 2's grid at once); what call 2 consumes is NaN until call 1 writes it, so a read
# before the wait shows as a non-finite output or a mismatch against the reference and the eager run.

# (call 1, call 2): the direct write or 4 splits on each side, combined in a cluster (sm_90), by the combine kernel
# or by the last split CTA to finish (the two calls share one counters buffer)
CHAIN_SPLITS = [(1, 1), (1, 4), (4, 1), (4, 4), (1, "4k"), ("4k", 1), ("4k", "4k")] + [
    pytest.param(pair, id="-".join(map(str, pair)) + "-last_block")
    for pair in (("4b", "4b"), (1, "4b"), ("4b", 1), ("4b", "4k"), ("4k", "4b"), (4, "4b"))]
CHAIN_COUNTERS = 64  # combine counters for any chain call here (batch 2 x 2 KV heads x 1 row block = 4)


def _grid(splits, combine_counters=None):
    """Decode options for a chain side: a split count (combined as the plan chooses: in a cluster on sm_90),
    "<n>k" for n splits through the combine kernel, or "<n>b" for n splits combined by the last of them to finish
    (counted in combine_counters)."""
    if isinstance(splits, str):
        combine = {"k": "kernel", "b": "last_block"}[splits[-1]]
        options = dict(num_splits=int(splits[:-1]), decode_combine=combine)
        if combine == "last_block":
            options["combine_counters"] = combine_counters
        return options
    return dict(num_splits=splits)


def _zeroed_counters(size):
    return torch.zeros(size, dtype=torch.int32, device="cuda")


def _assert_zeroed(combine_counters, what):
    assert not combine_counters.any().item(), f"{what}: the call left its combine counters non-zero"


def _chain_randn(step, *shape, scale=1.0):
    """Inputs from a CPU generator: the same values in every call (the PDL opt-out test compares two chains)."""
    gen = torch.Generator().manual_seed(1000 + step)
    return (torch.randn(*shape, generator=gen) * scale).to(device="cuda", dtype=torch.float16)


def _query_chain(splits, steps=3, pdl=True):
    """out1 = attention(q1); out2 = attention(out1) in one CUDA graph sharing one workspace, replayed `steps` times
    with a new q1. Returns ([(q1, out1, out2) copied after each replay], (k, v, past))."""
    att = _att()
    batch, heads, kv_heads, dim, kv_len = 2, 8, 2, 128, 16384
    gen = torch.Generator().manual_seed(7)
    k = torch.randn(batch, kv_heads, kv_len, dim, generator=gen).to(device="cuda", dtype=torch.float16)
    v = torch.randn(batch, kv_heads, kv_len, dim, generator=gen).to(device="cuda", dtype=torch.float16)
    k[1, :, kv_len - 7:] = float("nan")  # sequence 1 is 7 keys shorter: its tail must never be read
    v[1, :, kv_len - 7:] = float("nan")
    past = torch.tensor([kv_len - 1, kv_len - 8], dtype=torch.int64, device="cuda")
    q1 = _chain_randn(0, batch, heads, 1, dim, scale=4.0)
    out1, out2 = torch.empty_like(q1), torch.empty_like(q1)
    workspace = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
    counters, combine_counters = att.Counters(), _zeroed_counters(CHAIN_COUNTERS)
    # q1 ~ 4 N(0, 1): scores ~ N(0, 16), so out1 follows a few keys' v (a query that matters for call 2); phi = 14
    # keeps every s - phi inside the default guard window (no fallback: the tiled path is the one tested).
    first = dict(kernel="decode", phi=14.0, max_kv_len=kv_len, counters=counters, pdl=pdl,
                 **_grid(splits[0], combine_counters))
    second = dict(kernel="decode", max_kv_len=kv_len, counters=counters, pdl=pdl, **_grid(splits[1], combine_counters))

    def calls():
        att.attention(q1, k, v, past, out=out1, workspace=workspace, **first)
        att.attention(out1, k, v, past, out=out2, workspace=workspace, **second)

    calls()  # eager once: kernel attributes and the counters' symbol are set up outside the capture
    graph = capture_graph(calls)
    results = []
    for step in range(steps):
        q1.copy_(_chain_randn(step + 1, batch, heads, 1, dim, scale=4.0))
        out1.fill_(float("nan"))
        out2.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        results.append((q1.clone(), out1.clone(), out2.clone()))
        _assert_zeroed(combine_counters, f"chain replay {step}")
    assert counters.fallback_rows == 0
    return results, (k, v, past)


@pytest.mark.parametrize("splits", CHAIN_SPLITS)
def test_decode_chain_query_is_the_previous_calls_output(splits):
    att = _att()
    results, (k, v, past) = _query_chain(splits)
    kr, vr = reference_view(k, v, past, 1)
    for step, (q1, out1, out2) in enumerate(results):
        check_close(out1, q1, kr, vr, f"chain call 1, replay {step}", scale=128 ** -0.5, past_len=past)
        check_close(out2, out1, kr, vr, f"chain call 2 (query = call 1's output), replay {step}",
                    scale=128 ** -0.5, past_len=past)
        eager = att.attention(out1, k, v, past, kernel="decode", max_kv_len=k.shape[2],
                              **_grid(splits[1], _zeroed_counters(CHAIN_COUNTERS)))
        assert torch.equal(out2, eager), f"replay {step}: call 2 in the graph differs from the same call run alone"


@pytest.mark.parametrize("splits", [1, 4, "4k", pytest.param("4b", id="4b-last_block")])
def test_decode_chain_new_key_and_value_are_the_previous_calls_outputs(splits):
    """Calls A and B write their outputs into the K and V caches of call C as its newest key (position p, the one
    row of the cache C sees that was NaN before): a K or V row read before C's wait would be NaN."""
    att = _att()
    batch, kv_heads, heads_c, dim, len_ab, cap_c, p = 2, 2, 8, 128, 16384, 4096, 3000
    gen = torch.Generator().manual_seed(11)
    k_ab = torch.randn(batch, kv_heads, len_ab, dim, generator=gen).to(device="cuda", dtype=torch.float16)
    v_ab = torch.randn(batch, kv_heads, len_ab, dim, generator=gen).to(device="cuda", dtype=torch.float16)
    past_ab = torch.full((batch,), len_ab - 1, dtype=torch.int64, device="cuda")
    k_c = torch.full((batch, kv_heads, cap_c, dim), float("nan"), device="cuda", dtype=torch.float16)
    v_c = torch.full_like(k_c, float("nan"))
    k_c[:, :, :p] = torch.randn(batch, kv_heads, p, dim, generator=gen).to(device="cuda", dtype=torch.float16)
    v_c[:, :, :p] = torch.randn(batch, kv_heads, p, dim, generator=gen).to(device="cuda", dtype=torch.float16)
    past_c = torch.full((batch,), p, dtype=torch.int64, device="cuda")  # keys 0..p visible, p is the new one
    q_a, q_b = _chain_randn(1, batch, kv_heads, 1, dim, scale=4.0), _chain_randn(2, batch, kv_heads, 1, dim, scale=4.0)
    q_c = _chain_randn(3, batch, heads_c, 1, dim)
    out_c = torch.empty_like(q_c)
    workspace = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
    counters, combine_counters = att.Counters(), _zeroed_counters(CHAIN_COUNTERS)
    ab = dict(kernel="decode", phi=14.0, max_kv_len=len_ab, counters=counters, **_grid(splits, combine_counters))

    def calls():
        att.attention(q_a, k_ab, v_ab, past_ab, out=k_c[:, :, p:p + 1], workspace=workspace, **ab)
        att.attention(q_b, k_ab, v_ab, past_ab, out=v_c[:, :, p:p + 1], workspace=workspace, **ab)
        att.attention(q_c, k_c, v_c, past_c, out=out_c, workspace=workspace, kernel="decode", max_kv_len=cap_c,
                      counters=counters, **_grid(splits, combine_counters))

    calls()
    graph = capture_graph(calls)
    for step in range(3):
        q_a.copy_(_chain_randn(10 + step, batch, kv_heads, 1, dim, scale=4.0))
        q_b.copy_(_chain_randn(20 + step, batch, kv_heads, 1, dim, scale=4.0))
        k_c[:, :, p] = float("nan")
        v_c[:, :, p] = float("nan")
        out_c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(k_c[:, :, p]).all() and torch.isfinite(v_c[:, :, p]).all()
        kr, vr = reference_view(k_c, v_c, past_c, 1)
        check_close(out_c, q_c, kr, vr, f"call C after A, B wrote its newest K/V row, replay {step}",
                    scale=128 ** -0.5, past_len=past_c)
        _assert_zeroed(combine_counters, f"replay {step}")
    assert counters.fallback_rows == 0


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_cache_with_interleaved_heads(num_splits):
    """A K cache laid out [B, L, Hkv, D] (seq stride Hkv * D: the split kernel's per-row L2 prefetch) next to a
    contiguous V cache (one prefetch per tile): same result as the reference, nothing past a sequence read."""
    att = _att()
    q, k, v, past = make_inputs(3, 8, 2, 1, 700, 128, torch.float16, capacity=720, spread=True)
    k_interleaved = k.transpose(1, 2).contiguous().transpose(1, 2)  # same values, strides (L*Hkv*D, D, Hkv*D, 1)
    assert k_interleaved.stride(2) == 2 * 128
    out = att.attention(q, k_interleaved, v, past, kernel="decode", num_splits=num_splits)
    kr, vr = reference_view(k, v, past, 1)
    check_close(out, q, kr, vr, f"interleaved K cache, splits={num_splits}", scale=128 ** -0.5, past_len=past)


def test_decode_pdl_opt_out_gives_the_same_bits():
    """pdl=False launches the decode kernels without programmatic dependent launch; the query chain must give
    bit-identical outputs with and without it."""
    splits = (4, 1)
    without, _ = _query_chain(splits, pdl=False)
    with_default, _ = _query_chain(splits)
    for step, (a, b) in enumerate(zip(with_default, without)):
        for name, x, y in zip(("q1", "out1", "out2"), a, b):
            assert torch.equal(x, y), f"replay {step}: {name} differs between pdl on and off"


# --- the last-block combine: the last split CTA of a row block to finish adds the partials (one kernel per call) ---
# python3 -m pytest -q -m gpu tests/plugins/kernels/attention -k last_block

def _counters_for(q, k):
    return _zeroed_counters(_att().combine_counters_size(q, k))


# (batch, query heads, kv heads, seq, splits): MHA, one row per row block; GQA 12/2 with 4 query tokens, two row
# blocks of 16 and 8 rows (padded); GQA 3:1. 7 splits put two partials into some strands, 3 leave one strand empty.
LAST_BLOCK_SHAPES = [(2, 8, 8, 1, 7), (3, 12, 2, 4, 3), (3, 9, 3, 1, 5)]


@pytest.mark.parametrize("dtype,dim,softmax,shape", pairwise_params(
    {"dtype": DTYPES, "dim": [64, 128], "softmax": SOFTMAXES, "shape": LAST_BLOCK_SHAPES},
    ids={"shape": lambda s: "{}x{}/{}-seq{}-splits{}".format(*s)}))
def test_decode_last_block_combine_equals_the_combine_kernel(dtype, dim, softmax, shape):
    """The last CTA adds each row's split partials in the combine kernel's order: the same bits, within the
    reference's tolerance. Lengths differ per sequence and the last one's 40 + seq keys leave most of its splits
    empty (they do not count); the counters are zero after every call, so the second call finds them ready."""
    att = _att()
    batch, heads, kv_heads, seq, splits = shape
    q, k, v, past = make_inputs(batch, heads, kv_heads, seq, 1500, dim, dtype, spread=True)
    past[-1] = 40
    kr, vr = reference_view(k, v, past, seq)
    combine_counters = _counters_for(q, k)
    what = f"{dtype} d{dim} {batch}x{heads}/{kv_heads} seq {seq} {splits} splits {softmax}"
    outs = []
    for combine in ("kernel", "last_block", "last_block"):
        counters = att.Counters()
        out = att.attention(q, k, v, past, kernel="decode", softmax=softmax, num_splits=splits,
                            decode_combine=combine, counters=counters, combine_counters=combine_counters)
        check_close(out, q, kr, vr, f"{combine} combine, {what}", scale=dim ** -0.5, past_len=past)
        assert counters.fallback_rows == 0 and counters.clamped_rows == 0
        _assert_zeroed(combine_counters, what)
        outs.append(out)
    for out in outs[1:]:
        assert torch.equal(out, outs[0]), f"{what}: last-block combine differs from the combine kernel by " \
                                          f"{(out.float() - outs[0].float()).abs().max().item():.3e}"


@pytest.mark.parametrize("dtype,softmax,seq", pairwise_params({"dtype": DTYPES, "softmax": SOFTMAXES, "seq": [1, 4]}))
def test_decode_last_block_combine_recomputes_flagged_rows_exactly(dtype, softmax, seq):
    """Scores up to +-1e4 (test_adversarial_scores_stay_exact's keys): the last CTA recomputes the rows whose guard
    bits any split set, exactly and never NaN, and counts them as the combine kernel does."""
    att = _att()
    q, k, v, past, kr, vr = adversarial_inputs(seq, dtype)
    combine_counters = _counters_for(q, k)
    for scale in (128 ** -0.5, 30.0):  # 30: ordinary scores ~ +-1e4
        fallback_rows = {}
        for combine in ("kernel", "last_block"):
            counters = att.Counters()
            out = att.attention(q, k, v, past, kernel="decode", softmax=softmax, scale=scale, num_splits=4,
                                decode_combine=combine, counters=counters, combine_counters=combine_counters)
            check_close(out, q, kr, vr, f"adversarial, {combine} combine, {softmax} scale={scale} seq {seq}",
                        scale=scale, past_len=past)
            _assert_zeroed(combine_counters, f"adversarial {combine} scale={scale}")
            fallback_rows[combine] = counters.fallback_rows
        assert fallback_rows["last_block"] == fallback_rows["kernel"]
        assert (fallback_rows["last_block"] > 0) == (softmax == "unified")


def test_decode_last_block_rows_with_no_key_output_zero_and_count_as_clamped():
    """A negative past_len leaves sequence 0 no key (kv_len 0: every split empty, none arrives): its first split
    writes the zeros and counts the rows as clamped, as the combine kernel and the one-split write do."""
    att = _att()
    q, k, v, past = make_inputs(2, 12, 2, 2, 700, 128, torch.float16)
    past[0] = -5
    k[0], v[0] = float("nan"), float("nan")  # nothing of sequence 0 may be read
    kr, vr = reference_view(k, v, past, 2)
    combine_counters = _counters_for(q, k)
    for options in (dict(num_splits=4, decode_combine="kernel"), dict(num_splits=4, decode_combine="last_block"),
                    dict(num_splits=1)):
        counters = att.Counters()
        out = att.attention(q, k, v, past, kernel="decode", counters=counters, combine_counters=combine_counters,
                            **options)
        check_close(out, q, kr, vr, f"no key for sequence 0, {options}", scale=128 ** -0.5, past_len=past)
        assert (out[0] == 0).all()
        assert counters.clamped_rows == 12 * 2, options
        _assert_zeroed(combine_counters, str(options))


def test_decode_last_block_combine_in_a_cuda_graph_equals_eager():
    """Captured once, replayed on new queries and longer sequences: the same bits as the eager call, the counters
    zero after each replay."""
    att = _att()
    q, k, v, past = make_inputs(2, 8, 2, 1, 3000, 128, torch.float16, capacity=3100, spread=True)
    k[:, :, 2990:3010] = torch.randn(2, 2, 20, 128, device="cuda").half()  # the rows the replays reach
    v[:, :, 2990:3010] = torch.randn(2, 2, 20, 128, device="cuda").half()
    out = torch.empty_like(q)
    workspace = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
    combine_counters = _counters_for(q, k)
    options = dict(kernel="decode", num_splits=6, decode_combine="last_block", max_kv_len=3100,
                   combine_counters=combine_counters)
    att.attention(q, k, v, past, out=out, workspace=workspace, **options)  # eager once, outside the capture
    graph = capture_graph(lambda: att.attention(q, k, v, past, out=out, workspace=workspace, **options))
    for step in range(3):
        q.copy_(torch.randn_like(q))
        past += 1
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _assert_zeroed(combine_counters, f"replay {step}")
        assert torch.equal(out, att.attention(q, k, v, past, **options)), f"replay {step} differs from eager"
        kr, vr = reference_view(k, v, past, 1)
        check_close(out, q, kr, vr, f"last-block replay {step}", scale=128 ** -0.5, past_len=past)


@pytest.mark.parametrize("kv_len", [8192, 32768])
def test_decode_last_block_plan_is_one_kernel_where_no_cluster_fits(kv_len):
    """The engine's plan (auto with combine counters) at B=1, 32 heads, head_dim 128, L=8K and 32K, 4 splits on the
    H200 whose 32 clusters of 4 do not fit at once: one kernel per call, where without counters the combine kernel
    is a second; the same bits either way."""
    att = _att()
    q, k, v, past = make_inputs(1, 32, 32, 1, kv_len, 128, torch.float16)
    out = torch.empty_like(q)
    workspace = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
    combine_counters = _counters_for(q, k)
    assert combine_counters.numel() == 32  # 1 x 32 KV heads x 1 row block
    _, splits = att.plan(q, k, v, past)
    in_cluster = att.decode_combines_in_cluster(q, k, v, past)
    assert splits > 1

    def call(**options):
        return lambda: att.attention(q, k, v, past, out=out, workspace=workspace, **options)

    call(combine_counters=combine_counters)()  # kernel attributes and occupancy queries, outside the profile
    launched = kernels_launched(call(combine_counters=combine_counters))
    assert len(launched) == 1, launched
    assert "decode_split_kernel" in launched[0]
    _assert_zeroed(combine_counters, "planned call")
    one_kernel = out.clone()
    kr, vr = reference_view(k, v, past, 1)
    check_close(one_kernel, q, kr, vr, f"B1 H32 L{kv_len}, {splits} splits, last-block plan", scale=128 ** -0.5,
                past_len=past)
    without = kernels_launched(call())
    assert len(without) == (1 if in_cluster else 2), without
    if not in_cluster:  # the same splits through the combine kernel
        assert torch.equal(out, one_kernel)
