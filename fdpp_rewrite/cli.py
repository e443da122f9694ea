"""`python -m fdpp_rewrite <command>`: each command lives in its own module with two functions,
`add_arguments(parser)` and `run(args) -> int`, imported only when that command is used."""

import argparse
import importlib
import os
import sys

from fdpp_rewrite import __version__
from fdpp_rewrite.errors import FdppError

# name -> (module, one-line help)
COMMANDS = {
    "export": ("fdpp_rewrite.export", "export a preset or checkpoint to a standard-ops ONNX model"),
    "rewrite": ("fdpp_rewrite.rewrite", "swap attention and weight matmuls for fdpp plugin nodes"),
    "compare": ("fdpp_rewrite.compare", "compare a rewritten graph against its original (polygraphy)"),
    "generate": ("fdpp_rewrite.generate", "generate text from an ONNX model on the CPU (onnxruntime)"),
    "demo": ("fdpp_rewrite.demo", "the whole CPU pipeline on smollm2-135m: export, rewrite, compare, generate"),
    "profile": ("fdpp_rewrite.profile", "profile GEMM implementations per [N, K] on this GPU (needs a GPU)"),
    "calibrate": ("fdpp_rewrite.calibrate", "choose phi and guard bounds per layer from real text"),
}


def build_parser(command=None) -> argparse.ArgumentParser:
    """The parser; only the chosen command's module is imported (so one command's missing optional dependency
    never breaks the others, and `--help` stays fast)."""
    parser = argparse.ArgumentParser(
        prog="python -m fdpp_rewrite",
        description="FlashDecoding++ as TensorRT plugins: export, rewrite, compare, profile, calibrate.",
    )
    parser.add_argument("--version", action="version", version=f"fdpp_rewrite {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(command_parser)
            command_parser.set_defaults(_module=module)
    return parser


def _chosen_command(argv):
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(_chosen_command(argv))
    except ImportError as exc:
        print(f"error: this command needs a package that is not installed ({exc}); run `make setup`",
              file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args._module.run(args) or 0)
    except FdppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: one line, the traceback only on request
        if os.environ.get("FDPP_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc} (set FDPP_DEBUG=1 for the traceback and report it)",
              file=sys.stderr)
        return 3
