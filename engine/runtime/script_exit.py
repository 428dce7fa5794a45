"""A training script's end, in the exit-code contract, without wrapping its `main`.

`bin/train` ends a SIGTERM with one line and 143, a lost peer with one line
and 138 (`bin/cli`). A script that calls `tfloop.run` or `tfloop.fit` (the
form docs/keras.md recommends, also as `bin/launch -- python train.py`) would
end the same events with Python's traceback and exit 1: a status below 128,
which `bin/launch --max_restarts`, TFJob's `ExitCode` policy and a JobSet's
`podFailurePolicy` never restart. Here the exception carries its status
(`exit_status`: `RunFailure` and its subclasses, `Preempted`), and `install`,
called by `engine.assembly.run.run` the first time it runs, adds an excepthook that
prints such an exception in one line (`train.py: error: worker:1 lost the
cluster ... (exit 138: restart every task from the last checkpoint)`) and
exits with its status. Every other exception, and one a script catches
itself, is left as it was (the previous hook prints it). Interactive shells
(IPython, Jupyter) do not call `sys.excepthook`: a notebook is not ended.

`signals_of_a_script` gives such a script, for the time of a run, what
`bin/cli` gives a binary from its first instruction, where the process has
the default actions (a script's own handlers, and `bin/cli`'s, are left as
they are): SIGTERM outside the training loop raises `errors.Terminated`
(one line, exit 143, the run's lock released), where it killed the process
(-15, no line, `train.lock` and a fresh `model_dir` left behind); SIGUSR1 and
SIGUSR2 do nothing until the engine gives them their work, where they
killed it with the retryable 138 / 140.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from types import TracebackType
from typing import Iterator, Optional

from tfloop.engine.errors import Terminated
from tfloop.engine.runtime import signals
from tfloop.launch import exit_codes

_lock = threading.Lock()
_installed: list = []  # the hook, once installed


def exit_status(error: BaseException) -> Optional[int]:
    """The status `error` carries, for tfloop's own exceptions; None for any
    other (a user's class with an `exit_status` of its own is not ours to end)."""
    status = getattr(error, "exit_status", None)
    ours = any(cls.__module__.startswith("tfloop.") for cls in type(error).__mro__)
    if not ours or isinstance(status, bool) or not isinstance(status, int):
        return None
    return status


def line(program: str, error: BaseException, status: int) -> str:
    """The one line, as `bin/cli` words it: a signal's own line (`preempted
    (SIGTERM) at step 40; saved ...`), else `error: <message> (exit N: class)`."""
    if status in (exit_codes.INTERRUPTED, exit_codes.PREEMPTED):
        return f"{program}: {error}"
    return f"{program}: error: {exit_codes.with_class(str(error), status)}"


def _hook(previous):
    def hook(kind: type, error: BaseException, traceback: Optional[TracebackType]) -> None:
        status = exit_status(error)
        if status is None:
            previous(kind, error, traceback)
            return
        started = sys.argv[0] if sys.argv else ""
        program = os.path.basename(started) if started not in ("", "-c", "-") else "python"
        print(line(program, error, status), file=sys.stderr, flush=True)
        sys.exit(status)  # from an excepthook: the process's status, atexit handlers run
    return hook


def install() -> None:
    """Adds the hook once per process (later calls do nothing); the hook in
    place before it handles every exception this one does not."""
    with _lock:
        if _installed:
            return
        hook = _hook(sys.excepthook)
        sys.excepthook = hook
        _installed.append(hook)


#: Signals whose default action ends a process before the engine gives them
#: their work (a loop sample, a thread dump).
_HARMLESS = tuple(getattr(signal, name) for name in ("SIGUSR1", "SIGUSR2")
                  if hasattr(signal, name))
#: The SIGTERMs `_terminate` got (TensorFlow may turn the raised exception
#: into another on its way up: pybind11 reports a `RuntimeError` when a
#: handler raises inside a C++ call).
_terminated: list[int] = []


def _terminate(signum, frame) -> None:
    _terminated.append(signum)
    raise Terminated()


def _do_nothing(signum, frame) -> None:
    """SIGUSR1 / SIGUSR2 outside the engine's own use of them."""


@contextlib.contextmanager
def signals_of_a_script() -> Iterator[None]:
    """See the module docstring. On the main thread only (elsewhere no
    handler can be set, and none runs)."""
    installed: list[signals.Installed] = []
    if signals.on_main_thread():
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            _terminated.clear()
            installed.append(signals.install(signal.SIGTERM, _terminate))
        installed += [signals.install(signum, _do_nothing) for signum in _HARMLESS
                      if signal.getsignal(signum) is signal.SIG_DFL]
    try:
        yield
    except BaseException as error:
        if _terminated and not isinstance(error, Terminated) and exit_status(error) is None:
            raise Terminated() from None  # what the signal became on its way up
        raise
    finally:
        for handler in reversed(installed):
            handler.restore()


@contextlib.contextmanager
def default_sigterm() -> Iterator[None]:
    """Inside `signals_of_a_script`, SIGTERM as the script had it, for a call
    that blocks in C++, where no Python handler runs (a parameter server's
    `join`: the signal would wait for a SIGKILL)."""
    with contextlib.ExitStack() as stack:
        if signals.on_main_thread() and signal.getsignal(signal.SIGTERM) is _terminate:
            stack.enter_context(signals.handling(signal.SIGTERM, signal.SIG_DFL))
        yield
