"""The paged KV cache on the GPU: attention and rope_append through a block table give the same bits as on contiguous
caches holding the same keys. The pools are filled in a random permutation of blocks; the null block 0 and the
spare blocks hold NaN, so a valid row that read one would show it. Decode (every combine), prefill chunks, the
rowwise kernel, the adversarial scores of the exactness tests (the fallback reads through the table too), the cache
append, CUDA-graph replay, and bad input. Grids are pairwise (tests/helpers/pairwise.py).

    python3 -m pytest -q -m gpu tests/plugins/kernels/attention/test_paged_attention.py
"""

import pytest

from attention_reference import adversarial_inputs, check_close, pad_to_blocks, paginate
from gpu_kernels import capture_graph
from pairwise import pairwise_params

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

DTYPES = [torch.float16, torch.bfloat16]
SOFTMAXES = ["unified", "synchronized"]

def _block():
    from fdpp_rewrite.ref_ops import kv_block_size

    return kv_block_size()


BLOCK = _block()  # the contract's kv_block_size: 64


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def _att():
    from fdpp_rewrite.gpu import attention

    return attention


def _hopper():
    return torch.cuda.get_device_capability()[0] == 9


# Per-row kv lengths (cycled over the batch): ending inside a block, and on block boundaries (1 x 64 with a
# one-column table: head_dim 64's 128-key decode tile must not look up the block past the table).
LENGTHS = {"mid": [97, 300, 1, 130, 333, 65, 250, 7], "edge": [64, 256, 128, 64, 192, 320, 128, 64]}


def caches_for(lengths, kv_heads, dim, dtype):
    """Contiguous caches [B, Hkv, L, D] (L: whole blocks for the longest row) holding random keys in each row's
    first lengths[b] positions and NaN after them."""
    capacity = -(-max(lengths) // BLOCK) * BLOCK
    k = torch.full((len(lengths), kv_heads, capacity, dim), float("nan"), device="cuda", dtype=dtype)
    v = torch.full_like(k, float("nan"))
    for b, n in enumerate(lengths):
        k[b, :, :n] = torch.randn(kv_heads, n, dim, device="cuda").to(dtype)
        v[b, :, :n] = torch.randn(kv_heads, n, dim, device="cuda").to(dtype)
    return k, v


def run_both(q, k, v, past, lengths, *, interleaved=False, **options):
    """attention() on the contiguous caches and on their paged copy with the same options and max_kv_len (the
    same grid): (contiguous output, paged output, contiguous counters, paged counters)."""
    att = _att()
    (kp, vp), table = paginate((k, v), lengths, interleaved=interleaved)
    results = []
    for keys, values, paged in ((k, v, {}), (kp, vp, {"block_table": table})):
        counters = att.Counters()
        out = att.attention(q, keys, values, past, max_kv_len=k.shape[2], counters=counters, **paged, **options)
        results.append((out, counters))
    (ref, ref_counters), (out, counters) = results
    return ref, out, ref_counters, counters


def assert_same_bits(ref, out, ref_counters, counters, what):
    assert torch.isfinite(ref).all(), f"{what}: the contiguous output is not finite"
    assert torch.equal(out, ref), f"{what}: paged differs from contiguous by " \
                                  f"{(out.float() - ref.float()).abs().max().item():.3e}"
    assert counters.fallback_rows == ref_counters.fallback_rows, what
    assert counters.clamped_rows == ref_counters.clamped_rows, what


# --- decode -------------------------------------------------------------------------------------------------------

COMBINES = {"direct": dict(num_splits=1), "kernel": dict(num_splits=4, decode_combine="kernel"),
            "cluster": dict(num_splits=4, decode_combine="cluster"),
            "last_block": dict(num_splits=4, decode_combine="last_block"), "plan": {}}


@pytest.mark.parametrize("dtype,dim,heads,batch,lengths,combine,softmax,interleaved", pairwise_params(
    {"dtype": DTYPES, "dim": [64, 128], "heads": [(32, 8), (16, 16)], "batch": [1, 3, 8],
     "lengths": list(LENGTHS), "combine": list(COMBINES), "softmax": SOFTMAXES, "interleaved": [False, True]},
    # a cluster of 4 splits per (row, KV head) must fit one wave of one CTA per SM
    valid=lambda c: c["combine"] != "cluster" or c["batch"] * c["heads"][1] <= 32,
    ids={"heads": lambda h: "{}of{}".format(*h)}))
def test_paged_decode_equals_contiguous(dtype, dim, heads, batch, lengths, combine, softmax, interleaved):
    if combine == "cluster" and not _hopper():
        pytest.skip("the cluster combine runs on sm_90")
    att = _att()
    num_heads, kv_heads = heads
    rows = [LENGTHS[lengths][b % 8] for b in range(batch)]
    k, v = caches_for(rows, kv_heads, dim, dtype)
    q = torch.randn(batch, num_heads, 1, dim, device="cuda").to(dtype)
    past = torch.tensor([n - 1 for n in rows], dtype=torch.int64, device="cuda")
    options = dict(COMBINES[combine])
    if combine == "last_block":  # sized from the key pool's shapes: what an engine asks before it has a table
        pool_shape = torch.empty(1, kv_heads, BLOCK, dim, dtype=dtype, device="cuda")
        options["combine_counters"] = torch.zeros(att.combine_counters_size(q, pool_shape), dtype=torch.int32,
                                                  device="cuda")
    what = f"decode {dtype} d{dim} {num_heads}/{kv_heads} B{batch} {lengths} {combine} {softmax}"
    ref, out, ref_counters, counters = run_both(q, k, v, past, rows, interleaved=interleaved, kernel="decode",
                                                softmax=softmax, **options)
    assert_same_bits(ref, out, ref_counters, counters, what)
    check_close(out, q, torch.nan_to_num(k), torch.nan_to_num(v), what, scale=dim ** -0.5, past_len=past)
    if combine == "last_block":
        assert not options["combine_counters"].any().item(), f"{what}: combine counters left non-zero"


# --- the split kernel's block ids, read ahead of its loads --------------------------------------------------------

def _sms():
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


# (dim, KV heads, row lengths, splits, ring depth): one split streaming >= 32 tiles at one CTA per SM (4 stages),
# more CTAs than SMs (2 stages, batch from the SM count), 3 stages, and 4 splits starting mid-row; lengths ending
# inside a block and on block boundaries (head_dim 64: a last tile whose second block lies past the end).
LONG_SPLITS = {"4stages-d128": (128, 2, [2100, 2047], 1, 4), "4stages-d64": (64, 2, [4200, 4160], 1, 4),
               "2stages": (128, 8, [700, 641, 1000, 64], 1, 2), "3stages-d64": (64, 2, [1000, 1088], 1, 3),
               "4splits": (128, 2, [3000, 2113], 4, 3)}


@pytest.mark.parametrize("case", list(LONG_SPLITS))
@pytest.mark.parametrize("dtype,softmax", [(torch.float16, "unified"), (torch.bfloat16, "synchronized")])
def test_paged_decode_long_splits_equal_contiguous(case, dtype, softmax):
    """Splits of many tiles: each tile's ids are read one tile ahead, through every ring depth."""
    att = _att()
    dim, kv_heads, lengths, splits, stages = LONG_SPLITS[case]
    batch = len(lengths) if stages != 2 else _sms() // kv_heads + 1
    rows = [lengths[b % len(lengths)] for b in range(batch)]
    tiles = -(-max(rows) // (64 if dim >= 80 else 128))
    assert att.decode_stages(batch * kv_heads * splits, _sms(), False, -(-tiles // splits)) == stages, case
    k, v = caches_for(rows, kv_heads, dim, dtype)
    q = torch.randn(batch, 4 * kv_heads, 1, dim, device="cuda").to(dtype)
    past = torch.tensor([n - 1 for n in rows], dtype=torch.int64, device="cuda")
    combine = {"decode_combine": "kernel"} if splits > 1 else {}
    what = f"long split {case} {dtype} {softmax}"
    ref, out, ref_counters, counters = run_both(q, k, v, past, rows, kernel="decode", softmax=softmax,
                                                num_splits=splits, **combine)
    assert_same_bits(ref, out, ref_counters, counters, what)
    check_close(out, q, torch.nan_to_num(k), torch.nan_to_num(v), what, scale=dim ** -0.5, past_len=past)


@pytest.mark.parametrize("dtype,dim,combine", pairwise_params(
    {"dtype": DTYPES, "dim": [64, 128], "combine": ["direct", "kernel", "plan"]}))
def test_paged_decode_shared_blocks_equal_contiguous(dtype, dim, combine):
    """Table entries naming the same pool block: rows 1 and 2 share row 0's first 6 blocks (a common prompt prefix)
    and row 2 names one block twice in a row; the copies they no longer name hold NaN."""
    att = _att()
    rows, prefix = [700, 900, 600], 6
    k, v = caches_for(rows, 2, dim, dtype)
    for cache in (k, v):
        cache[1:, :, :prefix * BLOCK] = cache[0, :, :prefix * BLOCK]
        cache[2, :, 8 * BLOCK:9 * BLOCK] = cache[2, :, 7 * BLOCK:8 * BLOCK]
    (kp, vp), table = paginate((k, v), rows)
    freed = [int(table[r, j]) for r in (1, 2) for j in range(prefix)] + [int(table[2, 8])]
    table[1:, :prefix] = table[0, :prefix]
    table[2, 8] = table[2, 7]
    for pool in (kp, vp):
        pool[freed] = float("nan")
    q = torch.randn(3, 8, 1, dim, device="cuda").to(dtype)
    past = torch.tensor([n - 1 for n in rows], dtype=torch.int64, device="cuda")
    options = dict(COMBINES[combine], kernel="decode", max_kv_len=k.shape[2])
    ref_counters, counters = att.Counters(), att.Counters()
    ref = att.attention(q, k, v, past, counters=ref_counters, **options)
    out = att.attention(q, kp, vp, past, block_table=table, counters=counters, **options)
    what = f"shared blocks {dtype} d{dim} {combine}"
    assert_same_bits(ref, out, ref_counters, counters, what)
    check_close(out, q, torch.nan_to_num(k), torch.nan_to_num(v), what, scale=dim ** -0.5, past_len=past)


# --- prefill chunks (and chunks the plan gives the decode kernel) --------------------------------------------------

@pytest.mark.parametrize("dtype,dim,seq,past0,softmax,kernel", pairwise_params(
    {"dtype": DTYPES, "dim": [64, 128], "seq": [16, 100, 256], "past0": [0, 37, 300], "softmax": SOFTMAXES,
     "kernel": [("prefill", 1), ("prefill", 2), ("prefill", 4), ("prefill", 5), ("auto", 0)]},
    ids={"kernel": lambda k: "{}{}".format(*k)}))
def test_paged_prefill_chunk_equals_contiguous(dtype, dim, seq, past0, softmax, kernel):
    """A chunk of seq tokens after past0 (and a shorter second row): the prefill tile shapes and the plan, whose
    small grids run the decode kernel with several causal query rows."""
    name, config = kernel
    if config in (4, 5) and not _hopper():
        pytest.skip(f"prefill_config {config} is an sm_90 (Hopper) wgmma kernel")
    past = [past0, past0 // 2 + 5]
    rows = [p + seq for p in past]
    k, v = caches_for(rows, 2, dim, dtype)
    q = torch.randn(2, 6, seq, dim, device="cuda").to(dtype)
    past_t = torch.tensor(past, dtype=torch.int64, device="cuda")
    what = f"chunk {dtype} d{dim} S{seq} past {past} {softmax} {name} cfg{config}"
    ref, out, ref_counters, counters = run_both(q, k, v, past_t, rows, kernel=name, prefill_config=config,
                                                softmax=softmax)
    assert_same_bits(ref, out, ref_counters, counters, what)
    check_close(out, q, torch.nan_to_num(k), torch.nan_to_num(v), what, scale=dim ** -0.5, past_len=past_t)


@pytest.mark.parametrize("dtype,dim", [(torch.float32, 64), (torch.float16, 128)])
def test_paged_rowwise_equals_contiguous(dtype, dim):
    """The rowwise kernel (float32, or forced): the exact path's address rule, one lookup per 32 keys."""
    rows = [300, 64, 129]
    k, v = caches_for(rows, 3, dim, dtype)
    q = torch.randn(3, 9, 2, dim, device="cuda").to(dtype)
    past = torch.tensor([n - 2 for n in rows], dtype=torch.int64, device="cuda")
    ref, out, ref_counters, counters = run_both(q, k, v, past, rows, kernel="rowwise")
    assert_same_bits(ref, out, ref_counters, counters, f"rowwise {dtype} d{dim}")


# --- the adversarial scores of test_attention.py: the fallback recomputes through the table --------------------------

@pytest.mark.parametrize("dtype,path,softmax", pairwise_params(
    {"dtype": DTYPES, "path": [("decode", 1, 0), ("decode", 1, 1), ("decode", 4, 0), ("prefill", 200, 0)],
     "softmax": SOFTMAXES}, ids={"path": lambda p: "{}-S{}-splits{}".format(*p)}))
def test_paged_adversarial_scores_give_the_same_bits(dtype, path, softmax):
    """Scores up to +-1e4 (test_adversarial_scores_stay_exact): the same rows fall back, with the same bits."""
    kernel, seq, splits = path
    q, k, v, past, kr, vr = adversarial_inputs(seq, dtype)
    k, v = pad_to_blocks(k), pad_to_blocks(v)
    rows = [int(p) + seq for p in past]
    configs = (0,)
    if kernel == "prefill":  # every tile shape
        configs = (1, 2, 4, 5) if _hopper() else (1, 2)
    for scale, config in ((s, c) for s in (128 ** -0.5, 30.0) for c in configs):
        what = f"adversarial {kernel} {softmax} scale={scale} cfg{config}"
        ref, out, ref_counters, counters = run_both(q, k, v, past, rows, kernel=kernel, softmax=softmax, scale=scale,
                                                    num_splits=splits, prefill_config=config)
        assert_same_bits(ref, out, ref_counters, counters, what)
        check_close(out, q, kr, vr, what, scale=scale, past_len=past)
        assert (counters.fallback_rows > 0) == (softmax == "unified"), what


# --- rope_append ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,dim,seq", pairwise_params({"dtype": DTYPES, "dim": [64, 128], "seq": [1, 70]}))
def test_paged_rope_append_equals_contiguous(dtype, dim, seq):
    """Positions land in table[b][p // 64] row p % 64 (a chunk of 70 crosses blocks); positions past W x 64 are
    dropped and counted as past a contiguous cache; blocks no table entry names (the null block, spares) keep
    their bits."""
    from fdpp_rewrite.ref_ops import gather_pages

    att = _att()
    batch, heads, kv_heads, width = 3, 8, 2, 3
    capacity = width * BLOCK
    past = torch.tensor([0, 63, 150] if seq > 1 else [0, 63, 192], dtype=torch.int64, device="cuda")
    q = torch.randn(batch, heads, seq, dim, device="cuda").to(dtype)
    k_new = torch.randn(batch, kv_heads, seq, dim, device="cuda").to(dtype)
    v_new = torch.randn_like(k_new)
    k_cache = torch.randn(batch, kv_heads, capacity, dim, device="cuda").to(dtype)
    v_cache = torch.randn_like(k_cache)
    (k_pool, v_pool), table = paginate((k_cache, v_cache), [capacity] * batch)
    unnamed = torch.ones(k_pool.shape[0], dtype=torch.bool, device="cuda")
    unnamed[table.flatten().long()] = False
    assert int(unnamed.sum()) == 4  # the null block and 3 spares, NaN-filled
    outs = []
    for keys, values, paged in ((k_cache, v_cache, {}), (k_pool, v_pool, {"block_table": table})):
        counters = att.Counters()
        q_out = att.rope_append(q.clone(), k_new, v_new, keys, values, past, counters=counters, **paged)
        outs.append((q_out, counters.clamped_rows))
    assert torch.equal(outs[1][0], outs[0][0]), "rotated q differs"
    assert outs[1][1] == outs[0][1] == kv_heads * (28 if seq > 1 else 1), "dropped positions counted alike"
    assert torch.equal(gather_pages(k_pool, table.long(), capacity), k_cache)
    assert torch.equal(gather_pages(v_pool, table.long(), capacity), v_cache)
    for pool in (k_pool, v_pool):
        assert pool[unnamed].isnan().all(), "a block outside the table was written"


# --- CUDA graphs ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("combine", ["plan", "last_block"])
def test_paged_cuda_graph_replay_equals_eager(combine):
    """rope_append + decode attention through a table, captured once and replayed while past_len grows; the step
    that crosses into a new block gets its table entry written in place before the replay."""
    att = _att()
    batch, heads, kv_heads, dim, width = 2, 8, 2, 128, 8
    capacity = width * BLOCK
    q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=torch.float16)
    k_new = torch.randn(batch, kv_heads, 1, dim, device="cuda", dtype=torch.float16)
    v_new = torch.randn_like(k_new)
    k = torch.randn(batch, kv_heads, capacity, dim, device="cuda", dtype=torch.float16)
    rows = [61, 200]
    (k_pool, v_pool), table = paginate((k, torch.randn_like(k)), rows, spare_blocks=4)
    spare = next(i for i in range(1, k_pool.shape[0]) if i not in set(table.flatten().tolist()))
    past = torch.tensor([n - 1 for n in rows], dtype=torch.int64, device="cuda")
    options = {}
    if combine == "last_block":
        options = dict(num_splits=4, decode_combine="last_block",
                       combine_counters=torch.zeros(64, dtype=torch.int32, device="cuda"))
    q_rot, out = torch.empty_like(q), torch.empty_like(q)
    workspace = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
    att.attention(q, k_pool, v_pool, past, block_table=table, max_kv_len=capacity, workspace=workspace, **options)

    def step():
        att.rope_append(q, k_new, v_new, k_pool, v_pool, past, q_out=q_rot, block_table=table)
        att.attention(q_rot, k_pool, v_pool, past, block_table=table, max_kv_len=capacity, out=out,
                      workspace=workspace, **options)

    graph = capture_graph(step)
    for step in range(4):
        q.copy_(torch.randn_like(q))
        k_new.copy_(torch.randn_like(k_new))
        v_new.copy_(torch.randn_like(v_new))
        past += 1
        if int(past[0]) == BLOCK:  # row 0's position 64: its second block
            table[0, 1] = spare
        graph.replay()
        torch.cuda.synchronize()
        expected_q = q.clone()
        kp, vp = k_pool.clone(), v_pool.clone()
        att.rope_append(expected_q, k_new, v_new, kp, vp, past, block_table=table)
        expected = att.attention(expected_q, kp, vp, past, block_table=table, max_kv_len=capacity, **options)
        assert torch.equal(q_rot, expected_q), f"replay {step}: rotated q differs"
        assert torch.equal(out, expected), f"replay {step}: attention differs from eager"
        for eager, replayed in ((kp, k_pool), (vp, v_pool)):  # NaN (unused blocks) compares unequal: zero it
            assert torch.equal(eager.nan_to_num(), replayed.nan_to_num()), f"replay {step}: the append differs"
    assert int(table[0, 1]) == spare


# --- bad input ------------------------------------------------------------------------------------------------------

def test_paged_bad_inputs_raise_one_line_errors():
    from fdpp_rewrite.errors import FdppError

    att = _att()
    k, v = caches_for([100, 40], 2, 128, torch.float16)
    (kp, vp), table = paginate((k, v), [100, 40])
    q = torch.randn(2, 4, 1, 128, device="cuda", dtype=torch.float16)
    past = torch.tensor([99, 39], dtype=torch.int64, device="cuda")
    cases = [
        (dict(block_table=table.long(), max_kv_len=128), "block_table must be an int32"),
        (dict(block_table=table.cpu(), max_kv_len=128), "block_table must be an int32"),
        (dict(block_table=table[:1], max_kv_len=128), r"int32 \[2, W\]"),
        (dict(block_table=table), "needs max_kv_len"),
        (dict(block_table=table, max_kv_len=128, mask_mode="none"), "needs mask_mode 'past_len'"),
        (dict(block_table=table, max_kv_len=129), "above the block table's 128 keys"),
    ]
    for options, message in cases:
        with pytest.raises(FdppError, match=message) as info:
            att.attention(q, kp, vp, past, **options)
        assert "\n" not in str(info.value)
    with pytest.raises(FdppError, match=r"\[blocks, kv_heads, 64, 128\]"):
        att.attention(q, kp[:, :, :32], vp[:, :, :32], past, block_table=table, max_kv_len=128)
    with pytest.raises(FdppError, match="block_table must be an int32"):
        att.rope_append(q, q[:, :2], q[:, :2], kp, vp, past, block_table=table.long())
