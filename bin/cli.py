"""What every binary in `bin/` shares: quiet TensorFlow, readable logs, and
user mistakes and signals reported as one line instead of a traceback.

A binary calls `cli.run(main)` instead of `absl.app.run(main)`. The flags
themselves are in the binaries and `bin/flag_defs.py`.

Signals: from the moment this module is imported (before TensorFlow is),
SIGINT and SIGTERM end the binary with one line and exit 130 / 143, whatever
it was doing (importing TensorFlow, setting up devices, building datasets).
Once training runs, `engine.loop.preemption.StopRequest` takes them over (a
checkpoint is saved first) and gives them back when training ends. SIGUSR1
and SIGUSR2, whose default action ends a process (status 138 and 140, the
retryable class: a platform would restart a run nothing went wrong with),
do nothing from the same moment until the engine gives them their work (a
loop sample, a thread dump: `engine.observe.step_time`, `engine.runtime.hang`).
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import sys
import tempfile
import traceback
from typing import Callable, Optional

# TensorFlow's C++ start-up chatter (including "failed call to cuInit" on
# machines without a GPU) drowns the progress lines: level 3 silences what
# TensorFlow logs once its logging is set up, and `import_tensorflow` what it
# logs before (--verbose brings both back).
_TF_LOG_LEVEL_GIVEN = "TF_CPP_MIN_LOG_LEVEL" in os.environ
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from tfloop.engine.runtime import logs, signals  # noqa: E402  (import no TensorFlow)
from tfloop.launch import exit_codes  # noqa: E402  (the one table; standard library only)

EXIT_FAILURE = exit_codes.FAILED  # a failure a restart cannot fix: a full disk, a NaN stop, a bug
EXIT_USAGE = exit_codes.USAGE
EXIT_INTERRUPTED = exit_codes.INTERRUPTED
EXIT_RESTART = exit_codes.RESTART  # restart every task: a lost peer, storage out of reach

_SIGNAL_REASONS = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "terminated (SIGTERM)"}

#: Signals whose default action (terminate) would end the binary before the
#: engine gives them their work: SIGUSR1 (a loop sample), SIGUSR2 (a thread dump).
_HARMLESS = tuple(getattr(signal, name) for name in ("SIGUSR1", "SIGUSR2") if hasattr(signal, name))


def _do_nothing(signum, frame) -> None:
    """SIGUSR1 / SIGUSR2 before (or after) the engine's own handlers. A Python
    handler, not `SIG_IGN`: a command `bin/launch` starts gets the default
    action back at `exec`, as it would have had."""


class Signalled(BaseException):
    """SIGINT or SIGTERM before (or after) training: unwinds to `run`, which
    prints one line and exits 128+signum. A BaseException, so that no
    `except Exception` on the way (TensorFlow's import has some) stops it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


#: The signals `_raise_signalled` got. TensorFlow code may turn the raised
#: exception into another on its way up (pybind11 reports a `RuntimeError`
#: when a handler raises inside a C++ call): this is what says it was a signal.
_received: list[int] = []


#: Whether `run` is under way, inside the block that turns `Signalled` into
#: one line. Before it (the binary still importing its modules and defining
#: its flags after this one) a signal leaves at once, as `run` would.
_running = False


def _raise_signalled(signum, frame) -> None:
    _received.append(signum)
    if not _running:
        _leave_signalled(signum)
    raise Signalled(signum)


def _leave_signalled(signum: int) -> None:
    """One line for SIGINT/SIGTERM, then exit 128+signum; a second signal
    while leaving leaves at once."""
    for each in _SIGNAL_REASONS:
        signals.install(each, lambda each, frame: os._exit(128 + each))
    print(f"{program_name()}: {_SIGNAL_REASONS[signum]}", file=sys.stderr, flush=True)
    _exit_now(128 + signum)


def _as_signalled() -> None:
    """Raises `Signalled` for the first signal received, if any (called with
    an exception in flight, which is then only its consequence)."""
    if _received:
        raise Signalled(_received[0]) from None


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM raise `Signalled`, SIGUSR1 and SIGUSR2 do nothing
    (main thread only: Python runs handlers there). Idempotent; `StopRequest`
    replaces and restores them. For the process's life: nothing restores them."""
    for signum in _SIGNAL_REASONS:
        signals.install(signum, _raise_signalled)
    for signum in _HARMLESS:
        signals.install(signum, _do_nothing)


# At import, before TensorFlow: a binary imports this module first thing.
install_signal_handlers()

# What TensorFlow's C++ logging writes before `absl::InitializeLog()`, which
# TF_CPP_MIN_LOG_LEVEL cannot silence: glog-style lines ("I0000 00:00:... port.cc:153]
# oneDNN ...", cudart_stub, cpu_feature_guard and its "To enable the following
# instructions" continuation) and absl's own warning about them.
_CHATTER = re.compile(
    r"^([IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|To enable the following instructions: .*rebuild TensorFlow)")


def import_tensorflow(verbose: bool = False) -> None:
    """Imports TensorFlow, without its C++ start-up chatter unless `verbose`.

    The chatter is written to file descriptor 2 by C++ before any setting can
    stop it, so fd 2 goes to a temporary file during the import and is
    restored right after; what was written there that is not chatter (a
    Python warning, an import error's messages) is then written to stderr.
    """
    if "tensorflow" in sys.modules:
        return
    if verbose:
        if not _TF_LOG_LEVEL_GIVEN:
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        import tensorflow  # noqa: F401
        _as_signalled()  # a signal the import swallowed
        return
    sys.stderr.flush()
    saved = os.dup(2)
    captured = tempfile.TemporaryFile()
    try:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
    finally:
        os.close(saved)
        captured.seek(0)
        kept = [line for line in captured.read().decode("utf-8", "replace").splitlines(True)
                if not _CHATTER.match(line)]
        captured.close()
        if kept:
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
    # A signal that arrived inside the import and was swallowed on its way up
    # (TensorFlow's import catches some errors, and pybind11 turns a raising
    # handler into a RuntimeError there): the binary ends now, in its one line,
    # instead of training on (a CI run's SIGINT at 2 s once went unnoticed).
    _as_signalled()


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


#: `message (exit 138: ...)`: the one wording of a failed run's last line.
with_class = exit_codes.with_class


def fail(program: str, message: str, exit_status: int = EXIT_USAGE, details: str = "") -> None:
    """Prints `program: error: message` on stderr and exits with `exit_status`
    (2, a usage mistake, unless the caller says the run failed; any other
    status is named at the end of the line, `with_class`); `details` (the
    user's own frames, for an error raised in their task) follow the line."""
    print(f"{program}: error: {with_class(message, exit_status)}", file=sys.stderr, flush=True)
    if details:
        print(details, file=sys.stderr, flush=True)
    sys.exit(exit_status)


def flag_value_error(args: list[str], error: ValueError, program: str) -> str:
    """The one line for what absl's parser raises as a plain `ValueError`
    (a traceback, exit 1, before): `--nofoo=value`, a boolean's negation
    given a value."""
    for arg in args:
        name, has_value, _ = arg.lstrip("-").partition("=")
        if (arg.startswith("-") and has_value and name.startswith("no")
                and name[2:] in flags.FLAGS
                and isinstance(flags.FLAGS[name[2:]], flags.BooleanFlag)):
            shown = "-" * (len(arg) - len(arg.lstrip("-"))) + name
            return f"{shown} takes no value; write --{name[2:]}=false or --{name}"
    return f"{error}; see {program} --help"


def check_path_flags() -> None:
    """The one path check (`engine.config.check_path_text`: blank, a control
    character, an unexpanded `~`, a name that is not UTF-8) for every folder
    flag given (`--*_dir`, any binary's: `--output_dir`, `--data_dir`,
    `--diagnostics_dir`, ...), before anything is created; empty is a flag's
    own default. Imports no TensorFlow.

    Raises:
      ConfigError: the one line naming the flag.
    """
    from tfloop.engine.config import check_path_text

    for name in flags.FLAGS:
        flag = flags.FLAGS[name]
        if (name.endswith("_dir") and flag.present and isinstance(flag.value, str)
                and flag.value):
            check_path_text(f"--{name}", flag.value)


def run(
    main: Callable[[list[str]], Optional[int]],
    *,
    command_after_dashdash: bool = False,
    user_errors: Optional[tuple[type[Exception], ...]] = None,
    skip_teardown: bool = False,
    command_required: Callable[[], bool] = lambda: True,
    check_flags: Optional[Callable[[], None]] = None,
) -> None:
    """`absl.app.run(main)`, with user mistakes and Ctrl-C turned into exit codes.

    Args:
      main: called with argv (the program, then, with `command_after_dashdash`,
        the command that followed `--`); its return value is the exit status.
      command_after_dashdash: the binary wraps another command given after
        `--` (`bin/launch`): only arguments before `--` are this binary's flags.
      command_required: asked once the flags are parsed: whether a missing
        command after `--` is a mistake (`bin/launch --spec` runs the spec's).
      check_flags: called once the flags are parsed, before TensorFlow is
        imported: a `ConfigError` it raises is one line and exit 2 within a
        second instead of after the import's seconds (`bin/train`:
        `flag_defs.check_given_run_flags`).
      user_errors: exceptions reported as one line; default `user_error_types()`
        (importing it imports TensorFlow, which `bin/launch` avoids).
      skip_teardown: once `main` has returned or failed (everything it writes
        is written and closed), flush the output and leave with `os._exit`
        instead of letting Python tear TensorFlow down: destroying the
        finished tf.data iterators waits on their autotune threads, which
        measured 1 to 18 s after the last line of a bin/train run on this
        machine (docs/reliability.md). For binaries whose work is all synchronous.
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
        except ValueError as error:  # absl's own, for `--nofoo=value` on a boolean
            fail(program, flag_value_error(argv[1:], error, program))
        if len(rest) > 1:
            where = " before '--'" if command_after_dashdash else ""
            fail(program, f"unexpected argument {rest[1]!r}{where}; flags take the form --name=value")
        if command_after_dashdash and not command and command_required():
            fail(program, f"missing command after '--'; usage: {program} [flags] -- COMMAND [ARGS...]")
        from tfloop.engine.errors import ConfigError  # imports no TensorFlow

        try:
            check_path_flags()
            if check_flags is not None:
                check_flags()
        except ConfigError as error:
            fail(program, str(error))
        return [argv[0], *command]

    def guarded(argv: list[str]) -> Optional[int]:
        logs.configure_logging()
        errors, preempted, failures = user_errors, (), ()
        try:
            if errors is None:  # these import TensorFlow: only after flag parsing
                import_tensorflow(verbose="verbose" in flags.FLAGS and flags.FLAGS.verbose)
                errors = user_error_types()
                from tfloop.engine.errors import RunFailure  # ClusterFailure, NonFinite too
                from tfloop.engine.loop.preemption import Preempted

                preempted, failures = (Preempted,), (RunFailure,)
        except BaseException:
            _as_signalled()
            raise
        try:
            try:
                return main(argv)
            except BaseException:
                _as_signalled()  # whatever the signal became on its way up
                raise
        except errors as error:  # a TaskError's user_frames: the traceback of the user's code
            fail(program, str(error), details=getattr(error, "user_frames", ""))
        except failures as failure:
            # The status the failure means (engine.errors: 1, 3, or 138 to restart every task).
            fail(program, str(failure), getattr(failure, "exit_status", EXIT_FAILURE))
        except preempted as stop:
            print(f"{program}: {stop}", file=sys.stderr, flush=True)
            sys.exit(stop.exit_status)  # 143 for SIGTERM, 130 for Ctrl-C: saved, not finished
        except KeyboardInterrupt:
            print(f"{program}: interrupted", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as bug:
            # A bug keeps its traceback (there is something to debug), and the
            # last line still names the class: permanent, not restarted.
            traceback.print_exc()
            what = f"{type(bug).__name__}, a bug: the traceback above"
            print(f"{program}: {with_class(what, EXIT_FAILURE)}", file=sys.stderr, flush=True)
            sys.exit(EXIT_FAILURE)

    global _running
    install_signal_handlers()
    try:
        try:
            _running = True
            app.run(guarded, flags_parser=parse_flags)
        except BaseException as error:
            if not isinstance(error, SystemExit):
                _as_signalled()
            raise
    except Signalled as signalled:
        # Whatever it interrupted (an import, device set-up, a dataset build),
        # one line: a traceback through TensorFlow's internals helps no one.
        _leave_signalled(signalled.signum)
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
