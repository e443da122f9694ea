"""The calibration's picture, like the paper's Figure 5: the distribution of softmax inputs over all layers and,
per layer, the spread of row maxima against the chosen phi."""

from __future__ import annotations

from pathlib import Path

from fdpp_rewrite.calibration.stats import HIST_BINS, HIST_RANGE, LayerStats


def plot_histogram(cal: list[LayerStats], layers: list[dict], model_name: str, path: Path) -> None:
    """Figure 5 style: the distribution of softmax inputs over all layers (log counts) with the range that holds
    99.99% of them, and per layer the spread of row maxima against the chosen phi and its windows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    hist = sum(s.hist for s in cal)
    edges = torch.linspace(HIST_RANGE[0], HIST_RANGE[1], HIST_BINS + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    cdf = torch.cumsum(hist, 0) / hist.sum()
    lo = float(centers[int(torch.searchsorted(cdf, torch.tensor(0.00005)))])
    hi = float(centers[min(int(torch.searchsorted(cdf, torch.tensor(0.99995))), HIST_BINS - 1)])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    ax1.bar(centers.numpy(), hist.numpy(), width=float(edges[1] - edges[0]), color="tab:blue")
    ax1.set_yscale("log")
    ax1.axvspan(lo, hi, color="tab:orange", alpha=0.15, label=f"99.99% of scores in [{lo:.1f}, {hi:.1f}]")
    ax1.set_xlabel("scaled attention score s (softmax input)")
    ax1.set_ylabel("count")
    ax1.set_title(f"{model_name}: softmax inputs, all layers")
    ax1.legend(fontsize=8)
    xs = [entry["layer"] for entry in layers]
    q = [entry["row_max_quantiles"] for entry in layers]
    ax2.fill_between(xs, [v["0.01%"] for v in q], [v["99.99%"] for v in q], alpha=0.25, label="row max, 0.01-99.99%")
    ax2.plot(xs, [v["50%"] for v in q], color="tab:blue", label="row max, median")
    ax2.fill_between(xs, [v["0.01%"] for v in (e["row_min_quantiles"] for e in layers)],
                     [v["0.01%"] for v in q], alpha=0.12, color="tab:gray", label="row min (0.01%) .. row max (0.01%)")
    phis = [entry["phi"] for entry in layers]
    ax2.plot(xs, phis, color="black", marker=".", label="phi (decode's unified max)")
    synchronized = [e["layer"] for e in layers if e.get("softmax") == "synchronized"]
    if synchronized:
        ax2.scatter(synchronized, [e["phi"] for e in layers if e["layer"] in synchronized], color="tab:red",
                    marker="x", zorder=3, label="synchronized (no phi within the budget)")
    ax2.set_xlabel("layer")
    ax2.set_ylabel("score")
    ax2.set_title("row maxima per layer and the unified max phi")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")  # not from the name: it may be a temporary one
    plt.close(fig)
