"""`--local_checkpoint_dir`: fast local checkpoints every K steps beside the
durable ones; a restart resumes from the newest that reads, newer than the
durable one, and falls back to the durable one otherwise."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from helpers import bin_env, run_bin, run_python
from tfloop.engine import run
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir import local_checkpoints, local_folder

#: Runs the engine with a config (JSON) and SIGKILLs itself at the end of the loop that reaches a step.
KILL_AT_STEP = """
import json, os, signal, sys
from tfloop.engine import run
from tfloop.engine.config import RunConfig
kill_at = int(sys.argv[2])
def on_loop_end(step, metrics):
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
run(RunConfig(**json.loads(sys.argv[1])), on_loop_end=on_loop_end)
"""
SMALL = dict(global_batch_size=8, mode="train", export=False, seed=5, summary_interval=0)


def _weights(path):
    reader = tf.train.load_checkpoint(str(path))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if n.startswith("model_weights/")}


def test_a_kill_at_15_resumes_from_the_local_14_not_the_durable_10(tmp_path):
    model_dir, local = tmp_path / "run", tmp_path / "shm"
    flags = dict(SMALL, model_dir=str(model_dir), checkpoint_interval=10,
                 local_checkpoint_dir=str(local), local_checkpoint_interval=2)
    killed = run_python(
        ["-c", KILL_AT_STEP, json.dumps(dict(flags, train_steps=17, steps_per_loop=1)), "15"],
        timeout=300, env=bin_env())
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-10")
    folder = local_checkpoints.folder(str(local), str(model_dir))
    assert tf.train.latest_checkpoint(folder).endswith("ckpt-14")
    resumed = run_bin("train", f"--model_dir={model_dir}", "--train_steps=17",
                      "--steps_per_loop=20", "--checkpoint_interval=10",
                      f"--local_checkpoint_dir={local}", "--local_checkpoint_interval=2",
                      "--global_batch_size=8", "--mode=train", "--noexport", "--seed=5",
                      "--summary_interval=0")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (f"resuming from the local checkpoint {folder}/ckpt-14, newer than the durable "
            "ckpt-10") in resumed.stdout, resumed.stdout[-3000:]
    assert f"resuming from {folder}/ckpt-14 at step 14" in resumed.stdout
    # The durable one at the end; the run finished, so its local folder is gone.
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-17")
    assert not os.path.lexists(folder)
    # The reference in a process of its own too: this one's state (op determinism
    # another test enabled, say) can change float32 sums in the last bits.
    reference = tmp_path / "uninterrupted"
    uninterrupted = run_python(
        ["-c", KILL_AT_STEP, json.dumps(dict(
            SMALL, model_dir=str(reference), train_steps=17, devices="cpu:0")), "-1"],
        timeout=300, env=bin_env())
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    expected = _weights(reference)
    got = _weights(model_dir)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def _save(directory, step, value):
    """A small checkpoint `ckpt-<step>` in `directory`, as a manager writes it."""
    variable = tf.Variable(value)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable), str(directory),
                                         max_to_keep=5)
    return manager.save(checkpoint_number=step)


RUN_ID = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def run_with_local(tmp_path):
    """A run (run.json's id `RUN_ID`) with the durable ckpt-100 and, in its
    local folder (0700, holding the same id), ckpt-140 and ckpt-150."""
    model_dir, local = tmp_path / "run", tmp_path / "shm"
    durable = _save(model_dir, 100, 1.0)
    (model_dir / "run.json").write_text(json.dumps({"run_id": RUN_ID}))
    folder = local_checkpoints.folder(str(local), str(model_dir))
    assert local_folder.open_folder(folder) is None
    local_folder.claim(folder, RUN_ID)
    for step in (140, 150):
        _save(folder, step, float(step))
    loop = RunConfig(model_dir=str(model_dir), local_checkpoint_dir=str(local),
                     local_checkpoint_interval=10).loop  # the section the module reads
    return loop, durable, folder


def test_the_newest_local_checkpoint_that_reads_is_taken(run_with_local):
    config, durable, folder = run_with_local
    assert local_checkpoints.newer(config, durable, run_id=RUN_ID) == f"{folder}/ckpt-150"
    assert local_checkpoints.held(config, run_id=RUN_ID)
    for path in tf.io.gfile.glob(f"{folder}/ckpt-150.data-*"):
        with open(path, "r+b") as data:
            data.truncate(3)
    assert local_checkpoints.newer(config, durable, run_id=RUN_ID) == f"{folder}/ckpt-140"
    # Every durable one damaged (the plan passes None): the local one still counts.
    assert local_checkpoints.newer(config, None, run_id=RUN_ID) == f"{folder}/ckpt-140"


def test_the_durable_checkpoint_is_taken_otherwise(run_with_local, tmp_path):
    config, durable, folder = run_with_local
    # The durable one is newer (the run went on elsewhere), or the run was removed
    # (no run.json: no id), or model_dir was made again (another run's id):
    newer = _save(tmp_path / "run", 200, 2.0)
    assert local_checkpoints.newer(config, newer, run_id=RUN_ID) is None
    assert local_checkpoints.newer(config, durable, run_id=None) is None
    assert local_checkpoints.newer(config, durable, run_id="f" * 32) is None
    assert not local_checkpoints.held(config, run_id="f" * 32)
    # Another machine: no local folder at all; or none of the local ones reads.
    elsewhere = RunConfig(model_dir=config.model_dir, local_checkpoint_dir=str(tmp_path / "no"),
                          local_checkpoint_interval=10).loop
    assert local_checkpoints.newer(elsewhere, durable, run_id=RUN_ID) is None
    for path in tf.io.gfile.glob(f"{folder}/ckpt-*.index"):
        os.remove(path)
    assert local_checkpoints.newer(config, durable, run_id=RUN_ID) is None


def test_a_local_checkpoint_with_a_link_among_its_files_is_not_read(run_with_local, victim):
    """Only regular files count: `ckpt-150.index` a link (to a victim's file,
    or to a real index elsewhere) leaves step 150 out, and the run's next
    save removes the link as a link."""
    config, durable, folder = run_with_local
    index = os.path.join(folder, "ckpt-150.index")
    os.replace(index, victim / "moved.index")
    os.symlink(victim / "moved.index", index)
    assert local_checkpoints.newer(config, durable, run_id=RUN_ID) == f"{folder}/ckpt-140"
    local_folder.unlink_links(folder)
    assert not os.path.lexists(index) and (victim / "moved.index").exists()


def test_a_state_file_is_never_read_and_rotation_keeps_to_the_folder(run_with_local, victim):
    """The state file is removed when the run claims the folder (the manager
    would read it); rotation removes only the folder's own ckpt-<N>.* files,
    the newest two up to the step just saved kept (a newer one is a history
    training left)."""
    config, durable, folder = run_with_local
    with open(os.path.join(folder, "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "{victim}/thesis"\n')
    _save(folder, 160, 1.0)
    (victim / "keep.me").write_text("x")
    os.symlink(victim / "keep.me", os.path.join(folder, "notes"))
    local_folder.claim(folder, RUN_ID)
    assert not os.path.exists(os.path.join(folder, "checkpoint"))
    local_folder.rotate(folder, local_checkpoints.TO_KEEP, 150)
    assert sorted(local_folder.checkpoints(folder)) == [140, 150]
    assert os.path.islink(os.path.join(folder, "notes")) and (victim / "keep.me").exists()


def test_a_folder_is_checked_without_following_links_and_made_0700(tmp_path, victim):
    made = tmp_path / "shm" / "tfloop-a"
    assert local_folder.open_folder(str(made)) is None
    assert os.stat(made).st_mode & 0o777 == 0o700
    older = tmp_path / "shm" / "tfloop-b"
    older.mkdir(mode=0o755)  # an older tfloop's: ours, others may only read it
    os.chmod(older, 0o755)
    assert local_folder.open_folder(str(older)) is None
    assert os.stat(older).st_mode & 0o777 == 0o700
    link = tmp_path / "shm" / "tfloop-c"
    link.symlink_to(victim)
    assert local_folder.open_folder(str(link)) == f"is a symbolic link (to {victim})"
    anyone = tmp_path / "anyone"
    anyone.mkdir()
    os.chmod(anyone, 0o777)  # no sticky bit: anyone could swap a folder in it
    assert "no sticky bit" in local_folder.open_folder(str(anyone / "tfloop-d"))
    os.chmod(anyone, 0o1777)
    assert local_folder.open_folder(str(anyone / "tfloop-d")) is None


@pytest.mark.parametrize("flags, message", [
    (dict(local_checkpoint_dir="/tmp/x"), "--local_checkpoint_dir=/tmp/x needs its partner"),
    (dict(local_checkpoint_interval=10), "--local_checkpoint_interval=10 needs its partner"),
    (dict(local_checkpoint_interval=-1), "--local_checkpoint_interval=-1 must be 0 or more"),
])
def test_local_checkpoint_flags_without_their_partner_are_refused(flags, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**flags)


def test_local_checkpoints_with_ps_tasks_or_on_a_url_are_refused_before_anything_is_written(
        tmp_path):
    config = RunConfig(model_dir=str(tmp_path / "run"), local_checkpoint_dir=str(tmp_path),
                       local_checkpoint_interval=10)
    with pytest.raises(ConfigError, match="a parameter-server cluster's variables live on"):
        local_checkpoints.check(config.loop, asynchronous_cluster=True)
    url = RunConfig(model_dir=str(tmp_path / "run"), local_checkpoint_dir="gs://b/x",
                    local_checkpoint_interval=10)
    with pytest.raises(ConfigError, match="is a URL; name a local folder"):
        local_checkpoints.check(url.loop, asynchronous_cluster=False)
    with pytest.raises(ConfigError, match="is a URL"):
        run(url)
    assert not (tmp_path / "run").exists()
