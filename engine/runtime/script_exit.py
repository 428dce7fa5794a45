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
"""

from __future__ import annotations

import os
import sys
import threading
from types import TracebackType
from typing import Optional

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
