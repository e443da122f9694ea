"""Plots of scripts/bench_gemm.py's results.json: time per implementation against M for each shape, the
dispatched GEMM's speed-up over cuBLAS, and the ImplB ablations.

    python scripts/plot_gemm.py out/bench_gemm/results.json --out out/bench_gemm
"""

import argparse
import json
import sys
from pathlib import Path

IMPL_STYLES = {
    "dispatched": ("fdpp dispatched", "-o", 2.2),
    "impla": ("ImplA GEMV", "-", 1.0),
    "implb": ("ImplB flat GEMM", "-", 1.0),
    "cublaslt": ("ImplC cuBLASLt", "-", 1.0),
    "cutlass": ("ImplC CUTLASS", "-", 1.0),
    "cublas": ("cuBLAS (torch)", "--k", 1.6),
}


def plot_results(results: dict, out_dir: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    rows = results["rows"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    paths = []

    # One row of time plots per timing: graph (the judged one: back to back over rotating weights) and flushed.
    fig, axes = plt.subplots(2, len(shapes), figsize=(4.2 * len(shapes), 7.2), squeeze=False)
    for row_axes, prefix, label_y in ((axes[0], "graph_", "us per GEMM (graph, rotating weights)"),
                                      (axes[1], "", "us per GEMM (single launch, L2 flushed)")):
        for ax, shape in zip(row_axes, shapes):
            sub = [r for r in rows if r["shape"] == shape]
            for impl, (label, style, width) in IMPL_STYLES.items():
                pts = [(r["m"], r[f"{prefix}{impl}_us"]) for r in sub if r.get(f"{prefix}{impl}_us")]
                if pts:
                    ax.plot(*zip(*pts), style, label=label, linewidth=width, markersize=3)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{shape} [{sub[0]['n']}, {sub[0]['k']}]", fontsize=10)
            ax.set_xlabel("M")
            ax.grid(True, alpha=0.3)
        row_axes[0].set_ylabel(label_y, fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{results['device'].get('name', '')} {results['dtype']}", fontsize=10)
    fig.tight_layout()
    path = out_dir / "gemm_times.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, shape in enumerate(shapes):
        sub = [r for r in rows if r["shape"] == shape]
        color = f"C{i}"
        if all("graph_speedup_vs_cublas" in r for r in sub):
            ax.plot([r["m"] for r in sub], [r["graph_speedup_vs_cublas"] for r in sub], "-o", color=color,
                    markersize=3, label=f"{shape} (graph)")
        ax.plot([r["m"] for r in sub], [r["speedup_vs_cublas"] for r in sub], ":", color=color, markersize=3,
                label=f"{shape} (flushed)")
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M")
    ax.set_ylabel("cuBLAS time / fdpp dispatched time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = out_dir / "gemm_speedup_vs_cublas.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    ablation = results.get("ablation", [])
    if ablation:
        labels = ["pad8", "pad16", "pad64", "stages1_no_overlap", "stages2_double_buffer", "stages_profiled"]
        fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * len(ablation)), 3.8))
        width = 0.8 / len(labels)
        for i, label in enumerate(labels):
            xs = [j + i * width for j in range(len(ablation))]
            ax.bar(xs, [a.get(label + "_us") or 0 for a in ablation], width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ablation))])
        ax.set_xticklabels([f"{a['shape']}\nM={a['m']}" for a in ablation], fontsize=7)
        ax.set_ylabel("ImplB us (L2 flushed)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / "gemm_ablation.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: beside results)")
    args = p.parse_args()
    if not args.results.is_file():
        print(f"error: {args.results} not found; run scripts/bench_gemm.py first", file=sys.stderr)
        return 2
    results = json.loads(args.results.read_text())
    for path in plot_results(results, args.out or args.results.parent):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
