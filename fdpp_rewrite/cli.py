"""`python -m fdpp_rewrite <command>`.

Commands come from tables of name -> (module, one-line help): COMMANDS below, then the COMMANDS table of each
module in EXTENSIONS that is installed (e.g. fdpp_rewrite.engine.cli for build, run and bench: add its name
there). A command module has `add_arguments(parser)` and `run(args) -> int` and imports nothing heavy (torch,
onnx, onnxruntime, polygraphy) at module level: only the chosen command's module is imported, so `--help` and
argument errors return at once, and one command's missing optional dependency never breaks the others.

Every command shares one error path (`main`): a user's mistake (FdppError) or an environment problem
(permissions, a full disk, memory, a missing package) is one line `error: ...` that says what to do, exit 2;
Ctrl-C is `error: interrupted`, exit 130, at any moment (the handler is installed before any heavy import);
anything else is a bug: `internal error: ...`, exit 3.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import signal
import sys
import threading
from contextlib import contextmanager
from types import SimpleNamespace

from fdpp_rewrite import __version__
from fdpp_rewrite.errors import FdppError, environment_error

PROG = "python -m fdpp_rewrite"
EXIT_ERROR, EXIT_BUG, EXIT_INTERRUPTED = 2, 3, 130

# name -> (module, one-line help). The module has add_arguments(parser) and run(args); "module:name" names
# module.HANDLERS[name] = (add_arguments, run) instead, for a module that serves several commands.
COMMANDS = {
    "export": ("fdpp_rewrite.export", "export a preset or checkpoint to a standard-ops ONNX model"),
    "rewrite": ("fdpp_rewrite.rewrite", "swap attention and weight matmuls for fdpp plugin nodes"),
    "compare": ("fdpp_rewrite.compare", "compare a rewritten graph against its original (polygraphy)"),
    "generate": ("fdpp_rewrite.generate", "generate text from an ONNX model on the CPU (onnxruntime)"),
    "demo": ("fdpp_rewrite.demo", "smollm2-135m end to end: export, rewrite, build, run, bench on a GPU, "
                                   "else the CPU pipeline"),
    "profile": ("fdpp_rewrite.profile", "profile GEMM implementations per [N, K] on this GPU (needs a GPU)"),
    "calibrate": ("fdpp_rewrite.calibrate", "choose phi and guard bounds per layer from real text"),
    "verify": ("fdpp_rewrite.engine.verify", "check an engine folder in full: manifest, plan and weights sha256"),
}

# Modules with more COMMANDS tables, used when installed.
EXTENSIONS = ("fdpp_rewrite.engine.cli",)


def all_commands() -> dict:
    commands = dict(COMMANDS)
    for module_name in EXTENSIONS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):  # not installed: its commands are absent
                continue
            raise
        for name, entry in module.COMMANDS.items():
            commands.setdefault(name, entry)
    return commands


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line, like every other error of the CLI."""

    def error(self, message):
        self.exit(EXIT_ERROR, f"error: {message}; see `{self.prog} --help`\n")


def number(kind=float, *, at_least=None, above=None, at_most=None):
    """An argparse type: a finite number of `kind` (int or float) within bounds, so that nan, inf and values out of
    range are refused as the arguments are read (one line, exit 2), e.g. `type=number(float, above=0, at_most=1)`."""
    bounds = [f">= {at_least}" if at_least is not None else "", f"> {above}" if above is not None else "",
              f"<= {at_most}" if at_most is not None else ""]
    wanted = " ".join(["an integer" if kind is int else "a number", " and ".join(b for b in bounds if b)]).strip()

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if ((kind is float and not math.isfinite(value)) or (at_least is not None and value < at_least)
                or (above is not None and value <= above) or (at_most is not None and value > at_most)):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text}")
        return value

    return parse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help shows its default: argparse's "(default: X)", unless the text already says it in words
    (an option whose default is computed, e.g. "default: engines/<name>/model.onnx") or it is a flag (off)."""

    def _get_help_string(self, action):
        text = action.help or ""
        flag_or_none = action.default is None or action.default is False  # `is`: a default of 0 is shown
        if "default" in text.lower() or flag_or_none or action.default == argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def build_parser(command=None) -> argparse.ArgumentParser:
    """The parser; only the chosen command's module is imported."""
    commands = all_commands()
    parser = Parser(prog=PROG, description="FlashDecoding++ as TensorRT plugins. Commands: "
                                           f"{', '.join(commands)} (`{PROG} <command> --help` for each).")
    parser.add_argument("--version", action="version", version=f"fdpp_rewrite {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (module_name, help_text) in commands.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        if name == command:
            module = _command_module(module_name)
            module.add_arguments(command_parser)
            command_parser.set_defaults(_module=module)
    return parser


def _command_module(spec: str):
    module_name, _, handler = spec.partition(":")
    module = importlib.import_module(module_name)
    if not handler:
        return module
    add_arguments, run = module.HANDLERS[handler]
    return SimpleNamespace(add_arguments=add_arguments, run=run)


def _chosen_command(argv):
    return next((arg for arg in argv if not arg.startswith("-")), None)


def run_command(argv) -> int:
    """Parse and run one command; errors propagate (main turns them into lines and exit codes). `demo` calls this
    for its steps so that a failing step is reported once."""
    parser = build_parser(_chosen_command(argv))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_ERROR
    return int(args._module.run(args) or 0)


# --- Ctrl-C ---------------------------------------------------------------------------------------------------

_interrupted = threading.Event()


def _on_sigint(signum, frame):
    """The first Ctrl-C raises KeyboardInterrupt where the program is, so that partial outputs are removed on the
    way out; a second one, while that runs, ends the process at once. Either way: one line, exit 130."""
    if _interrupted.is_set():
        os.write(2, b"error: interrupted\n")
        os._exit(EXIT_INTERRUPTED)
    _interrupted.set()
    raise KeyboardInterrupt


@contextmanager
def handling_interrupts():
    """Install _on_sigint for the outermost main() of the main thread (nested calls and other threads keep
    whatever is installed)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is _on_sigint:
        yield
        return
    _interrupted.clear()
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# --- the one error path ---------------------------------------------------------------------------------------

def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def report(exc: BaseException) -> int:
    """Print the one line for `exc` on stderr and return the exit code."""
    try:
        sys.stdout.flush()  # whatever the command printed comes before the error
    except (OSError, ValueError):
        pass
    if isinstance(exc, KeyboardInterrupt) or _interrupted.is_set():
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(exc, BrokenPipeError):  # stdout closed early (`... | head`): nothing left to say to anyone
        try:  # else the interpreter's last flush of stdout complains
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_ERROR
    problem = exc if isinstance(exc, FdppError) else environment_error(exc)
    if problem is None and isinstance(exc, ModuleNotFoundError) and not (exc.name or "").startswith("fdpp_rewrite"):
        problem = FdppError(f"this command needs the package {exc.name!r}, which is not installed; run `make setup`")
    if problem is not None:
        print(f"error: {_one_line(problem)}", file=sys.stderr)
        return EXIT_ERROR
    if os.environ.get("FDPP_DEBUG"):
        raise exc
    print(f"internal error: {type(exc).__name__}: {_one_line(exc) or 'no message'} "
          "(set FDPP_DEBUG=1 for the traceback and report it)", file=sys.stderr)
    return EXIT_BUG


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    with handling_interrupts():
        try:
            code = run_command(argv)
        except SystemExit:  # --help, --version and argument errors: argparse has said it
            raise
        except BaseException as exc:  # noqa: BLE001 - the one place every failure becomes a line and a code
            return report(exc)
        if _interrupted.is_set():  # a library swallowed the KeyboardInterrupt: the user still asked to stop
            return report(KeyboardInterrupt())
        return code
