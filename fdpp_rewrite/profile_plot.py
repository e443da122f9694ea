"""The profiler's plot: Figure 9b of the paper for one profile entry (matplotlib, the `plot` extra)."""

from __future__ import annotations

from pathlib import Path

from fdpp_rewrite.profile_plan import _valid


def plot_entry(entry: dict, path: Path, title: str) -> None:
    """Figure 9b of the paper for one shape: time per implementation against M, with M1 and M2 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, ms = entry["curves"], entry["curves"]["m"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"impla": ("ImplA GEMV (CUDA cores)", "-o"), "implb": ("ImplB flat GEMM (pad 8)", "-s"),
              "cublaslt": ("ImplC cuBLASLt", "-^"), "cutlass": ("ImplC CUTLASS 64x128", "-v"),
              "cublas": ("cuBLAS (torch, peer)", "--")}
    for name, (label, style) in styles.items():
        pts = [(m, t) for m, t in zip(ms, curves.get(f"{name}_us", [])) if _valid(t)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, markersize=3, linewidth=1.2)
    top = ax.get_ylim()[1]
    marks = [(entry["m1"], "M1")] if entry["m1"] != entry["m2"] else []
    marks.append((entry["m2"], "M1=M2" if entry["m1"] == entry["m2"] else "M2"))
    for row, (value, name) in enumerate(marks):
        if value > 0:
            ax.axvline(value, color="gray", linestyle=":", linewidth=1)
            ax.text(value, top * (1 - 0.06 * row), f" {name}={value}", va="top", fontsize=8, color="dimgray")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (rows of X: batch x tokens)")
    timing = entry.get("timing", "flushed")
    ax.set_ylabel("time per GEMM (us, " + ("graph, rotating weights" if timing == "graph" else "L2 flushed") + ")")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
