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


def _reexec_in_project_venv() -> None:
    """Run by a Python without the dependencies (`bin/train` from a plain shell):
    hand over to the project's .venv, which `./dev` creates, if there is one."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv_python = os.path.join(repo, ".venv", "bin", "python")
    if os.path.exists(venv_python) and os.path.realpath(sys.prefix) != os.path.realpath(
        os.path.join(repo, ".venv")
    ):
        os.execv(venv_python, [venv_python, *sys.argv])
    print(
        f"{os.path.basename(sys.argv[0])}: error: TensorFlow and absl-py are not installed "
        "for this Python; run ./dev train once (it creates .venv), or pip install -e .",
        file=sys.stderr,
    )
    sys.exit(2)


try:
    import absl  # noqa: F401
except ImportError:
    _reexec_in_project_venv()

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _configure_logging() -> None:
    # absl.app turns INFO on for everything, TensorFlow's per-op chatter included.
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
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
    if any(arg in ("-h", "-?", "--help", "--helpshort") for arg in sys.argv[1:]):
        # absl exits 1 after printing help; asking for help is not an error.
        app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)

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

    def parse_flags(argv: list[str]) -> list[str]:
        try:
            return flags.FLAGS(argv)
        except flags.Error as error:
            fail(program, f"{error}; see {program} --help")

    app.run(guarded, flags_parser=parse_flags)
