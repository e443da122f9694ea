"""The main job on an embedded default, smollm2-135m (real trained weights), on the best engine this machine has.

With a CUDA GPU and the plugin library (`make demo` builds it where nvcc and a GPU exist): export (float16) ->
rewrite (fdpp plugin nodes) -> build (the GPU engine) -> run (a chat answer, streamed) -> bench (decode tokens/s
beside the same engine on the torch baseline's kernels). Elsewhere, the CPU pipeline: export (float32) -> rewrite ->
compare (polygraphy: onnxruntime on the original vs our reference ops on the rewritten graph) -> generate a sentence
from the rewritten graph. Every step is the CLI command it prints, run through `cli.run_command`."""

import time
from pathlib import Path

from fdpp_rewrite import cli
from fdpp_rewrite.cli_args import add_force
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.resources import calibration_path, engines_dir, plugin_library_path

DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."
# The GPU engine's sizes: the chat answer and one bench point (context 128 + BENCH_NEW_TOKENS) fit in GPU_MAX_SEQ,
# and one sequence keeps the build's CUDA-graph captures few.
GPU_MAX_SEQ = 1024
GPU_MAX_BATCH = 1
BENCH_CONTEXT, BENCH_NEW_TOKENS = 128, 128


def add_arguments(parser):
    parser.add_argument("model", nargs="?", default="smollm2-135m",
                        help="preset or checkpoint to run the pipeline on (default: smollm2-135m)")
    parser.add_argument("--workdir", type=Path, default=engines_dir() / "demo",
                        help="where the ONNX files and the engine go (default: engines/demo)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt for the generated sentence")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="length of the generated answer at most")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="cuda: the GPU engine; cpu: the CPU pipeline; auto: cuda when a CUDA GPU and the plugin "
                             "library are here, else cpu")
    add_force(parser, "every step's output (each step is redone)", otherwise="reuse the outputs that exist")


def _step(title, argv, lead=""):
    """One command of the pipeline; its errors propagate, so the demo stops with that command's one-line error.
    `lead` is printed just before the command runs (the `answer: ` in front of a streamed answer)."""
    print(f"\n== {title}: python -m fdpp_rewrite {' '.join(argv)}", flush=True)
    print(lead, end="", flush=True)
    started = time.perf_counter()
    code = cli.run_command(argv)
    print(f"== {title}: {'ok' if code == 0 else f'exit code {code}'} in {time.perf_counter() - started:.1f} s",
          flush=True)
    return code


def why_no_gpu_engine():
    """None when the GPU engine can run here, else the reason in a few words."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch"
    library = plugin_library_path()
    if not library.is_file():
        return f"the plugin library {library} is not built (`make lib`)"
    return None


def _export_and_rewrite(args, name, original, rewritten, dtype):
    """The shared first half: export to standard ONNX ops, then rewrite to fdpp nodes (phi from the committed
    calibration when the model has one); an existing output is reused unless --force."""
    force = ["--force"] if args.force else []
    if original.exists() and not args.force:
        print(f"== export: reusing {original} (pass --force to redo)")
    else:
        cache = ["--max-cache", str(GPU_MAX_SEQ)] if dtype == "float16" else []
        _step("export", ["export", args.model, "--dtype", dtype, *cache, "-o", str(original), *force])

    if rewritten.exists() and not args.force:
        print(f"== rewrite: reusing {rewritten} (pass --force to redo)")
    else:
        calibration = calibration_path(name)
        calibrate = ["--calibration", str(calibration)] if calibration.exists() else []
        _step("rewrite", ["rewrite", str(original), "-o", str(rewritten), *calibrate, *force])


def run(args):
    if args.max_new_tokens <= 0:
        raise FdppError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    device = args.device
    if device != "cpu":
        reason = why_no_gpu_engine()
        if reason and device == "cuda":
            raise FdppError(f"--device cuda needs the GPU engine, but {reason}; run `make demo` on a GPU machine "
                            "or pass --device cpu")
        if reason:
            print(f"demo: {reason}, so this runs the CPU pipeline (the GPU engine needs a CUDA GPU and `make lib`)",
                  flush=True)
            device = "cpu"
        else:
            device = "cuda"
    workdir = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    name = args.model.replace("/", "_")
    if device == "cuda":
        return _run_gpu(args, workdir, name)
    return _run_cpu(args, workdir, name)


def _run_cpu(args, workdir, name):
    original = workdir / f"{name}.onnx"
    rewritten = workdir / f"{name}.fdpp.onnx"
    _export_and_rewrite(args, name, original, rewritten, "float32")

    compare_code = _step("compare", ["compare", str(original), str(rewritten)])

    print(f"\n== generate (the rewritten graph, fdpp ops run by the CPU reference)\nprompt: {args.prompt}", flush=True)
    from fdpp_rewrite.generate import TokenPrinter, generate_ids, load_tokenizer_for
    from fdpp_rewrite.ref_session import make_reference_session

    tokenizer = load_tokenizer_for(original)
    print("answer: ", end="", flush=True)
    printer = TokenPrinter(tokenizer, lstrip=True)  # the answer appears token by token
    generate_ids(make_reference_session(rewritten), tokenizer, args.prompt, max_new_tokens=args.max_new_tokens,
                 chat=True, on_token=printer)
    printer.finish()
    verdict = "PASS" if compare_code == 0 else "FAIL"
    print(f"\ncompare verdict for {args.model}: {verdict}")
    return 0 if compare_code == 0 else 1


def _run_gpu(args, workdir, name):
    original = workdir / f"{name}-fp16.onnx"
    rewritten = workdir / f"{name}-fp16.fdpp.onnx"
    engine = workdir / f"{name}-engine"
    _export_and_rewrite(args, name, original, rewritten, "float16")

    if (engine / "manifest.json").exists() and not args.force:
        print(f"== build: reusing {engine} (pass --force to redo)")
    else:
        force = ["--force"] if args.force or engine.exists() else []
        _step("build", ["build", str(rewritten), "-o", str(engine), "--max-batch", str(GPU_MAX_BATCH), *force])

    print(f"prompt: {args.prompt}")
    _step("run (the GPU engine)", ["run", str(engine), "--prompt", args.prompt, "--chat",
                                   "--max-new-tokens", str(args.max_new_tokens)], lead="answer: ")
    _step("bench (fdpp kernels beside the torch baseline: cuBLAS GEMMs and SDPA attention in the same engine)",
          ["bench", str(engine), "--batch", "1", "--context", str(BENCH_CONTEXT),
           "--new-tokens", str(BENCH_NEW_TOKENS), "--kernels", "fdpp", "torch"])
    print(f"\ndemo of {args.model} on the GPU engine: done (engine folder {engine})")
    return 0
