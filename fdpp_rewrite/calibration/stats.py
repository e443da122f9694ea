"""Score statistics per layer and what calibrate decides from them: phi, the guard margins and the unified or
synchronized verdict. Pure torch on tensors (CPU-tested); the scores come from calibration/collect.py.

The decode kernel (the paper's unified max) sends a row to the exact fallback unless

    max(s) - phi <= guard_hi   and   (guard_lo <= min(s) - phi  or  max(s) - phi >= guard_lo + low_guard_tail)

(ref_ops.guard_flags). With guard_lo and guard_hi the widest window the contract and the kernel's float32/tf32 P
allow, phi is the value that keeps the most calibration rows inside, centred in the best interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fdpp_rewrite.calibration.prefill import anchored_prefill_fallbacks
from fdpp_rewrite.contracts import attention_guard
from fdpp_rewrite.ref_ops import guard_flags, low_guard_tail

# The widest guard window the attention contract allows, [-80, 60]: e^-80 is still a normal float32, and
# 2^20 keys x e^60 x 65504 stay below float32's max.
GUARD_LO, GUARD_HI = attention_guard().lo_range[0], attention_guard().hi_range[1]
# A layer whose best phi still sends more than this fraction of its calibration rows to the fallback runs the
# synchronized softmax instead (the paper's verdict for OPT-6.7B, whose scores one phi cannot cover).
FALLBACK_BUDGET = 1e-4
# phi ignores up to this fraction of the rarest calibration rows (well under the budget): a few outliers of one
# text must not move it (issue 29).
PHI_IGNORED_FRACTION = 2e-5
HIST_RANGE = (-64.0, 64.0)
HIST_BINS = 512


@dataclass
class LayerStats:
    """Per attention row of one layer: its largest and smallest visible score, and its head; plus a histogram of
    every visible score."""

    row_max: list = field(default_factory=list)
    row_min: list = field(default_factory=list)
    head: list = field(default_factory=list)
    hist: object = None
    below: int = 0  # scores under / over the histogram's range
    above: int = 0
    prefill_fallback: int = 0  # rows the anchored fp16 prefill kernel would recompute (simulated tiling)

    def arrays(self):
        import torch

        return torch.cat(self.row_max).cpu(), torch.cat(self.row_min).cpu(), torch.cat(self.head).cpu()


class ScoreCollector:
    """The score hook of both paths (ReferenceModel's, and the engine's CollectingBackend): scores [B, Hq, S, L]
    (scaled, before the mask), mask [B, 1, S, L], on any device; the statistics stay on it until arrays()."""

    def __init__(self, num_layers: int):
        self.layers = [LayerStats() for _ in range(num_layers)]

    def __call__(self, layer: int, scores, mask) -> None:
        import torch

        stats = self.layers[layer]
        visible = torch.isfinite(mask).expand_as(scores)
        s = scores.float()
        stats.row_max.append(s.masked_fill(~visible, -math.inf).amax(-1).flatten())
        stats.row_min.append(s.masked_fill(~visible, math.inf).amin(-1).flatten())
        heads = torch.arange(s.shape[1], device=s.device).view(1, -1, 1).expand(s.shape[0], -1, s.shape[2])
        stats.head.append(heads.flatten())
        values = s[visible]
        hist = torch.histc(values, bins=HIST_BINS, min=HIST_RANGE[0], max=HIST_RANGE[1])
        hist = hist.cpu()  # 512 counts: plot_histogram reads them on the host
        stats.hist = hist if stats.hist is None else stats.hist + hist
        stats.below += int((values < HIST_RANGE[0]).sum())
        stats.above += int((values > HIST_RANGE[1]).sum())
        stats.prefill_fallback += anchored_prefill_fallbacks(s.masked_fill(~visible, -math.inf))


def fallback_rows(row_max, row_min, phi: float, guard_lo: float, guard_hi: float) -> int:
    """Rows (of a layer's row_max / row_min tensors) the decode kernel's guard sends to the fallback at this phi."""
    return int(guard_flags(row_max, row_min, phi, guard_lo, guard_hi).sum())


def phi_upper_bounds(row_max, row_min, guard_lo: float = GUARD_LO):
    """Per row, the largest phi at which the low side of the guard keeps it (ref_ops.guard_flags): a row is kept
    while its min is within guard_lo of phi, or its max within guard_lo + low_guard_tail."""
    import torch

    return torch.maximum(row_min.double() - guard_lo, row_max.double() - guard_lo - low_guard_tail())


def choose_phi(row_max, row_min, guard_lo: float = GUARD_LO, guard_hi: float = GUARD_HI, step: float = 0.05,
               ignored_fraction: float = PHI_IGNORED_FRACTION) -> float:
    """A phi that keeps all calibration rows but the rarest `ignored_fraction` on the fast path (a row is kept for
    phi in [row_max - guard_hi, phi_upper_bounds]). Among those phi (an interval [A, B]) it takes the one nearest
    the median row max, as the paper's phi sits near the maxima (typical rows then have p near 1), but keeps a
    margin of min(10, (B - A) / 4) from both ends for held-out rows beyond the calibration's. Ignoring the rarest
    rows is what makes phi a quantile, not an extreme: one text's outliers do not move it."""
    import torch

    rmax = torch.sort(row_max.double()).values
    upper = torch.sort(phi_upper_bounds(row_max, row_min, guard_lo)).values
    lo_edge, hi_edge = float(rmax[0]) - guard_hi - 1.0, float(upper[-1]) + 1.0
    candidates = torch.arange(lo_edge, hi_edge + step, step, dtype=torch.float64)
    n = rmax.numel()
    too_high = n - torch.searchsorted(rmax, candidates + guard_hi, right=True)
    too_low = torch.searchsorted(upper, candidates, right=False)
    cost = too_high + too_low  # an upper bound of the rows outside (a row may break both)
    best = max(int(cost.min()), int(ignored_fraction * n))
    best_idx = torch.nonzero(cost <= best).flatten()
    runs = torch.split(best_idx, torch.diff(best_idx, prepend=best_idx[:1] - 1).ne(1).cumsum(0).bincount().tolist())
    longest = max(runs, key=len)
    a, b = float(candidates[longest[0]]), float(candidates[longest[-1]])
    margin = min(10.0, (b - a) / 4)
    target = float(row_max.double().median())
    return round(min(max(target, a + margin), b - margin), 4)


def guard_margins(row_max, row_min, phi: float, guard_lo: float = GUARD_LO, guard_hi: float = GUARD_HI) -> dict:
    """How far the rows' extremes stay inside the guard at phi (nats; negative: some rows fall back): above, the
    window's top minus the largest row max; below, the smallest room any row has before the low side flags it."""
    return {"hi": round(phi + guard_hi - float(row_max.max()), 3),
            "lo": round(float(phi_upper_bounds(row_max, row_min, guard_lo).min()) - phi, 3)}


def layer_verdict(row_max, row_min, phi: float, budget: float = FALLBACK_BUDGET) -> str:
    """"unified" when phi keeps the layer's fallback within the budget, else "synchronized" (no phi covers it)."""
    return "unified" if fallback_rows(row_max, row_min, phi, GUARD_LO, GUARD_HI) <= budget * row_max.numel() \
        else "synchronized"


def summarize_layer(i, cal: LayerStats, held: LayerStats | None, phi: float, budget: float = FALLBACK_BUDGET) -> dict:
    import torch

    rmax, rmin, heads = cal.arrays()
    cal_fallback = fallback_rows(rmax, rmin, phi, GUARD_LO, GUARD_HI)
    entry = {"layer": i, "phi": phi, "guard_lo": GUARD_LO, "guard_hi": GUARD_HI,
             "softmax": layer_verdict(rmax, rmin, phi, budget),
             "calibration_rows": int(rmax.numel()),
             "calibration_fallback_rows_decode": cal_fallback,
             "calibration_fallback_rate_decode": cal_fallback / max(int(rmax.numel()), 1),
             "calibration_fallback_rows_prefill": cal.prefill_fallback}
    q = torch.tensor([0.0001, 0.01, 0.5, 0.99, 0.9999], dtype=torch.float64)
    entry["row_max_quantiles"] = dict(zip(["0.01%", "1%", "50%", "99%", "99.99%"],
                                          [round(v, 3) for v in torch.quantile(rmax.double(), q).tolist()]))
    entry["row_min_quantiles"] = dict(zip(["0.01%", "1%", "50%", "99%", "99.99%"],
                                          [round(v, 3) for v in torch.quantile(rmin.double(), q).tolist()]))
    entry["row_max_median_per_head"] = [round(float(rmax[heads == h].median()), 3) for h in range(int(heads.max()) + 1)]
    if held is not None:
        hmax, hmin, _ = held.arrays()
        entry["heldout_rows"] = int(hmax.numel())
        entry["heldout_fallback_rows_decode"] = fallback_rows(hmax, hmin, phi, GUARD_LO, GUARD_HI)
        entry["heldout_fallback_rate_decode"] = entry["heldout_fallback_rows_decode"] / max(int(hmax.numel()), 1)
        entry["heldout_fallback_rows_prefill"] = held.prefill_fallback
        entry["heldout_guard_margins"] = guard_margins(hmax, hmin, phi)
    return entry
