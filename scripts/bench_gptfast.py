"""The gpt-fast style peer (fdpp_rewrite/engine/gptfast_peer.py) on a preset's shapes with random weights, timed as
`bench` times the engine. `bench ENGINE --kernels fdpp gptfast` runs the same peer on the engine's own model in one
run; this script runs it alone, on a preset.

    python scripts/bench_gptfast.py --batch 1 16 --context 128 1024 --out gptfast.json [--preset llama2-7b]

Writes --out (JSON with the command; points shaped as bench's, kernels "gptfast") and prints a line per point.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as python scripts/bench_gptfast.py

from fdpp_rewrite.errors import FdppError, require_gpu, run_script  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="llama2-7b", help="a llama-family preset (fdpp_rewrite.models.PRESETS)")
    p.add_argument("--layers", type=int, help="keep only the first N layers (default: all)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--context", type=int, nargs="+", default=[128, 1024])
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per point (>= 2), as bench's")
    p.add_argument("--out", type=Path, required=True, help="the JSON report")
    return p.parse_args(argv)


def model_config(preset: str, layers: int | None):
    """The preset's ModelConfig, checked against what the recipe's model is."""
    from fdpp_rewrite.engine.gptfast_peer import checked_config
    from fdpp_rewrite.models import get_config

    return checked_config(get_config(preset), preset, layers)


def main(argv=None) -> int:
    args = parse_args(argv)
    if min(args.batch) < 1 or min(args.context) < 1 or args.new_tokens < 2:
        raise FdppError("--batch and --context must be >= 1 and --new-tokens >= 2 (a decode step is timed after the "
                        f"first token); got --batch {args.batch} --context {args.context} "
                        f"--new-tokens {args.new_tokens}")
    config = model_config(args.preset, args.layers)
    require_gpu("bench_gptfast.py")
    import torch

    from fdpp_rewrite.engine.gptfast_peer import run_points

    argv = sys.argv[1:] if argv is None else argv  # the arguments this run took, also when called from Python
    report = {"command": shlex.join([sys.executable, __file__, *argv]), "peer": "gpt-fast recipe, torch.compile "
              "reduce-overhead", "preset": args.preset, "layers": config.num_layers, "dtype": "float16",
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "points": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    report["points"] = run_points(config, args.batch, args.context, args.new_tokens,
                                  progress=lambda line: print(line, flush=True))
    tmp = Path(f"{args.out}.tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_script(main)
