"""engine.runtime.hang: the dump on a deadline and on SIGUSR2, and where it goes."""

import os
import signal
import stat
import subprocess
import sys
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
    before = signal.getsignal(signal.SIGUSR2)  # bin/cli's do-nothing once it was imported
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
    assert signal.getsignal(signal.SIGUSR2) == before


def test_an_unwritable_folder_sends_the_dump_to_the_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be")
    watch = _watch(blocked / "diagnostics")
    path = watch.dump("asked")
    folder = tmp_path / "tmp" / f"tfloop-diagnostics-{os.getuid()}"
    assert path == str(folder / f"hang-worker_1-{os.getpid()}-1.txt")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert "why: asked" in open(path).read()


# --- never through a link, never over a file (issue 29, item 3) -------------------------------


def _victim(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_bytes(b"precious\n")
    return victim


def _listing(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_dump_name_taken_by_a_link_or_a_file_passes_to_the_next_number(tmp_path):
    victim = _victim(tmp_path)
    diagnostics = tmp_path / "diagnostics"
    diagnostics.mkdir()
    pid = os.getpid()
    (diagnostics / f"hang-worker_1-{pid}-1.txt").symlink_to(victim / "thesis.tex")
    (diagnostics / f"hang-worker_1-{pid}-2.txt").write_text("an earlier process's dump\n")
    before = _listing(victim)
    watch = _watch(diagnostics)
    first, second = watch.dump("asked"), watch.dump("asked again")
    assert (first, second) == (str(diagnostics / f"hang-worker_1-{pid}-3.txt"),
                               str(diagnostics / f"hang-worker_1-{pid}-4.txt"))
    assert _listing(victim) == before
    assert (diagnostics / f"hang-worker_1-{pid}-2.txt").read_text() == "an earlier process's dump\n"
    assert stat.S_IMODE(os.stat(first).st_mode) & 0o133 == 0  # at most 0644


def test_a_diagnostics_folder_that_is_a_link_is_not_written_through(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    victim = _victim(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "diagnostics").symlink_to(victim)
    before = _listing(victim)
    path = _watch(tmp_path / "run" / "diagnostics").dump("asked")
    assert path.startswith(str(tmp_path / "tmp" / f"tfloop-diagnostics-{os.getuid()}") + "/")
    assert _listing(victim) == before


def test_a_planted_fallback_folder_is_refused(tmp_path, monkeypatch, caplog):
    """The fallback is per user: a link planted at its name (or a folder
    someone else owns, engine/runtime/test_files.py) is not used; the dump
    goes to the log instead."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    victim = _victim(tmp_path)
    (tmp_path / "tmp" / f"tfloop-diagnostics-{os.getuid()}").symlink_to(victim)
    (tmp_path / "file").write_text("a file where the folder would be")
    before, mode = _listing(victim), stat.S_IMODE(victim.stat().st_mode)
    assert _watch(tmp_path / "file" / "diagnostics").dump("asked") is None
    assert _listing(victim) == before and stat.S_IMODE(victim.stat().st_mode) == mode
    assert any("no directory was writable for the dump" in r.getMessage() and
               "why: asked" in r.getMessage() for r in caplog.records)


def test_the_folder_bin_launch_names_is_read_without_the_launcher(tmp_path, monkeypatch):
    """The variable's name lives in `launch/environment.py`, which the
    launcher sets and hang.py reads: hang.py imports nothing of the launcher."""
    import ast
    from pathlib import Path

    from tfloop.engine.runtime import hang
    from tfloop.launch import environment, launcher

    assert launcher.DIAGNOSTICS_ENV is environment.DIAGNOSTICS_ENV == "TFLOOP_DIAGNOSTICS_DIR"
    monkeypatch.setenv(environment.DIAGNOSTICS_ENV, str(tmp_path / "launch"))
    assert hang.directory_for(str(tmp_path / "run")) == str(tmp_path / "launch")
    monkeypatch.delenv(environment.DIAGNOSTICS_ENV)
    assert hang.directory_for(str(tmp_path / "run")) == str(tmp_path / "run")
    tree = ast.parse(Path(hang.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "tfloop.launch.environment" in imported
    assert not {name for name in imported if name and name.startswith("tfloop.launch.launcher")}


def test_the_launch_package_loads_its_launcher_only_when_asked():
    """`tfloop.launch`'s names resolve on first use: reading an environment
    variable's name (hang.py, the engine's start) does not load the launcher."""
    code = ("import sys; import tfloop.launch.environment; "
            "print('tfloop.launch.launcher' in sys.modules); "
            "from tfloop.launch import Launcher, TFConfigError; "
            "print('tfloop.launch.launcher' in sys.modules, Launcher.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["False", "True", "Launcher"], out.stderr
