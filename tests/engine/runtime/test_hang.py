"""engine.runtime.hang: the dump on a deadline and on SIGUSR2, and where it goes."""

import os
import signal
import tempfile
import time

from tfloop.engine.runtime.hang import HangWatch


def _watch(directory, **overrides):
    settings = dict(timeout=0, task="worker:1", directory=str(directory),
                    file_name=lambda n: f"hang-worker_1-{os.getpid()}-{n}.txt",
                    phase=lambda: ("train", (10, 20)),
                    step_phase=lambda: "input (waiting on next(iterator), the tf.data pipeline)")
    settings.update(overrides)
    return HangWatch(**settings)


def _wait_for_dumps(watch, count, seconds=20):
    deadline = time.monotonic() + seconds
    while len(watch.dumps) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return watch.dumps


def test_no_loop_within_the_timeout_dumps_stacks_phase_and_step_and_goes_on(tmp_path):
    watch = _watch(tmp_path / "diagnostics", timeout=0.3).start()
    try:
        watch.loop_ended(10)
        dumps = _wait_for_dumps(watch, 1)
    finally:
        watch.stop()
    assert dumps and dumps[0] == str(tmp_path / "diagnostics" / f"hang-worker_1-{os.getpid()}-1.txt")
    text = open(dumps[0]).read()
    assert text.startswith(f"hang dump: worker:1 (pid {os.getpid()}, host ")
    assert "why: no train loop ended in 0.3 s (--hang_timeout)" in text
    assert "last completed step: 10 (its loop ended" in text
    assert ("phase: train (the compiled loop from step 10 to 20); inside the step: input "
            "(waiting on next(iterator)") in text
    # Every thread's stack, this test's own frame in the main thread's.
    assert "--- thread MainThread" in text and "--- thread tfloop-hang-watch" in text
    assert "_wait_for_dumps" in text


def test_sigusr1_dumps_at_once_without_a_deadline(tmp_path):
    watch = _watch(tmp_path, phase=lambda: ("save", (0, 0))).start()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        dumps = _wait_for_dumps(watch, 1)
    finally:
        watch.stop()
    text = open(dumps[0]).read()
    assert "why: asked (SIGUSR2" in text and "phase: save (writing a checkpoint)" in text
    assert "last completed step: none in this process" in text
    # Uninstalled: the handler before it is back.
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_an_unwritable_folder_sends_the_dump_to_the_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be")
    watch = _watch(blocked / "diagnostics")
    path = watch.dump("asked")
    assert path == str(tmp_path / "tmp" / "tfloop-diagnostics" / f"hang-worker_1-{os.getpid()}-1.txt")
    assert "why: asked" in open(path).read()
