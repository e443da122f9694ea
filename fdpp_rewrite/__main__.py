"""`python -m fdpp_rewrite`. Ctrl-C is one line and exit code 130 from the first moment: before cli is imported
(then the process simply ends), and inside cli.main (which removes partial outputs on the way out)."""

import os
import signal


def _interrupted_early(signum, frame):
    os.write(2, b"error: interrupted\n")
    os._exit(130)


signal.signal(signal.SIGINT, _interrupted_early)

from fdpp_rewrite.cli import main  # noqa: E402 - after the handler, on purpose

raise SystemExit(main())
