"""The one module that installs and restores signal handlers.

Why one owner: a process has one handler per signal, and several parts of a
run want one for a while: `bin/cli` (SIGINT/SIGTERM end the binary with one
line), the stop request (`engine.loop.preemption`: the same signals save a
checkpoint first), the loop-time report (SIGUSR1 samples the next loop), the
hang watch (SIGUSR2 dumps the threads) and the cluster's start-up deadline
(SIGUSR1 back to its default action). Each of them used to carry its own
main-thread check and its own way of giving the previous handler back; here
it is done once:

- Python sets handlers only from the main thread (`ValueError` elsewhere, and
  signals are delivered there only): off it, `install` does nothing and says
  so (`Installed.active`), so the engine runs from a thread without handlers
  instead of failing.
- `signal.signal` returns None for a handler that was set outside Python;
  restoring None is impossible, and the default action is what such a
  process had: `restore` puts back `SIG_DFL` then.
- Handlers nest: what `install` replaced, `restore` gives back, so a part
  that takes a signal over for a while (the stop request over `bin/cli`'s
  handlers) leaves the process as it found it. Restore in the reverse order.

`WakePipe` is the other way a signal reaches Python code: as a byte on a pipe
(`signal.set_wakeup_fd`, written by CPython's C-level handler), which a thread
can wait on even while the main thread is blocked inside TensorFlow, where no
Python handler runs until the call returns.

Imports no TensorFlow: `bin/cli` installs its handlers before TensorFlow loads.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from types import FrameType
from typing import Any, Callable, Iterator, Optional, Union

#: What `signal.signal` takes: a function of (signum, frame), `SIG_DFL` or `SIG_IGN`.
Handler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers]


def on_main_thread() -> bool:
    """Whether handlers can be set (and signals arrive) on this thread."""
    return threading.current_thread() is threading.main_thread()


class Installed:
    """`handler` set for `signum` (on the main thread; elsewhere nothing is
    set and `active` is False); `restore()` gives the previous one back."""

    def __init__(self, signum: int, handler: Handler):
        self.signum = signum
        self.active = on_main_thread()
        self._previous: Optional[Handler] = signal.signal(signum, handler) if self.active else None

    def restore(self) -> None:
        """Puts back what was there (`SIG_DFL` for a handler set outside
        Python); later calls do nothing."""
        if not self.active:
            return
        self.active = False
        signal.signal(self.signum, signal.SIG_DFL if self._previous is None else self._previous)


def install(signum: int, handler: Handler) -> Installed:
    """Sets `handler` for `signum` until `restore()` (or for the process's
    life, when nothing restores it: `bin/cli`'s own)."""
    return Installed(signum, handler)


@contextlib.contextmanager
def handling(signum: int, handler: Handler) -> Iterator[Installed]:
    """`handler` for `signum` inside the block, the previous one after it."""
    installed = install(signum, handler)
    try:
        yield installed
    finally:
        installed.restore()


class WakePipe:
    """`signum` arriving as a byte on a pipe that `wait` selects on.

    The Python-level handler does nothing (some default actions, SIGUSR2's,
    end the process); the byte CPython's C handler writes to the wakeup fd is
    the message, and it is written whatever the main thread is doing. Open it
    with `WakePipe.open` (None off the main thread, or when the wakeup fd
    cannot be set); `close` restores the handler and the previous wakeup fd.
    """

    def __init__(self, signum: int, read: int, write: int, installed: Installed,
                 previous_fd: int):
        self.signum = signum
        self._read, self._write = read, write
        self._installed = installed
        self._previous_fd = previous_fd
        self._closed = False

    @classmethod
    def open(cls, signum: int) -> Optional["WakePipe"]:
        if not on_main_thread():
            return None
        read, write = os.pipe()
        os.set_blocking(write, False)  # set_wakeup_fd requires it
        installed = install(signum, lambda *_: None)
        try:
            previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except (ValueError, OSError):
            installed.restore()
            os.close(read)
            os.close(write)
            return None
        return cls(signum, read, write, installed, previous_fd)

    def wait(self, seconds: float) -> bool:
        """Whether `signum` arrived within `seconds`; False also when `wake`
        cut the wait short (the pipe carries every signal's number, and
        `wake`'s 0, which is none)."""
        ready, _, _ = select.select([self._read], [], [], seconds)
        if not ready:
            return False
        try:
            data = os.read(self._read, 64)
        except OSError:
            return False
        return any(byte == self.signum for byte in data)

    def wake(self) -> None:
        """Ends a `wait` in another thread at once (a thread being stopped)."""
        try:
            os.write(self._write, b"\0")
        except OSError:
            pass

    def close(self) -> None:
        """The previous wakeup fd and handler back, the pipe closed; once."""
        if self._closed:
            return
        self._closed = True
        signal.set_wakeup_fd(self._previous_fd)
        self._installed.restore()
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass
