"""`python -m fdpp_rewrite.engine build|run|bench ...`: the engine's commands until the package CLI registers
them (fdpp_rewrite.engine.cli.add_parsers); errors are printed as the package CLI prints them."""

import argparse
import os
import sys

from fdpp_rewrite.engine.cli import add_parsers
from fdpp_rewrite.errors import FdppError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fdpp_rewrite.engine",
                                     description="build, run and benchmark fdpp engines")
    add_parsers(parser.add_subparsers(dest="command", metavar="<command>"))
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


if __name__ == "__main__":
    raise SystemExit(main())
