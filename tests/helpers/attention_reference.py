"""References for the attention GPU tests: float32 math (the truth) and the same math in the input dtype with
torch's own ops (whose error sets the tolerance, as in the flash-attention tests)."""

import torch

BIAS_MASK_THRESHOLD = -10000.0  # plugins/AsyncSoftmaxAttentionPlugin/contract.json: bias_mask_threshold


def visible_mask(batch, seq, kv_len, *, mask_mode, past_len=None, bias=None, device="cuda"):
    """Boolean [B, 1, S, L]: key j visible to query i."""
    if mask_mode == "none":
        return torch.ones(batch, 1, seq, kv_len, dtype=torch.bool, device=device)
    if mask_mode == "past_len":
        last = past_len.to(device).view(batch, 1) + torch.arange(seq, device=device).view(1, seq)  # [B, S]
        keys = torch.arange(kv_len, device=device).view(1, 1, kv_len)
        return (keys <= last[:, :, None])[:, None]
    return bias.expand(batch, 1, seq, kv_len) > BIAS_MASK_THRESHOLD


def attention_reference(q, k, v, *, scale, mask_mode="past_len", past_len=None, bias=None, dtype=torch.float32):
    """softmax(scale q k^T + bias, masked) v computed in `dtype`; rows with no visible key give 0."""
    batch, heads, seq, _ = q.shape
    group = heads // k.shape[1]
    qf, kf, vf = (t.to(dtype) for t in (q, k, v))
    kf = kf.repeat_interleave(group, dim=1)
    vf = vf.repeat_interleave(group, dim=1)
    scores = (qf @ kf.transpose(-1, -2)) * scale
    visible = visible_mask(batch, seq, k.shape[2], mask_mode=mask_mode, past_len=past_len, bias=bias,
                           device=q.device)
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
