"""What every binary in `bin/` shares: quiet TensorFlow, readable logs, and
user mistakes reported as one line instead of a traceback.

A binary calls `cli.run(main)` instead of `absl.app.run(main)`. The flags
themselves are in the binaries and `bin/flag_defs.py`.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Callable, Optional

# TensorFlow's C++ start-up chatter (including "failed call to cuInit" on
# machines without a GPU) drowns the progress lines; TF_CPP_MIN_LOG_LEVEL=0
# brings it back.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from tfloop.engine import logs  # noqa: E402  (imports no TensorFlow)

EXIT_FAILURE = 1  # the run failed: a multi-worker peer was lost, a loss became NaN
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def program_name() -> str:
    """What the user typed: `train` for `bin/train`, `tfloop-train` for the console
    script. sys.argv[0] alone would say `train` for both: the console script runs
    the file through `runpy.run_path`, which puts the file's path there."""
    started = sys.orig_argv[1:2]
    if started and not started[0].startswith("-"):
        return os.path.basename(started[0])
    return os.path.basename(sys.argv[0])


def user_error_types() -> tuple[type[Exception], ...]:
    """Each package's own user-error type: what the binaries print as one line.

    Imports TensorFlow (through `collectives`), hence only after flag parsing.
    """
    from tfloop.collectives import CollectiveError
    from tfloop.engine.errors import ConfigError
    from tfloop.inputs import InputError
    from tfloop.launch import TFConfigError
    from tfloop.models import ModelError

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
    skip_teardown: bool = False,
) -> None:
    """`absl.app.run(main)`, with user mistakes and Ctrl-C turned into exit codes.

    Args:
      main: called with argv (the program, then, with `command_after_dashdash`,
        the command that followed `--`); its return value is the exit status.
      command_after_dashdash: the binary wraps another command given after
        `--` (`bin/launch`): only arguments before `--` are this binary's flags.
      user_errors: exceptions reported as one line; default `user_error_types()`
        (importing it imports TensorFlow, which `bin/launch` avoids).
      skip_teardown: once `main` has returned or failed (everything it writes
        is written and closed), flush the output and leave with `os._exit`
        instead of letting Python tear TensorFlow down: destroying the
        finished tf.data iterators waits on their autotune threads, which
        measured 1 to 18 s after the last line of a bin/train run on this
        machine (see BUILD.md). For binaries whose work is all synchronous.
    """
    program = program_name()
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
        logs.configure_logging()
        errors, preempted, failures = user_errors, (), ()
        if errors is None:  # these import TensorFlow: only after flag parsing
            errors = user_error_types()
            from tfloop.engine.errors import ClusterFailure, NonFinite
            from tfloop.engine.preemption import Preempted

            preempted, failures = (Preempted,), (ClusterFailure, NonFinite)
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

    try:
        app.run(guarded, flags_parser=parse_flags)
    except SystemExit as exit_:
        if not skip_teardown:
            raise
        _exit_now(exit_.code)


def _exit_now(code) -> None:
    """`sys.exit(code)` without interpreter teardown: the `atexit` handlers
    still run (autograph deletes its generated files in /tmp there), the
    output is flushed, and then the process ends."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    # Private (undocumented) but in every CPython since 2.x: what `sys.exit`
    # runs first. It includes `logging.shutdown`, which logging registers.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)
