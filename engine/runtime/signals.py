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

`on_arrival` is the other way a signal reaches Python code: as a byte on the
process's wakeup fd (`signal.set_wakeup_fd`, written by CPython's C-level
handler), read by one relay thread that calls the signal's listeners at once,
even while the main thread is blocked inside TensorFlow, where no Python
handler runs until the call returns. The stop request uses it to end a
compiled loop at its next step (`engine.loop.preemption`), the hang watch to
dump on SIGUSR2 (`WakePipe`, a listener that is a pipe to wait on). There is
one wakeup fd per process, hence one relay for all of them.

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


class Arrival:
    """A listener of `on_arrival`; `cancel()` ends it (once)."""

    def __init__(self, relay: "_Relay", signum: int, callback: Callable[[int], Any]):
        self._relay, self.signum, self.callback = relay, signum, callback
        self._cancelled = False

    def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            self._relay.remove(self)


class _Relay:
    """The process's one wakeup fd (`signal.set_wakeup_fd` takes one), read by
    one thread that calls each listener of the signal that arrived. Set while
    it has listeners; what it replaced is put back with the last one, and
    gets every byte meanwhile (an event loop's own wakeup fd keeps working)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._listeners: list[Arrival] = []
        self._read = self._write = -1
        self._previous_fd = -1
        self._thread: Optional[threading.Thread] = None

    def add(self, signum: int, callback: Callable[[int], Any]) -> Optional[Arrival]:
        with self._lock:
            if not self._listeners and not self._open():
                return None
            arrival = Arrival(self, signum, callback)
            self._listeners.append(arrival)
            return arrival

    def remove(self, arrival: Arrival) -> None:
        with self._lock:
            if arrival in self._listeners:
                self._listeners.remove(arrival)
            # Only the main thread can put the previous wakeup fd back; off it the
            # relay stays (closing its pipe would let CPython write signal bytes into
            # whatever file takes that fd number next).
            if self._listeners or self._thread is None or not on_main_thread():
                return
            thread, self._thread = self._thread, None
            signal.set_wakeup_fd(self._previous_fd)
            read, write, self._read, self._write = self._read, self._write, -1, -1
        _write_byte(write, 0)  # the thread sees its pipe's end and leaves
        thread.join(timeout=10)
        for fd in (read, write):
            try:
                os.close(fd)
            except OSError:
                pass

    def _open(self) -> bool:
        if not on_main_thread():
            return False
        read, write = os.pipe()
        os.set_blocking(write, False)  # set_wakeup_fd requires it
        try:
            self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read)
            os.close(write)
            return False
        self._read, self._write = read, write
        self._thread = threading.Thread(target=self._relay, args=(read, write),
                                        name="tfloop-signals", daemon=True)
        self._thread.start()
        return True

    def _relay(self, read: int, write: int) -> None:
        while True:
            try:
                data = os.read(read, 64)
            except OSError:
                return
            with self._lock:
                if self._write != write:  # closed: the last listener left
                    return
                listeners, previous = list(self._listeners), self._previous_fd
            if previous >= 0:
                for byte in data:
                    _write_byte(previous, byte)
            for byte in data:
                for arrival in listeners:
                    if arrival.signum == byte:
                        arrival.callback(byte)


def _write_byte(fd: int, byte: int) -> None:
    try:
        os.write(fd, bytes([byte]))
    except OSError:
        pass


_RELAY = _Relay()


def on_arrival(signum: int, callback: Callable[[int], Any]) -> Optional[Arrival]:
    """`callback(signum)`, on the relay's thread, the moment `signum` arrives:
    also while the main thread is blocked inside TensorFlow, where a Python
    handler runs only once the call returns (a compiled loop: its end).
    CPython writes the byte only for a signal that has a Python-level handler:
    install one too (`install`). None off the main thread, or where the
    wakeup fd cannot be set. The callback must be quick and must not raise."""
    return _RELAY.add(signum, callback)


class WakePipe:
    """`signum` arriving as a byte on a pipe that `wait` selects on.

    The Python-level handler does nothing (some default actions, SIGUSR2's,
    end the process); the relay (`on_arrival`) writes the signal's number to
    this pipe whatever the main thread is doing. Open it with
    `WakePipe.open` (None off the main thread, or when the wakeup fd cannot be
    set); `close` ends the listening and restores the handler.
    """

    def __init__(self, signum: int, read: int, write: int, installed: Installed):
        self.signum = signum
        self._read, self._write = read, write
        self._installed = installed
        self._arrival: Optional[Arrival] = None
        self._closed = False

    @classmethod
    def open(cls, signum: int) -> Optional["WakePipe"]:
        if not on_main_thread():
            return None
        read, write = os.pipe()
        os.set_blocking(write, False)
        pipe = cls(signum, read, write, install(signum, lambda *_: None))
        pipe._arrival = on_arrival(signum, lambda number: _write_byte(write, number))
        if pipe._arrival is None:
            pipe.close()
            return None
        return pipe

    def wait(self, seconds: float) -> bool:
        """Whether `signum` arrived within `seconds`; False also when `wake`
        cut the wait short (it writes 0, which is no signal)."""
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
        _write_byte(self._write, 0)

    def close(self) -> None:
        """The listening ended, the handler back, the pipe closed; once."""
        if self._closed:
            return
        self._closed = True
        if self._arrival is not None:
            self._arrival.cancel()
        self._installed.restore()
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass
