"""References for the attention GPU tests: float32 math (the truth) and the same math in the input dtype with
torch's own ops (whose error sets the tolerance, as in the flash-attention tests); the inputs the tests share."""

import pytest
import torch

BIAS_MASK_THRESHOLD = -10000.0  # plugins/AsyncSoftmaxAttentionPlugin/contract.json: bias_mask_threshold


@pytest.fixture(autouse=True)
def exact_fp32_matmul():
    """Imported by the attention GPU test modules: float32 references without TF32, and seeded inputs."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)


def attention_api():
    """fdpp_rewrite.gpu.attention, imported inside a test (it loads the plugin library)."""
    from fdpp_rewrite.gpu import attention

    return attention


def prefill_shape_built(dim, config, softcap=0.0, window=0):
    """The prefill tile shapes built for a case (attention_params.h, prefill_shape_takes): head_dim 256 only the
    64-row shape 2; the 128-row shape 1 no soft cap, window or zero-filled dims (80, 96); shape 5 no 80, 96."""
    if dim == 256:
        return config in (0, 2)
    if config == 1:
        return softcap == 0.0 and window == 0 and dim in (64, 128)
    if config == 5:
        return dim in (64, 128)
    return True


def visible_mask(batch, seq, kv_len, *, mask_mode, past_len=None, bias=None, device="cuda", window=0):
    """Boolean [B, 1, S, L]: key j visible to query i (window > 0: also (past_len + i) - j < window)."""
    if mask_mode == "none":
        return torch.ones(batch, 1, seq, kv_len, dtype=torch.bool, device=device)
    if mask_mode == "past_len":
        last = past_len.to(device).view(batch, 1) + torch.arange(seq, device=device).view(1, seq)  # [B, S]
        keys = torch.arange(kv_len, device=device).view(1, 1, kv_len)
        visible = keys <= last[:, :, None]
        if window:
            visible &= last[:, :, None] - keys < window
        return visible[:, None]
    return bias.expand(batch, 1, seq, kv_len) > BIAS_MASK_THRESHOLD


def attention_reference(q, k, v, *, scale, mask_mode="past_len", past_len=None, bias=None, dtype=torch.float32,
                        softcap=0.0, window=0):
    """softmax(scale q k^T (soft-capped: softcap * tanh(. / softcap)) + bias, masked) v computed in `dtype`; rows with
    no visible key give 0."""
    batch, heads, seq, _ = q.shape
    group = heads // k.shape[1]
    qf, kf, vf = (t.to(dtype) for t in (q, k, v))
    kf = kf.repeat_interleave(group, dim=1)
    vf = vf.repeat_interleave(group, dim=1)
    scores = (qf @ kf.transpose(-1, -2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    visible = visible_mask(batch, seq, k.shape[2], mask_mode=mask_mode, past_len=past_len, bias=bias,
                           device=q.device, window=window)
    if bias is not None:
        scores = scores + bias.to(dtype)
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(dtype)
    probs = torch.nan_to_num(probs, nan=0.0)  # fully masked rows
    return (probs @ vf).float()


def check_close(out, q, k, v, what, **kw):
    """|out - fp32 ref| <= 2 |torch-in-dtype - fp32 ref| + one ulp of the output's scale. Returns the errors."""
    ref = attention_reference(q, k, v, dtype=torch.float32, **kw)
    low = attention_reference(q, k, v, dtype=q.dtype, **kw)
    assert torch.isfinite(out).all(), f"{what}: {int((~torch.isfinite(out)).sum())} non-finite outputs"
    err = (out.float() - ref).abs().max().item()
    torch_err = (low - ref).abs().max().item()
    # one unit in the last place of the output's scale (float32: a few, for the kernels' exp2 and summation order
    # where torch's float32 "error" is 0 against itself)
    ulp = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 2.0 ** -17}[q.dtype]
    tol = 2 * torch_err + ulp * max(ref.abs().max().item(), 1e-3)
    if err > tol:
        worst = (out.float() - ref).abs().flatten().argmax().item()
        raise AssertionError(f"{what}: max error {err:.3e} > tolerance {tol:.3e} (torch's own {q.dtype} error "
                             f"{torch_err:.3e}); worst element {worst} of shape {tuple(out.shape)}")
    return err, torch_err


def make_inputs(batch, heads, kv_heads, seq, kv_len, dim, dtype, *, capacity=None, q_scale=1.0, spread=False):
    """q [B, Hq, S, D] and caches [B, Hkv, capacity, D] whose first past_len[b] + S rows are set; the rest of the
    cache holds NaN so that reading past a sequence's end cannot go unnoticed. past_len varies per sequence."""
    capacity = capacity or kv_len
    q = (torch.randn(batch, heads, seq, dim, device="cuda") * q_scale).to(dtype)
    k = torch.full((batch, kv_heads, capacity, dim), float("nan"), device="cuda", dtype=dtype)
    v = torch.full_like(k, float("nan"))
    past = torch.tensor([max(kv_len - seq - (i * 7 if spread else 0), 0) for i in range(batch)], dtype=torch.int64)
    for b in range(batch):
        n = int(past[b]) + seq
        k[b, :, :n] = torch.randn(kv_heads, n, dim, device="cuda").to(dtype)
        v[b, :, :n] = torch.randn(kv_heads, n, dim, device="cuda").to(dtype)
    return q, k, v, past.cuda()


def in_wide_buffers(*tensors, width=128):
    """Each tensor [..., D] copied into a NaN-filled [..., width] buffer, returned as the view [..., :D] (rows `width`
    elements apart: a multiple of 16 bytes, as the kernels require). A kernel reading a row past head_dim then
    fetches NaN; in a contiguous tensor it would fetch the next row's finite values and go unseen."""
    views = []
    for t in tensors:
        buffer = torch.full((*t.shape[:-1], width), float("nan"), dtype=t.dtype, device=t.device)
        buffer[..., :t.shape[-1]] = t
        views.append(buffer[..., :t.shape[-1]])
    return views


def reference_view(k, v, past, seq):
    """The caches cut to the longest sequence with NaN rows zeroed (the reference masks them anyway)."""
    n = int(past.max()) + seq
    return torch.nan_to_num(k[:, :, :n]), torch.nan_to_num(v[:, :, :n])


def adversarial_inputs(seq, dtype):
    """Inputs (and their reference view) with one tile of huge positive scores for head group 0 and one of huge
    negative scores for group 1: with scale 30, ordinary scores reach +-1e4."""
    q, k, v, past = make_inputs(2, 8, 2, seq, 1500, 128, dtype, spread=True)
    kr, vr = reference_view(k, v, past, seq)
    k[:, 0, 700] = q[:, 0, 0] * 8
    k[:, 1, 900] = -q[:, 4, 0] * 8
    kr[:, 0, 700], kr[:, 1, 900] = k[:, 0, 700], k[:, 1, 900]
    return q, k, v, past, kr, vr


def paginate(caches, lengths, *, seed=0, spare_blocks=3, interleaved=False):
    """Paged copies of contiguous caches [B, Hkv, L, D] (L a multiple of the block size): pools [N, Hkv, 64, D]
    holding positions [64 j, 64 j + 64) of row b in block table[b, j], for the blocks row b's length needs; the
    block ids are a random permutation of 1 .. N - 1, every other table entry is 0 (the null block), and block 0 and
    the spare blocks hold NaN (a kernel reading them for a valid row would show it). The table is int32 [B, W] on
    the GPU, a view of a wider tensor (row stride W + 3). interleaved: the pools are views [N, Hkv, 64, D] of
    [N, 64, Hkv, D] storage (row stride Hkv x D: the per-row L2 prefetch). Returns ([pools], table)."""
    from fdpp_rewrite.ref_ops import kv_block_size

    block = kv_block_size()
    batch, kv_heads, capacity, dim = caches[0].shape
    assert capacity % block == 0, "pad the caches to whole blocks"
    width = capacity // block
    needed = [-(-int(n) // block) for n in lengths]
    used = sum(needed)
    count = 1 + used + spare_blocks
    ids = (torch.randperm(count - 1, generator=torch.Generator().manual_seed(seed))[:used] + 1).tolist()
    parent = torch.zeros(batch, width + 3, dtype=torch.int32)
    pools = []
    for cache in caches:
        shape = (count, block, kv_heads, dim) if interleaved else (count, kv_heads, block, dim)
        pool = torch.full(shape, float("nan"), dtype=cache.dtype, device=cache.device)
        pools.append(pool.transpose(1, 2) if interleaved else pool)
    i = 0
    for b in range(batch):
        for j in range(needed[b]):
            parent[b, j] = ids[i]
            for pool, cache in zip(pools, caches):
                pool[ids[i]] = cache[b, :, j * block:(j + 1) * block]
            i += 1
    return pools, parent.cuda()[:, :width]


def pad_to_blocks(cache):
    """A cache [B, Hkv, L, D] extended with NaN rows to a whole number of KV blocks."""
    from fdpp_rewrite.ref_ops import kv_block_size

    block = kv_block_size()
    batch, kv_heads, length, dim = cache.shape
    padded = torch.full((batch, kv_heads, -(-length // block) * block, dim), float("nan"), dtype=cache.dtype,
                        device=cache.device)
    padded[:, :, :length] = cache
    return padded
