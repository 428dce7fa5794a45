"""`--model_dir` and the filesystem under it, as an adversarial user leaves them.

Each case is one line (a `ConfigError`, or a `RunFailure` for a full disk)
and changes nothing it should not: a lock file that is a symlink is never
followed (its target keeps its content), a dangling symlink creates nothing,
a failed atomic write leaves the previous file and no temporary one.
"""

import errno
import json
import logging
import os

import pytest
import tensorflow as tf

from tfloop.engine.run_dir import layout, refusals, run_identity, run_lock
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError, RunFailure
from tfloop.engine.assembly.run import run
from tfloop.engine.runtime import files

SMALL = dict(strategy="one_device", devices="cpu:0", train_steps=4, steps_per_loop=2,
             global_batch_size=32, summary_interval=0, export=False)
#: The tests that damage a copy of the module's one trained run (`trained_copy`,
#: tests/engine/conftest.py): on one worker, so that the run is trained once.
TRAINED = pytest.mark.xdist_group("test_model_dir_faults_trained")


# --- the run lock -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", [run_lock.TRAIN, run_lock.EVALUATE])
def test_a_symlinked_lock_file_is_refused_and_its_target_is_untouched(tmp_path, name):
    model_dir, victim = tmp_path / "run", tmp_path / "victim.txt"
    model_dir.mkdir()
    victim.write_text("precious\n")
    (model_dir / f"{name}.lock").symlink_to(victim)
    expected = (f"{model_dir}/{name}.lock is a symbolic link, not a lock file: remove it "
                f"(rm {model_dir}/{name}.lock) and run again")
    for attempt in (run_lock.check_free, run_lock.acquire):
        with pytest.raises(ConfigError) as error:
            attempt(str(model_dir), name)
        assert str(error.value) == expected
    assert victim.read_text() == "precious\n"
    assert (model_dir / f"{name}.lock").is_symlink()


def test_a_symlinked_lock_stops_bin_train_in_one_line(tmp_path):
    model_dir, victim = tmp_path / "run", tmp_path / "victim.txt"
    model_dir.mkdir()
    victim.write_text("precious\n")
    (model_dir / "train.lock").symlink_to(victim)
    with pytest.raises(ConfigError, match="is a symbolic link, not a lock file"):
        run(RunConfig(model_dir=str(model_dir), **SMALL))
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in model_dir.iterdir()) == ["train.lock"]


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_lock_file_that_is_not_a_file_is_refused_without_blocking(tmp_path, kind):
    """A FIFO would block the read-only probe's open forever; a directory
    cannot be written: both are one line."""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    lock = model_dir / "train.lock"
    lock.mkdir() if kind == "directory" else os.mkfifo(lock)
    for attempt in (run_lock.check_free, run_lock.acquire):
        with pytest.raises(ConfigError) as error:
            attempt(str(model_dir))
        assert str(error.value) == (f"{lock} is a {kind}, not a lock file: move it away "
                                    "and run again")


# --- the model_dir path itself ----------------------------------------------------------------

@pytest.mark.parametrize("below", [False, True])
def test_a_dangling_symlink_model_dir_is_one_line_and_creates_nothing(tmp_path, below):
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "gone")
    model_dir = link / "sub" if below else link
    with pytest.raises(ConfigError) as error:
        run(RunConfig(model_dir=str(model_dir), **SMALL))
    assert str(error.value) == (
        f"--model_dir={model_dir} cannot be created: {link} is a symbolic link to "
        f"{tmp_path / 'gone'}, which does not exist; create that directory, or remove the "
        "link")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and link.is_symlink()


def test_a_symlink_loop_model_dir_is_one_line(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ConfigError, match=r"is a symbolic link loop; point .* at a directory"):
        refusals.check_model_dir(str(tmp_path / "a"))


def test_a_symlink_to_a_directory_is_a_model_dir_like_any_other(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "real")
    record = run(RunConfig(model_dir=str(tmp_path / "run"), **SMALL))
    assert record["status"] == "finished" and record["step"] == 4
    assert (tmp_path / "real" / "ckpt-4.index").exists()
    assert (tmp_path / "run").is_symlink()


def test_an_in_memory_model_dir_says_at_start_that_nothing_outlives_the_process(caplog):
    with caplog.at_level(logging.INFO, logger="tfloop"):
        record = run(RunConfig(model_dir="ram://tfloop-model-dir-faults/run", **SMALL))
    assert record["status"] == "finished"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and r.name != "tfloop.engine.observe.step_time"]  # a 4-step run may be input-bound
    assert warnings == [
        "--model_dir=ram://tfloop-model-dir-faults/run is in memory: its checkpoints, "
        "metrics.json and export vanish when this process ends; use a local path or gs:// "
        "to keep them"]


# --- a full disk outside a checkpoint save ----------------------------------------------------

_FULL = {  # as TensorFlow's filesystem and Python's own say it, by the file being written
    "tf": lambda name: tf.errors.ResourceExhaustedError(
        None, None, f"{name}; No space left on device"),
    "os": lambda name: OSError(errno.ENOSPC, "No space left on device", name),
}


@pytest.mark.parametrize("error", sorted(_FULL))
def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(
        tmp_path, monkeypatch, error):
    path = tmp_path / "metrics.json"
    path.write_text('{"status": "running"}\n')
    real = files.create_exclusively

    class FullDisk:
        def __init__(self, name, mode=files.FILE_MODE):
            self.name, self.out = name, real(name, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.out.close()

        def write(self, text):
            self.out.write(text[:3])  # part of it reached the disk, then it filled
            self.out.flush()
            raise _FULL[error](self.name)

    monkeypatch.setattr(files, "create_exclusively", FullDisk)
    with pytest.raises(RunFailure) as failure:
        layout.write_json(str(path), {"status": "finished"})
    message = str(failure.value)
    assert message.startswith(f"could not write {path} (No space left on device); ")
    assert " free in " + str(tmp_path) in message and "\n" not in message
    assert path.read_text() == '{"status": "running"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_a_failed_rename_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "run.json"

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files.os, "replace", refused)
    with pytest.raises(RunFailure, match=r"^could not write .*run.json \(Permission "
                                         r"denied\); .* free in .*: make .* writable and run"):
        layout.write_json(str(path), {"a": 1})
    assert list(tmp_path.iterdir()) == []


def test_the_free_space_of_a_url_is_unknown(monkeypatch):
    def full(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    monkeypatch.setattr(tf.io.gfile, "rename", full)
    with pytest.raises(RunFailure, match=r"free space unknown in ram://tfloop-full/run"):
        layout.write_json("ram://tfloop-full/run/metrics.json", {"a": 1})
    assert tf.io.gfile.glob("ram://tfloop-full/run/metrics.json*") == []


@TRAINED
def test_a_full_disk_at_start_up_is_one_line_and_keeps_the_previous_record(
        trained_copy, tmp_path, monkeypatch):
    model_dir = trained_copy  # a finished 4-step run
    before = {name: (model_dir / name).read_bytes() for name in ("metrics.json", "run.json")}
    real = files.create_exclusively

    def full_disk(name, mode=files.FILE_MODE):
        if files.TEMPORARY_INFIX in name:
            raise OSError(errno.ENOSPC, "No space left on device", name)
        return real(name, mode)

    monkeypatch.setattr(files, "create_exclusively", full_disk)
    with pytest.raises(RunFailure, match=r"^could not write .* \(No space left on device\); "):
        run(RunConfig(model_dir=str(model_dir), **{**SMALL, "train_steps": 8}))
    assert json.loads(before["metrics.json"])["step"] == 4
    assert {name: (model_dir / name).read_bytes() for name in before} == before
    assert not [p for p in model_dir.iterdir() if files.TEMPORARY_INFIX in p.name]
    assert json.loads(before["metrics.json"])["status"] == "finished"


# --- the campaign: more of the same class -----------------------------------------------------

def test_a_lock_file_that_may_not_be_opened_is_one_line(tmp_path, monkeypatch):
    """(chmod 444 by another user; simulated: root would open it anyway.)"""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "train.lock").write_text("1 host\n")
    real_open = os.open

    def denied(path, flags, *args):
        if str(path).endswith("train.lock") and flags & os.O_RDWR:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(ConfigError) as error:
        run_lock.acquire(str(model_dir))
    assert str(error.value) == (
        f"{model_dir}/train.lock cannot be opened to take the lock (Permission denied); make "
        "it writable (chmod u+w) or remove it, and run again")


@pytest.mark.parametrize("model_dir, expected", [
    ("~/tfloop-runs/a", "starts with ~, which nothing expanded (the shell does not after "
                        "--model_dir=); write {home}/tfloop-runs/a, or --model_dir "
                        "~/tfloop-runs/a (with a space)"),
    (os.fsdecode(b"/tmp/caf\xe9/run"), "--model_dir=/tmp/caf\\xe9/run is not valid UTF-8"),
])
def test_a_model_dir_spelled_so_it_cannot_mean_what_was_meant_is_refused(
        tmp_path, monkeypatch, model_dir, expected):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    expected = expected.format(home=tmp_path)
    for attempt in (lambda: RunConfig(model_dir=model_dir, **SMALL),
                    lambda: run_identity.load(model_dir)):  # what bin/train reads first
        with pytest.raises(ConfigError) as error:
            attempt()
        assert expected in str(error.value) and "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_a_model_dir_name_too_long_for_the_filesystem_is_one_line(tmp_path):
    model_dir = tmp_path / ("x" * 300) / "run"
    with pytest.raises(ConfigError, match=r"cannot be created: the name x+\.\.\. is 300 bytes, "
                                          r"and names in .* may have at most \d+; choose"):
        refusals.check_model_dir(str(model_dir))
    with pytest.raises(ConfigError, match=r"bytes long, which leaves too little of the \d+"):
        refusals.check_model_dir(str(tmp_path / "/".join(["y" * 200] * 20)))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, flags", [
    ("summaries", {}), ("summaries/eval", {}), ("export", dict(export=True)),
    ("best", dict(best_metric="eval/loss", mode="train_and_evaluate")),
])
def test_a_file_where_the_run_keeps_a_directory_is_refused_before_training(
        tmp_path, name, flags):
    """It failed with a traceback at the first summary, or at the export
    after all of training."""
    model_dir = tmp_path / "run"
    (model_dir / name).parent.mkdir(parents=True)
    (model_dir / name).write_text("mine")
    with pytest.raises(ConfigError) as error:
        run(RunConfig(model_dir=str(model_dir), **{**SMALL, **flags}))
    assert str(error.value) == (f"{model_dir}/{name} is a file, where the run keeps a "
                                "directory; move it away and run again")
    assert (model_dir / name).read_text() == "mine" and not list(model_dir.glob("ckpt-*"))


def test_a_file_named_like_a_directory_this_run_does_not_use_is_left_alone(tmp_path):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    for name in ("export", "best"):
        (model_dir / name).write_text("mine")
    assert run(RunConfig(model_dir=str(model_dir), **SMALL))["status"] == "finished"


@TRAINED
@pytest.mark.parametrize("name, error_type, message", [
    ("run.json", ConfigError, "{d}/run.json cannot be read (Is a directory); restore it, or "
                              "move it away to start that record afresh"),
    ("checkpoint", ConfigError, "{d}/checkpoint is a directory, where the checkpoints' state "
                                "file belongs; move it away and run again"),
    ("metrics.json", RunFailure, "could not write {d}/metrics.json (Is a directory); "),
])
def test_a_directory_where_a_state_file_belongs_is_one_line_and_nothing_is_lost(
        trained_copy, tmp_path, name, error_type, message):
    model_dir = trained_copy
    target = model_dir / name
    if target.exists():
        target.unlink()
    target.mkdir()
    checkpoints = sorted(p.name for p in model_dir.glob("ckpt-*"))
    with pytest.raises(error_type) as error:
        run(RunConfig(model_dir=str(model_dir), **{**SMALL, "train_steps": 8}))
    assert message.format(d=model_dir) in str(error.value) and "\n" not in str(error.value)
    assert target.is_dir() and sorted(p.name for p in model_dir.glob("ckpt-*")) == checkpoints
