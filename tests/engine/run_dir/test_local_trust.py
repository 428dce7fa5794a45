"""A local checkpoint folder is this run's or it is not used (issue 38, item 2).

The folder `<local_checkpoint_dir>/tfloop-<digest of model_dir>` has a name
anyone can compute. Each planted case runs a tiny mlp in process beside a
*victim* folder and checks that the victim's fingerprint (every path, its
bytes, mtime and link target: `helpers.fingerprint`) is unchanged and that
the run went on; then identity (a `model_dir` made again is another run),
clean-up, the resume choice when the durable checkpoint is damaged, and the
one line of a failed local save. `engine/run_dir/local_folder.py` says why.
"""

import json
import logging
import os
import shutil

import pytest
import tensorflow as tf

from helpers import fingerprint, run_bin
from tfloop.engine import run
from tfloop.engine.config import RunConfig
from tfloop.engine.run_dir import checkpoint_files, local_checkpoints

#: Local checkpoints at 5, 10, 15 (a durable one only at the end), two kept.
TINY = dict(model="mlp", dataset="synthetic", global_batch_size=16, steps_per_loop=5,
            mode="train", export=False, summary_interval=0, devices="cpu:0", seed=5,
            checkpoint_interval=100, local_checkpoint_interval=5)


class Stop(Exception):
    """What a test's hook raises to end a run at a step, its local folder kept
    (a failed run's, as after a kill: not finished, so not cleaned up)."""


def _run(model_dir, local, *, stop_at=None, on_loop_end=None, **flags):
    """A TINY run of `model_dir` with local checkpoints in `local`;
    `stop_at`: the step whose loop end raises `Stop` (before that step's saves)."""
    def hook(step, metrics):
        if on_loop_end:
            on_loop_end(step)
        if step == stop_at:
            raise Stop(step)
    config = RunConfig(**{**TINY, "train_steps": 20, **flags}, model_dir=str(model_dir),
                       local_checkpoint_dir=str(local))
    if stop_at is None:
        return run(config, on_loop_end=hook)
    with pytest.raises(Exception):
        run(config, on_loop_end=hook)
    return None


def _save(directory, step, value):
    """A small checkpoint `ckpt-<step>` in `directory`, as a manager writes it."""
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(value)),
                                         str(directory), max_to_keep=5)
    return manager.save(checkpoint_number=step)


def _own_folder(local, model_dir):
    """This run's folder, made by the test as the run would (0700, this user's)."""
    path = local_checkpoints.folder(str(local), str(model_dir))
    os.makedirs(local, exist_ok=True)
    os.mkdir(path, 0o700)
    return path


def _warnings(caplog, text):
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and text in r.getMessage()]


# --- planted: each leaves the victim as it was -----------------------------------------------

def test_a_planted_state_file_naming_a_victims_checkpoints_deletes_nothing(tmp_path):
    """The state file names the victim's checkpoints by absolute path and by
    `../`: TensorFlow's manager took them as its own and rotation deleted them."""
    model_dir, local, victim = tmp_path / "run", tmp_path / "shm", tmp_path / "victim"
    first, second = _save(victim, 1, 1.0), _save(victim, 2, 2.0)
    folder = _own_folder(local, model_dir)
    relative = os.path.relpath(second, folder)
    with open(os.path.join(folder, "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "{relative}"\n'
                f'all_model_checkpoint_paths: "{first}"\n'
                f'all_model_checkpoint_paths: "{relative}"\n'
                "all_model_checkpoint_timestamps: 1000.0\n"
                "all_model_checkpoint_timestamps: 1001.0\n"
                "last_preserved_timestamp: 1.0\n")
    before = fingerprint(victim)
    result = _run(model_dir, local)
    assert result["step"] == 20 and result["status"] == "finished"
    assert fingerprint(victim) == before


def test_a_local_folder_that_is_a_link_to_a_victims_model_dir_is_not_written_through(
        tmp_path, caplog):
    """The folder's name a link to another run's model_dir: the run wrote its
    ckpt-10 over the victim's and rewrote its state file."""
    model_dir, local, victim = tmp_path / "run", tmp_path / "shm", tmp_path / "victim_run"
    _save(victim, 10, 1.0)
    local.mkdir()
    folder = local_checkpoints.folder(str(local), str(model_dir))
    os.symlink(victim, folder)
    before = fingerprint(victim)
    caplog.set_level(logging.INFO)
    result = _run(model_dir, local)
    assert result["status"] == "finished"
    assert fingerprint(victim) == before
    assert os.readlink(folder) == str(victim)  # not ours to remove either
    assert _warnings(caplog, "local checkpoint") == [
        f"not using the local checkpoint folder {folder}: it is a symbolic link (to {victim}); "
        "this run neither resumes from nor saves local checkpoints there and goes on with "
        "durable checkpoints every 100 steps (remove it, or give another "
        "--local_checkpoint_dir)"]


def test_links_inside_the_folder_are_not_written_through(tmp_path, victim):
    """`ckpt-5.index` a link to a victim's file before the run, `ckpt-10.index`
    one planted while it runs: TensorFlow wrote each checkpoint's index through it."""
    model_dir, local = tmp_path / "run", tmp_path / "shm"
    folder = _own_folder(local, model_dir)
    os.symlink(victim / "thesis.tex", os.path.join(folder, "ckpt-5.index"))

    def plant(step):
        if step == 5:
            os.symlink(victim / "saved_model.pb", os.path.join(folder, "ckpt-10.index"))
    before = fingerprint(victim)
    result = _run(model_dir, local, on_loop_end=plant)
    assert result["status"] == "finished"
    assert fingerprint(victim) == before


def _writable_by_others(path, monkeypatch):
    os.chmod(path, 0o777)


def _another_users(path, monkeypatch):
    """chown to another uid where the suite runs as root; elsewhere (no chown
    without root) this process's uid is faked to differ from the folder's."""
    if os.getuid() == 0:
        os.chown(path, 4242, 4242)
    else:
        real = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: real + 1)


@pytest.mark.parametrize("make_untrusted", [_writable_by_others, _another_users],
                         ids=["mode_0777", "another_users_chown_as_root_else_faked_getuid"])
def test_a_planted_folder_another_user_can_fill_is_not_resumed_from(tmp_path, make_untrusted,
                                                                     monkeypatch):
    """A folder at the run's name with a checkpoint newer than the durable one
    (and run.json's run id copied in: model_dir is readable): resumed from."""
    model_dir, local = tmp_path / "run", tmp_path / "shm"
    _run(model_dir, local, train_steps=10, checkpoint_interval=10)  # durable ckpt-10, run.json
    folder = local_checkpoints.folder(str(local), str(model_dir))
    shutil.rmtree(folder, ignore_errors=True)
    os.mkdir(folder)
    for name in os.listdir(model_dir):
        if name.startswith("ckpt-10."):
            shutil.copy(model_dir / name, os.path.join(folder, name.replace("-10.", "-15.")))
    with open(model_dir / "run.json") as f, open(os.path.join(folder, "run_id"), "w") as out:
        out.write(json.load(f).get("run_id", "") + "\n")
    make_untrusted(folder, monkeypatch)
    before = fingerprint(local)
    result = _run(model_dir, local, train_steps=20, checkpoint_interval=10)
    assert result["resumed_from"] == f"{model_dir}/ckpt-10", result["resumed_from"]
    assert result["step"] == 20
    assert fingerprint(local) == before


# --- identity, clean-up ---------------------------------------------------------------------

def test_a_model_dir_removed_and_made_again_does_not_adopt_the_old_runs_local_checkpoints(
        tmp_path):
    """Run A stops at step 15 (local ckpt-5 and ckpt-10 kept: it did not
    finish); its model_dir is removed; run B at the same path stops at step 5
    (run.json written, nothing saved); B again: it adopted A's ckpt-10."""
    model_dir, local = tmp_path / "run", tmp_path / "shm"
    folder = local_checkpoints.folder(str(local), str(model_dir))
    _run(model_dir, local, stop_at=15)
    assert sorted(checkpoint_files.on_disk(folder)) == [5, 10]  # a failed run keeps its own
    shutil.rmtree(model_dir)
    _run(model_dir, local, stop_at=5, seed=6)
    result = _run(model_dir, local, seed=6)
    assert result["resumed_from"] is None and result["start_step"] == 0
    assert result["step"] == 20


def test_stale_temp_folders_go_at_start_and_the_folder_when_training_is_over(tmp_path):
    model_dir, local = tmp_path / "run", tmp_path / "shm"
    folder = _own_folder(local, model_dir)
    stale = os.path.join(folder, "ckpt-3_temp")
    os.mkdir(stale)
    with open(os.path.join(stale, "part-00000-of-00001.index"), "wb") as f:
        f.write(b"cut short")
    seen = {}
    result = _run(model_dir, local, on_loop_end=lambda step: seen.setdefault(
        step, sorted(os.listdir(folder))))
    assert "ckpt-3_temp" not in seen[5], seen[5]
    assert result["status"] == "finished"
    assert not os.path.lexists(folder) and os.listdir(local) == []
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-20")


# --- the resume choice and the failure line --------------------------------------------------

def test_a_damaged_durable_checkpoint_with_a_newer_local_one_resumes_from_the_local_one(
        tmp_path):
    """Durable ckpt-10 damaged, local ckpt-15 good: `bin/train` said "none of
    them reads ... start from step 0" and exited 2."""
    model_dir, local = tmp_path / "run", tmp_path / "shm"
    flags = dict(train_steps=30, checkpoint_interval=10)
    _run(model_dir, local, stop_at=20, **flags)
    folder = local_checkpoints.folder(str(local), str(model_dir))
    assert sorted(checkpoint_files.on_disk(folder)) == [5, 15]
    data = [n for n in os.listdir(model_dir) if n.startswith("ckpt-10.data")]
    with open(model_dir / data[0], "r+b") as f:
        f.truncate(3)
    damaged = sorted(n for n in os.listdir(model_dir) if n.startswith("ckpt-10."))
    resumed = run_bin("train", f"--model_dir={model_dir}", "--train_steps=30",
                      "--checkpoint_interval=10", f"--local_checkpoint_dir={local}",
                      "--local_checkpoint_interval=5", "--steps_per_loop=5",
                      "--global_batch_size=16", "--mode=train", "--noexport", "--seed=5",
                      "--summary_interval=0", "--devices=cpu:0")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {folder}/ckpt-15 at step 15" in resumed.stdout, resumed.stdout[-3000:]
    assert f"; resuming from {folder}/ckpt-15" in resumed.stdout  # after "ckpt-10 is damaged"
    assert sorted(os.listdir(model_dir / "damaged")) == damaged
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-30")


def test_a_failed_local_save_is_one_warning_and_says_training_goes_on(tmp_path, caplog):
    """Files planted where the saves of steps 10 and 15 put their temporary
    folders make both fail: the line said "run the same command to resume"
    while training went on, at every interval."""
    model_dir, local = tmp_path / "run", tmp_path / "shm"
    folder = local_checkpoints.folder(str(local), str(model_dir))

    def block(step):
        if step == 5:
            for later in (10, 15):
                with open(os.path.join(folder, f"ckpt-{later}_temp"), "w") as f:
                    f.write("in the way")
    caplog.set_level(logging.INFO)
    result = _run(model_dir, local, on_loop_end=block)
    assert result["status"] == "finished"
    lines = _warnings(caplog, "local checkpoint")
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"local checkpoint at step 10 not saved in {folder} (")
    assert lines[0].endswith("); training goes on with durable checkpoints every 100 steps "
                             "(said once; the next local saves are still tried)")
    assert not any("run the same command" in r.getMessage() for r in caplog.records)
