"""A deadline for blocking calls that no Python timer can interrupt.

`MultiWorkerMirroredStrategy()` waits for every task of the cluster inside
TensorFlow's C++ runtime *while holding the GIL*: no Python thread runs, no
Python signal handler runs, and SIGTERM is not acted on either (measured on TF
2.21). A task that never comes up would leave the others waiting forever.

So the deadline lives in a second, tiny process: it waits on a pipe for the
block to finish; if the deadline passes first it prints the one-line error and
ends this process by a signal whose *default* action (terminate) the kernel
carries out without the GIL: SIGUSR1, signal 10, so the status a shell and
Kubernetes report is 128 + 10 = 138, `exit_codes.RESTART` (a cluster that never
formed is retryable: the missing task may come up on the next try). SIGKILL
would say 137, which platforms read as an out-of-memory kill. While the block
runs SIGUSR1 is set to its default action here; if the process still lives a
few seconds later (the signal blocked by some thread), SIGKILL ends it. If this
process dies for any other reason the pipe closes and the watchdog exits quietly.

A process that is PID 1 of its PID namespace (a container's entry point)
ignores every signal it has no handler for, SIGKILL from inside the namespace
included: run `bin/train` under an init (`tini`, `docker run --init`) there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from tfloop.engine.runtime import signals
from tfloop.launch import exit_codes

#: The signal that ends a process whose deadline passed: 128 + 10 = 138.
SIGNAL = signal.SIGUSR1
assert 128 + SIGNAL == exit_codes.RESTART

_WATCHDOG = """\
import os, select, signal, sys, time
pid, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin], [], [], seconds)
if not ready:
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    os.kill(pid, signal.SIGUSR1)
    ready, _, _ = select.select([sys.stdin], [], [], 5.0)  # closed when the process is gone
    if not ready:
        os.kill(pid, signal.SIGKILL)
"""


@contextlib.contextmanager
def deadline(seconds: float, message: str):
    """Ends this process, after printing `message` on stderr, if the block
    runs longer than `seconds` (0 or less: no deadline).

    The process ends by SIGUSR1 at its default action, status 138 to a
    shell (`exit_codes.RESTART`; Python's `Popen` says -10): nothing in it
    was able to run, so nothing it had open was touched.
    """
    if seconds <= 0:
        yield
        return
    # Its default action, whatever handler a part of the run set (from the
    # main thread; a thread cannot set one, nor receive the signal).
    default = signals.install(SIGNAL, signal.SIG_DFL)
    watchdog = subprocess.Popen(
        [sys.executable, "-S", "-c", _WATCHDOG, str(os.getpid()), str(seconds),
         f"{message} ({exit_codes.describe(exit_codes.RESTART)})"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        default.restore()
        watchdog.stdin.close()  # wakes the watchdog: the block is over
        try:
            watchdog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            watchdog.kill()
