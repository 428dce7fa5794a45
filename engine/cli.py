"""What every binary in `bin/` shares: quiet TensorFlow, readable logs, and
user mistakes reported as one line instead of a traceback.

Kept free of flags (those live in `bin/`); a binary calls `cli.run(main)`
instead of `absl.app.run(main)`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Callable, Optional

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

EXIT_FAILURE = 1  # the run failed, e.g. a multi-worker peer was lost
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


def user_error_types() -> tuple[type[Exception], ...]:
    """Each package's own user-error type: what the binaries print as one line.

    Imports TensorFlow (through `collectives`), hence only after flag parsing.
    """
    from collectives import CollectiveError
    from engine.errors import ConfigError
    from inputs import InputError
    from launch import TFConfigError
    from models import ModelError

    return (ConfigError, CollectiveError, InputError, ModelError, TFConfigError)


def fail(program: str, message: str) -> None:
    """Prints `program: error: message` on stderr and exits with status 2."""
    print(f"{program}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)


def run(
    main: Callable[[list[str]], Optional[int]],
    *,
    command_after_dashdash: bool = False,
    user_errors: Optional[tuple[type[Exception], ...]] = None,
) -> None:
    """`absl.app.run(main)`, with user mistakes and Ctrl-C turned into exit codes.

    Args:
      main: called with argv (the program, then, with `command_after_dashdash`,
        the command that followed `--`); its return value is the exit status.
      command_after_dashdash: the binary wraps another command given after
        `--` (`bin/launch`): only arguments before `--` are this binary's flags.
      user_errors: exceptions reported as one line; default `user_error_types()`
        (importing it imports TensorFlow, which `bin/launch` avoids).
    """
    program = os.path.basename(sys.argv[0])
    own_args = sys.argv[1:]
    if command_after_dashdash and "--" in own_args:
        own_args = own_args[: own_args.index("--")]
    if any(arg in ("-h", "-?", "--help", "--helpshort") for arg in own_args):
        # absl exits 1 after printing help; asking for help is not an error.
        app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)

    def parse_flags(argv: list[str]) -> list[str]:
        command: list[str] = []
        if command_after_dashdash:
            split = argv.index("--", 1) if "--" in argv[1:] else len(argv)
            argv, command = argv[:split], argv[split + 1:]
        try:
            rest = flags.FLAGS(argv)
        except flags.Error as error:
            fail(program, f"{error}; see {program} --help")
        if len(rest) > 1:
            where = " before '--'" if command_after_dashdash else ""
            fail(program, f"unexpected argument {rest[1]!r}{where}; flags take the form --name=value")
        if command_after_dashdash and not command:
            fail(program, f"missing command after '--'; usage: {program} [flags] -- COMMAND [ARGS...]")
        return [argv[0], *command]

    def guarded(argv: list[str]) -> Optional[int]:
        _configure_logging()
        errors, preempted, failures = user_errors, (), ()
        if errors is None:  # these import TensorFlow: only after flag parsing
            errors = user_error_types()
            from engine.errors import ClusterFailure
            from engine.preemption import Preempted

            preempted, failures = (Preempted,), (ClusterFailure,)
        try:
            return main(argv)
        except errors as error:
            fail(program, str(error))
        except failures as failure:
            print(f"{program}: error: {failure}", file=sys.stderr, flush=True)
            sys.exit(EXIT_FAILURE)
        except preempted as stop:
            print(f"{program}: {stop}", file=sys.stderr, flush=True)
            sys.exit(stop.exit_status)  # 143 for SIGTERM, 130 for Ctrl-C: saved, not finished
        except KeyboardInterrupt:
            print(f"{program}: interrupted", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)

    app.run(guarded, flags_parser=parse_flags)
