"""End-to-end engine benchmark of one preset: export (random weights unless trained ones are installed), rewrite,
build and bench over a grid of batch sizes and contexts, this project's kernels against the stock-torch baseline
of the same engine, in one run. Writes WORK/bench.json (with the command) and prints the table.

    python scripts/bench_engine.py llama2-7b --batch 1 2 4 8 16 --context 128 1024 8192 --new-tokens 128
    python scripts/bench_engine.py tiny-llama --dtype float32 --backend cpu --batch 1 --context 16 --new-tokens 4
    python scripts/bench_engine.py llama2-7b --kv-memory 0.9 --batch 64 128 256 --context 512   # a paged KV cache

The engine is built for max batch = the largest --batch and max sequence = the longest --context + --new-tokens;
with --kv-memory its KV cache is paged (build --kv-memory), sized by memory instead of batch x sequence, and the
torch peer runs on a second, contiguous build of the same graph (bench --torch-engine; its slots must fit the GPU).
"""

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset")
    parser.add_argument("--layers", type=int, help="keep only the first N layers (default: all)")
    parser.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    parser.add_argument("--backend", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--context", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--kernels", nargs="+", default=["fdpp", "torch"], choices=["fdpp", "torch"])
    parser.add_argument("--kv-memory", help="build a paged KV cache of this size (0.9 of the free GPU memory, or "
                                            "20GiB; default: contiguous slots)")
    parser.add_argument("--work", type=Path, help="folder for the graphs and the engine (default: a temp folder)")
    args = parser.parse_args(argv)

    work = args.work or Path(tempfile.mkdtemp(prefix="bench_engine_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return run_steps(args, work)
    except (SystemExit, KeyboardInterrupt):
        if args.work is None:  # a temp folder of ours: a 7B model's graphs and engine are tens of GB
            shutil.rmtree(work, ignore_errors=True)
            print(f"removed {work}", file=sys.stderr)
        raise


def run_steps(args, work: Path) -> int:
    max_seq = max(args.context) + args.new_tokens
    onnx_path, engine = work / "model.onnx", work / "engine"
    layers = ["--layers", str(args.layers)] if args.layers else []
    steps = [
        ["export", args.preset, "-o", str(onnx_path), "--dtype", args.dtype, "--max-cache", str(max_seq), "--force",
         *layers],
        ["rewrite", str(onnx_path), "--force"],
    ]
    for step in steps:
        run([sys.executable, "-m", "fdpp_rewrite", *step])
    engine_cli = [sys.executable, "-m", "fdpp_rewrite"]
    run(engine_cli + ["build", str(work / "model.fdpp.onnx"), "-o", str(engine), "--max-batch", str(max(args.batch)),
                      "--max-seq", str(max_seq), "--backend", args.backend, "--force",
                      *(["--kv-memory", args.kv_memory] if args.kv_memory else [])])
    peer = []
    if args.kv_memory and "torch" in args.kernels:  # SDPA reads contiguous caches: the peer gets its own build
        peer = ["--torch-engine", str(work / "engine_contiguous")]
        run(engine_cli + ["build", str(work / "model.fdpp.onnx"), "-o", peer[1], "--max-batch", str(max(args.batch)),
                          "--max-seq", str(max_seq), "--backend", args.backend, "--force"])
    run(engine_cli + ["bench", str(engine), "--batch", *map(str, args.batch), "--context", *map(str, args.context),
                      "--new-tokens", str(args.new_tokens), "--kernels", *args.kernels, *peer, "--out",
                      str(work / "bench.json")])
    return 0


def run(command: list) -> None:
    print("$ " + " ".join(shlex.quote(c) for c in command), flush=True)
    result = subprocess.run(command)
    if result.returncode:
        raise SystemExit(f"error: `{command[3]}` failed (exit {result.returncode}); see its message above")


if __name__ == "__main__":
    raise SystemExit(main())
