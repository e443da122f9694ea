"""Merge the engine benchmark's JSONs (`bench --out`, scripts/bench_hf.py --out) of one machine into one result
file with every system per point and the ratios of fdpp to each peer, and draw the chart.

    python scripts/report_engine.py engine.json engine32k.json hf.json -o docs/benchmarks/engine-llama2-7b-h200.json

Where two inputs have a point of the same system, batch and context, the first input's counts.
Systems: fdpp (this engine), torch (the same engine with cuBLAS GEMMs and SDPA attention), hf-eager, hf-compile,
and the ablations (-NAME: fdpp with one technique switched to its baseline). The PNG (same name, .png) plots decode
tokens/s against batch, one panel per context, and first-token time.
"""

import argparse
import json
import os
from pathlib import Path

PEERS = ("torch", "hf-compile", "hf-eager")
LABELS = {"fdpp": "fdpp engine", "torch": "same engine, cuBLAS + SDPA", "hf-compile": "HF static cache + compile",
          "hf-eager": "HF eager"}


def load_points(paths: list) -> tuple[list, list, dict]:
    points, commands, facts = [], [], {}
    for path in paths:
        report = json.loads(Path(path).read_text())
        commands += report.get("commands") or [report["command"]]
        for key in ("gpu", "model", "dtype", "stream_read_bytes_per_s", "transformers", "torch", "weights"):
            if report.get(key) is not None:
                facts.setdefault(key, report[key])
        for point in report["points"]:
            point = dict(point)
            point["system"] = point.pop("kernels", None) or point["system"]
            points.append(point)
    return points, commands, facts


def ratios(points: list) -> list:
    """Per (batch, context) with an fdpp point: fdpp tokens/s over each peer's, and each peer's first-token time
    over fdpp's (> 1: fdpp is faster)."""
    by_key = {}
    for p in points:
        if "error" not in p:
            by_key.setdefault((p["batch"], p["context"]), {}).setdefault(p["system"], p)  # the first file's
    rows = []
    for (batch, context), systems in sorted(by_key.items()):
        ours = systems.get("fdpp")
        if ours is None:
            continue
        row = {"batch": batch, "context": context, "fdpp_tokens_per_s": ours["tokens_per_s"]}
        if "roofline_pct" in ours:
            row["fdpp_roofline_pct"] = ours["roofline_pct"]
        for peer in PEERS:
            if peer in systems:
                row[f"speedup_vs_{peer}"] = ours["tokens_per_s"] / systems[peer]["tokens_per_s"]
                row[f"first_token_ratio_{peer}"] = ours["first_token_ms"] / systems[peer]["first_token_ms"]
        rows.append(row)
    return rows


def plot(points: list, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({p["context"] for p in points if p["system"] == "fdpp"})
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 3.8), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        for system in ("fdpp", *PEERS):
            first = {}  # one point per batch: the first file's, as in ratios()
            for p in points:
                if p["system"] == system and p["context"] == context and "error" not in p:
                    first.setdefault(p["batch"], p["tokens_per_s"])
            pts = sorted(first.items())
            if pts:
                ax.plot(*zip(*pts), marker="o", label=LABELS[system])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_title(f"context {context}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("decode tokens/s")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def dumps(report: dict) -> str:
    """JSON with one line per point and per ratio row (a 15-point grid of 4 systems stays readable in a diff)."""
    lines = []
    for key, value in report.items():
        if key in ("points", "ratios"):
            rows = ",\n".join(f"  {json.dumps(row)}" for row in value)
            lines.append(f" {json.dumps(key)}: [\n{rows}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--title", default="decode throughput")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the report's notes (when and how its inputs were measured); repeatable")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.inputs if not path.is_file()]
    if missing:
        parser.exit(2, f"error: no such input file: {', '.join(missing)}; pass the JSONs `bench --out` and "
                       "scripts/bench_hf.py --out wrote\n")
    points, commands, facts = load_points(args.inputs)
    rows = ratios(points)
    report = {"commands": commands, **({"notes": args.note} if args.note else {}), **facts, "points": points,
              "ratios": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{args.output}.tmp")
    tmp.write_text(dumps(report))
    os.replace(tmp, args.output)
    for row in rows:
        peers = "  ".join(f"{peer} {row[f'speedup_vs_{peer}']:.2f}x" for peer in PEERS if f"speedup_vs_{peer}" in row)
        print(f"batch {row['batch']:>2} context {row['context']:>5}: fdpp {row['fdpp_tokens_per_s']:8.1f} tok/s  "
              f"{peers}")
    plot(points, args.output.with_suffix(".png"), args.title)
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
