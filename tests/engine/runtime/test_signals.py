"""engine.runtime.signals: the one owner of signal handlers (install, restore,
nesting, off the main thread, a signal as a byte on a pipe), and a scan of
engine/ and bin/ that no other module sets a handler."""

import ast
import os
import signal
import threading
from pathlib import Path

import pytest

from tfloop.engine.runtime import signals

REPO = Path(__file__).resolve().parents[3]
OWNER = REPO / "engine" / "runtime" / "signals.py"
#: What sets a handler (or where a signal goes) for the whole process.
SETTERS = frozenset({"signal", "set_wakeup_fd", "siginterrupt"})


def _handler_calls(path: Path) -> list[str]:
    """`signal.signal(...)`-like calls in `path`, and `from signal import signal`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "signal" and any(
                alias.name in SETTERS for alias in node.names):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: from signal import ...")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in SETTERS and isinstance(node.func.value, ast.Name)
              and node.func.value.id == "signal"):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: signal.{node.func.attr}")
    return found


def test_no_module_of_engine_or_bin_but_signals_sets_a_handler():
    scanned = [path for folder in ("engine", "bin") for path in (REPO / folder).rglob("*.py")]
    assert OWNER in scanned and len(scanned) > 50
    offenders = [call for path in scanned if path != OWNER for call in _handler_calls(path)]
    assert offenders == [], (
        "set signal handlers through tfloop.engine.runtime.signals (install, handling, "
        f"WakePipe), not directly: {offenders}")
    assert _handler_calls(OWNER)  # the scan sees the calls where they are


def _mark(signum, frame):
    pass


def test_handling_sets_the_handler_in_the_block_and_gives_the_previous_back():
    before = signal.getsignal(signal.SIGUSR1)
    with signals.handling(signal.SIGUSR1, _mark) as outer:
        assert outer.active and signal.getsignal(signal.SIGUSR1) is _mark
        with signals.handling(signal.SIGUSR1, signal.SIG_IGN):
            assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGUSR1) is _mark  # nested: the outer one back
    assert signal.getsignal(signal.SIGUSR1) == before
    assert not outer.active


@pytest.fixture
def default_sigusr2():
    """SIGUSR2 at its default action, as a process starts: importing bin/cli
    (other tests of this process do) gives it a do-nothing handler."""
    previous = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGUSR2, previous)


def test_restore_happens_once_and_a_handler_set_outside_python_comes_back_as_default(
        default_sigusr2, monkeypatch):
    installed = signals.install(signal.SIGUSR2, _mark)
    installed.restore()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    signal_signal = signal.signal
    calls = []

    def outside_python(signum, handler):  # what signal.signal says of a C handler
        calls.append(handler)
        signal_signal(signum, handler)
        return None

    monkeypatch.setattr(signal, "signal", outside_python)
    installed = signals.install(signal.SIGUSR2, _mark)
    installed.restore()
    installed.restore()
    assert calls == [_mark, signal.SIG_DFL]  # restored once, to the default action


def test_off_the_main_thread_nothing_is_set_and_nothing_fails():
    before = signal.getsignal(signal.SIGUSR1)
    seen = []

    def in_a_thread():
        with signals.handling(signal.SIGUSR1, _mark) as installed:
            seen.append((installed.active, signal.getsignal(signal.SIGUSR1)))
        seen.append(signals.WakePipe.open(signal.SIGUSR2))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join(timeout=30)
    assert seen == [(False, before), None]
    assert signal.getsignal(signal.SIGUSR1) == before


def test_a_wake_pipe_reports_its_signal_and_wakes_on_request_then_restores_everything():
    handler_before = signal.getsignal(signal.SIGUSR2)
    fd_before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd_before)
    pipe = signals.WakePipe.open(signal.SIGUSR2)
    assert pipe is not None
    try:
        assert not pipe.wait(0.01)  # nothing arrived
        os.kill(os.getpid(), signal.SIGUSR2)  # the default would end this process
        assert pipe.wait(10)
        pipe.wake()
        assert not pipe.wait(10)  # woken, but not by the signal
    finally:
        pipe.close()
        pipe.close()
    assert signal.getsignal(signal.SIGUSR2) == handler_before
    assert signal.set_wakeup_fd(fd_before) == fd_before


def test_an_arrival_is_told_on_the_relay_thread_and_the_previous_wakeup_fd_gets_every_byte():
    """`on_arrival`: the process's one wakeup fd is the relay's while it has
    listeners; what was there before (an event loop's) still gets each byte,
    and is put back with the last listener."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write)
    told = []
    arrived = threading.Event()
    try:
        with signals.handling(signal.SIGUSR1, _mark):
            arrival = signals.on_arrival(
                signal.SIGUSR1, lambda signum: (told.append(threading.current_thread().name),
                                                arrived.set()))
            assert arrival is not None
            try:
                os.kill(os.getpid(), signal.SIGUSR1)
                assert arrived.wait(10)
            finally:
                arrival.cancel()
                arrival.cancel()
        assert told == ["tfloop-signals"]
        assert bytes([signal.SIGUSR1]) in os.read(read, 64)  # the previous fd got the byte
    finally:
        back = signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
    assert back == write  # and was put back with the last listener
