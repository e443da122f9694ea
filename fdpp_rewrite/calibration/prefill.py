"""Which rows of a prompt the float16 prefill kernel sends to the exact fallback.

The prefill kernel keeps P in float16 and, instead of the calibrated phi, anchors each row's unified max on the
tiles it processes first: the last anchor_tiles - 1 tiles of its query block's key range (the diagonal) and tile 0
(plugins/kernels/attention/attention_common.cuh, PrefillBlock's tile order; attention_softmax_state.cuh,
AnchoredUnifiedSoftmax). A row falls back when its max exceeds that anchor by more than the contract's
fp16_prefill_window guard_hi, the window float16 P can hold.

Only the 128-row anchored kernel (prefill_config 1) can fall back: the library's plan (attention_forward in
plugins/kernels/attention/attention_launch.cu) runs the wgmma kernel on sm_90 and the 64-row blocks elsewhere
(prefill_prefers_synchronized in attention_heuristics.h) with the synchronized softmax, which never falls back. The
count here is the 128-row kernel's, so it bounds what any plan's prefill recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass

from fdpp_rewrite.calibration.settings import OP
from fdpp_rewrite.contracts import load_contract

_WINDOW = load_contract(OP).raw["fp16_prefill_window"]
# The float16 prefill's window above its anchor (the attention contract's fp16_prefill_window).
PREFILL_FP16_HI = float(_WINDOW["guard_hi"])


@dataclass(frozen=True)
class AnchoredTiling:
    block_m: int       # query rows per CTA
    block_n: int       # keys per tile
    anchor_tiles: int  # tiles that anchor a row's max: the diagonal ones and tile 0


# The anchored kernel's tiling, from the attention contract: PrefillTraits<D> (attention_traits.cuh) takes kBlockN and
# kAnchorTiles from the same fields and asserts its 128-row kBlockM equals block_m.
ANCHORED_TILING = AnchoredTiling(*(int(_WINDOW[key]) for key in ("block_m", "block_n", "anchor_tiles")))


def anchored_prefill_fallbacks(s, tiling: AnchoredTiling = ANCHORED_TILING) -> int:
    """Rows of one prompt (scores [B, H, S, L], masked = -inf, past_len 0) whose max exceeds their anchor by more
    than PREFILL_FP16_HI, the anchor being the max over the tiles the prefill kernel processes first."""
    import torch

    seq, total = s.shape[2], 0
    row_max = s.amax(-1)
    for m0 in range(0, seq, tiling.block_m):
        m1 = min(m0 + tiling.block_m, seq)
        tiles = -(-m1 // tiling.block_n)
        if tiles <= tiling.anchor_tiles:
            continue  # every tile runs the synchronized update: nothing can fall back
        first_diag = (tiles - tiling.anchor_tiles + 1) * tiling.block_n
        block = s[:, :, m0:m1]
        anchor = torch.maximum(block[..., :tiling.block_n].amax(-1), block[..., first_diag:].amax(-1))
        total += int((row_max[:, :, m0:m1] > anchor + PREFILL_FP16_HI).sum())
    return total
