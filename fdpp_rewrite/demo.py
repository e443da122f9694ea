"""The main job on an embedded default: the whole CPU pipeline on smollm2-135m (real trained weights).

export (float32, standard ops) -> rewrite (fdpp plugin nodes) -> compare (polygraphy: onnxruntime on the
original vs our reference ops on the rewritten graph) -> generate a sentence from the rewritten graph."""

import time
from pathlib import Path

from fdpp_rewrite import cli
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.resources import calibration_path, engines_dir

DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."


def add_arguments(parser):
    parser.add_argument("model", nargs="?", default="smollm2-135m",
                        help="preset or checkpoint to run the pipeline on (default: smollm2-135m)")
    parser.add_argument("--workdir", type=Path, default=engines_dir() / "demo",
                        help="where the ONNX files go (default: engines/demo)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt for the generated sentence")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="length of the generated answer at most")
    parser.add_argument("--force", action="store_true",
                        help="redo every step even if its output exists (otherwise existing outputs are reused)")


def _step(title, argv):
    """One command of the pipeline; its errors propagate, so the demo stops with that command's one-line error."""
    print(f"\n== {title}: python -m fdpp_rewrite {' '.join(argv)}", flush=True)
    started = time.perf_counter()
    code = cli.run_command(argv)
    print(f"== {title}: {'ok' if code == 0 else f'exit code {code}'} in {time.perf_counter() - started:.1f} s",
          flush=True)
    return code


def run(args):
    if args.max_new_tokens <= 0:
        raise FdppError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    workdir = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    name = args.model.replace("/", "_")
    original = workdir / f"{name}.onnx"
    rewritten = workdir / f"{name}.fdpp.onnx"
    force = ["--force"] if args.force else []

    if original.exists() and not args.force:
        print(f"== export: reusing {original} (pass --force to redo)")
    else:
        _step("export", ["export", args.model, "--dtype", "float32", "-o", str(original), *force])

    if rewritten.exists() and not args.force:
        print(f"== rewrite: reusing {rewritten} (pass --force to redo)")
    else:
        calibration = calibration_path(name)
        calibrate = ["--calibration", str(calibration)] if calibration.exists() else []
        _step("rewrite", ["rewrite", str(original), "-o", str(rewritten), *calibrate, *force])

    compare_code = _step("compare", ["compare", str(original), str(rewritten)])

    print(f"\n== generate (the rewritten graph, fdpp ops run by the CPU reference)\nprompt: {args.prompt}", flush=True)
    from fdpp_rewrite.generate import TokenPrinter, generate_ids, load_tokenizer_for
    from fdpp_rewrite.ref_ops import make_reference_session

    tokenizer = load_tokenizer_for(original)
    print("answer: ", end="", flush=True)
    printer = TokenPrinter(tokenizer, lstrip=True)  # the answer appears token by token
    generate_ids(make_reference_session(rewritten), tokenizer, args.prompt, max_new_tokens=args.max_new_tokens,
                 chat=True, on_token=printer)
    printer.finish()
    verdict = "PASS" if compare_code == 0 else "FAIL"
    print(f"\ncompare verdict for {args.model}: {verdict}")
    return 0 if compare_code == 0 else 1
