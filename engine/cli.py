"""What every binary in `bin/` shares: quiet TensorFlow, readable logs, and
user mistakes reported as one line instead of a traceback.

Kept free of flags (those live in `bin/`); a binary calls `cli.run(main)`
instead of `absl.app.run(main)`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Callable

# TensorFlow's C++ start-up chatter (including "failed call to cuInit" on
# machines without a GPU) drowns the progress lines; TF_CPP_MIN_LOG_LEVEL=0
# brings it back.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # noqa: E402

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s  %(message)s", datefmt="%H:%M:%S"))
    for name in ("engine", "collectives"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(logging.INFO)
        log.propagate = False


def fail(program: str, message: str) -> None:
    """Prints `program: error: message` on stderr and exits with status 2."""
    print(f"{program}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)


def run(main: Callable[[list[str]], None]) -> None:
    """`absl.app.run(main)`, with `USER_ERRORS` and Ctrl-C turned into exit codes."""
    program = os.path.basename(sys.argv[0])

    def guarded(argv: list[str]) -> None:
        if len(argv) > 1:
            fail(program, f"unexpected argument {argv[1]!r}; flags take the form --name=value")
        _configure_logging()
        from engine.errors import USER_ERRORS  # imports TensorFlow: after flag parsing

        try:
            main(argv)
        except USER_ERRORS as error:
            fail(program, str(error))
        except KeyboardInterrupt:
            print(f"{program}: interrupted", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)

    app.run(guarded)
