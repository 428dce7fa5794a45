"""What a task was doing when it hung: a dump of its threads, phase and step.

A multi-worker run that hangs (a worker stuck in its input, a collective
waiting on a peer that never comes, a save on a dead filesystem) prints
nothing: every worker waits. `HangWatch` is a daemon thread that notices when
no train loop has ended for `timeout` seconds (`--hang_timeout`) and writes,
without stopping anything, one file per dump::

    hang dump: worker:1 (pid 4242, host node-3), 2026-11-24 21:40:02 UTC
    why: no train loop ended in 30 s (--hang_timeout)
    last completed step: 300 (its loop ended 31.2 s ago)
    phase: train (the compiled loop from step 300 to 400); inside the step: input (...)
    --- thread MainThread (140012...) ---
      File ".../trainer.py", line 240, in train ...

The phase is the Controller's (train, evaluate, save, or between loops:
actions), and inside a compiled train loop the step's own phase from the
worker's clock (`engine.loop.step_phase.StepPhase`: input, step,
all-reduce). It dumps again after each further `timeout` while no loop ends,
and at once on SIGUSR2 (`bin/launch` sends it on its own `--timeout` before
stopping the tasks; not SIGUSR1, the start-up watchdog's, which ends a task
that waited too long for its cluster): the signal's C handler writes to a
pipe this thread reads (`engine.runtime.signals.WakePipe`), so a dump comes even while
the main thread is blocked inside TensorFlow, where a Python signal handler
would not run.

Where: `$TFLOOP_DIAGNOSTICS_DIR` when `bin/launch` set it (so it gathers every
task's dumps in one folder), else `<model_dir>/diagnostics/`, else (not
writable, or a symbolic link) this user's own `tfloop-diagnostics-<uid>/` in
the temporary directory, mode 0700, taken only if it is a real folder of
this user's; the log line names the file. Each dump is a new file, created
exclusively (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0644): a name already taken,
by a link or by an earlier process with the same pid, passes to the next
number, so no dump ever writes over a file or through a link.

Limit: the thread needs the GIL. TensorFlow releases it while ops and
functions run, so the hangs above are dumped; a C++ call that holds it (the
cluster's start-up, which has its own deadline: `engine.runtime.watchdog`)
blocks the dump too.
"""

from __future__ import annotations

import datetime
import errno
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, Optional

import tensorflow as tf

from tfloop.engine.runtime import files, signals
from tfloop.launch.environment import DIAGNOSTICS_ENV

logger = logging.getLogger(__name__)


def directory_for(diagnostics_dir: str) -> str:
    """Where this task's dumps go: `$TFLOOP_DIAGNOSTICS_DIR` (bin/launch's
    folder, which gathers every task's), else the run's `diagnostics_dir`."""
    return os.environ.get(DIAGNOSTICS_ENV) or diagnostics_dir


#: Seconds the dump waits for the step's phase, read from a TensorFlow variable.
_READ_S = 5.0
#: Dump names tried past taken ones before giving up on a folder.
_NAMES_TRIED = 100


class HangWatch:
    """Dumps what this task is doing when no loop ends in `timeout` seconds
    (0: only on SIGUSR2); see the module docstring.

    Args:
      timeout: seconds without a loop end before a dump; 0: no deadline.
      task: this task's name (`worker:1`, `local`).
      directory: where dumps go (`$TFLOOP_DIAGNOSTICS_DIR`, or the run's
        `diagnostics/`: the caller's choice, `engine.run_dir.layout` names it);
        the temporary directory when it is not writable.
      file_name: the n-th dump's file name (`layout.hang_dump_name`).
      phase: the Controller's phase and loop: `Controller.running` and
        `Controller.running_steps`.
      step_phase: the phase inside the compiled step (the clock's), or None.
    """

    def __init__(self, *, timeout: float, task: str, directory: str,
                 file_name: Callable[[int], str],
                 phase: Callable[[], tuple] = lambda: (None, (0, 0)),
                 step_phase: Optional[Callable[[], str]] = None):
        self.timeout = timeout
        self.task = task
        self.directory = directory
        self.file_name = file_name
        self.phase = phase
        self.step_phase = step_phase
        self.dumps: list[str] = []
        self._number = 0
        self.last_step: Optional[int] = None
        self._last_end = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pipe: Optional[signals.WakePipe] = None

    # -- what the loop tells it ----------------------------------------------------

    def loop_ended(self, step: int) -> None:
        self.last_step = step
        self._last_end = time.monotonic()

    # -- the thread ------------------------------------------------------------------

    def start(self) -> "HangWatch":
        self._last_end = time.monotonic()
        # None off the main thread (signals reach only it): the deadline still works.
        self._pipe = signals.WakePipe.open(signal.SIGUSR2)
        self._thread = threading.Thread(target=self._watch, name="tfloop-hang-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._pipe is not None:
            self._pipe.wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None

    def _watch(self) -> None:
        last_dump = 0.0
        while not self._stop.is_set():
            if self._wait_for_signal(1.0):
                if not self._stop.is_set():
                    self.dump("asked (SIGUSR2, e.g. bin/launch's --timeout)")
                continue
            since = max(self._last_end, last_dump)
            if self.timeout and not self._stop.is_set() and (
                    time.monotonic() - since >= self.timeout):
                self.dump(f"no train loop ended in {self.timeout:g} s (--hang_timeout)")
                last_dump = time.monotonic()  # again after another timeout

    def _wait_for_signal(self, seconds: float) -> bool:
        """Whether SIGUSR2 arrived within `seconds`."""
        if self._pipe is None:
            self._stop.wait(seconds)
            return False
        return self._pipe.wait(seconds)

    # -- the dump ---------------------------------------------------------------------

    def report(self, why: str) -> str:
        """The dump's text: who, why, the last step, the phase, every thread's stack."""
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        lines = [f"hang dump: {self.task} (pid {os.getpid()}, host {socket.gethostname()}), {now}",
                 f"why: {why}"]
        if self.last_step is None:
            lines.append(f"last completed step: none in this process (no loop ended in "
                         f"{time.monotonic() - self._last_end:.1f} s since it started)")
        else:
            lines.append(f"last completed step: {self.last_step} (its loop ended "
                         f"{time.monotonic() - self._last_end:.1f} s ago)")
        lines.append(f"phase: {self._describe_phase()}")
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        for ident, frame in sys._current_frames().items():  # CPython's, documented in sys
            lines.append(f"--- thread {names.get(ident, '?')} ({ident}) ---")
            lines.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
        return "\n".join(lines) + "\n"

    def _describe_phase(self) -> str:
        phase, (start, end) = self.phase()
        if phase == "train":
            text = f"train (the compiled loop from step {start} to {end})"
            inner = self._read_step_phase()
            return f"{text}; inside the step: {inner}" if inner else text
        if phase == "evaluate":
            return "evaluate"
        if phase == "save":
            return "save (writing a checkpoint)"
        return "between loops (the loop's actions: progress, summaries, the stop request)"

    def _read_step_phase(self) -> Optional[str]:
        """The clock's phase, read in a thread of its own: bounded, whatever
        TensorFlow holds."""
        if self.step_phase is None:
            return None
        result: list = []

        def read():
            try:
                result.append(self.step_phase())
            except Exception as error:  # a dump must not fail on it
                result.append(f"unknown ({type(error).__name__})")

        reader = threading.Thread(target=read, daemon=True, name="tfloop-hang-phase")
        reader.start()
        reader.join(_READ_S)
        return result[0] if result else f"unknown (not readable in {_READ_S:g} s)"

    def dump(self, why: str) -> Optional[str]:
        """Writes the report; returns its path (None when nowhere was writable)."""
        text = self.report(why)
        for directory in (self.directory, fallback_directory()):
            try:
                if directory != self.directory:  # the fallback: this user's own folder, 0700
                    files.private_dir(directory)
                elif _planted_link(directory):
                    raise OSError(errno.ELOOP, "a symbolic link: not written through",
                                  directory)
                else:
                    files.make_dirs(directory)
                path, out = self._create(directory)
                with out:
                    out.write(text)
            except (tf.errors.OpError, OSError) as error:
                logger.info("no hang dump in %s: %s", directory, error)
                continue
            self.dumps.append(path)
            logger.warning("hang: %s; wrote what %s is doing (the stacks of its threads, its "
                           "phase, its last step) to %s; it keeps running", why, self.task, path)
            return path
        logger.warning("hang: %s; no directory was writable for the dump:\n%s", why, text)
        return None

    def _create(self, directory: str):
        """(path, open file) of the next dump in `directory`, created
        exclusively (never over a file, never through a link): a name that
        is taken (an earlier process's with the same pid, or something
        planted) passes to the next number."""
        for _ in range(_NAMES_TRIED):
            self._number += 1
            path = f"{directory.rstrip('/')}/{self.file_name(self._number)}"
            try:
                return path, files.create_exclusively(path)
            except FileExistsError:
                continue
        raise OSError(errno.EEXIST, f"{_NAMES_TRIED} dump names in a row are taken", directory)


def _planted_link(directory: str) -> bool:
    """Whether `directory` is a symbolic link the engine would write through:
    `<model_dir>/diagnostics` may not be one; the folder `bin/launch` names
    (`$TFLOOP_DIAGNOSTICS_DIR`, from the user's `--diagnostics_dir`) may."""
    if not files.is_local(directory) or directory == os.environ.get(DIAGNOSTICS_ENV):
        return False
    return os.path.islink(directory.rstrip("/"))


def fallback_directory() -> str:
    """Where dumps go when their folder cannot be written: this user's own
    `tfloop-diagnostics-<uid>` in the temporary directory (a shared name
    would let anyone plant a link there), made 0700 (`files.private_dir`)."""
    return os.path.join(tempfile.gettempdir(), f"tfloop-diagnostics-{os.getuid()}")
