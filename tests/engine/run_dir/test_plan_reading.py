"""`engine.run_dir.plan_reading.read_for_plan`: the plan's one trip into the
run directory, answered by one frozen record, with nothing written."""

import dataclasses
import json

import pytest
import tensorflow as tf

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir import local_checkpoints, local_folder, plan_reading, run_lock
from tfloop.launch import tf_config

RUN_ID = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def outside_a_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    return tf_config.current_role()


def _save(directory, step):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(float(step))),
                                         str(directory), max_to_keep=5)
    return manager.save(checkpoint_number=step)


def _read(config, role, mode):
    """`read_for_plan` handed the sections of `config` it reads, as the plan hands them."""
    return plan_reading.read_for_plan(config.loop, config.keeping, role, mode,
                                      init_from=config.init_from, compares_workers=True)


def _check_identity(found, config):
    found.check_identity(config.model_and_data, config.loop, config.optimizer, task_object=False)


def _listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_new_run_reads_nothing_and_the_chief_gets_a_fresh_id(tmp_path, outside_a_cluster):
    config = RunConfig(model_dir=str(tmp_path / "run"))
    found = _read(config, outside_a_cluster, "train")
    assert (found.run_json, found.resuming, found.resumed, found.latest_checkpoint) == (
        None, False, None, None)
    assert found.lock == run_lock.TRAIN and len(found.run_id) == 32
    assert found.checkpoints is not None and found.checkpoints.newest is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.lock = None
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_run_reads_run_json_its_range_and_the_newer_local_checkpoint(
        tmp_path, outside_a_cluster):
    model_dir, local = tmp_path / "run", tmp_path / "shm"
    durable = _save(model_dir, 100)
    last = {"from_step": 0, "global_batch_size": 16, "replicas": 2}
    (model_dir / "run.json").write_text(json.dumps({"run_id": RUN_ID, "ranges": [last]}))
    folder = local_checkpoints.folder(str(local), str(model_dir))
    assert local_folder.open_folder(folder) is None
    local_folder.claim(folder, RUN_ID)
    _save(folder, 150)
    before = _listing(tmp_path)
    config = RunConfig(model_dir=str(model_dir), local_checkpoint_dir=str(local),
                       local_checkpoint_interval=10)
    found = _read(config, outside_a_cluster, "train")
    assert found.run_json["run_id"] == found.run_id == RUN_ID and found.resuming
    assert found.resumed == last
    assert found.checkpoints.newest == durable
    assert found.latest_checkpoint == f"{folder}/ckpt-150"
    # --mode=evaluate reads the durable checkpoints only, under the evaluate lock.
    evaluating = _read(config, outside_a_cluster, "evaluate")
    assert (evaluating.latest_checkpoint, evaluating.lock) == (durable, run_lock.EVALUATE)
    assert _listing(tmp_path) == before


def test_the_identity_check_waits_for_the_decided_config(tmp_path, outside_a_cluster):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "run.json").write_text(json.dumps({"run_id": RUN_ID, "model": "mlp"}))
    found = _read(RunConfig(model_dir=str(model_dir), model="cnn"), outside_a_cluster, "train")
    with pytest.raises(ConfigError, match=r"^--model='cnn' contradicts --model_dir="):
        _check_identity(found, RunConfig(model_dir=str(model_dir), model="cnn"))
    _check_identity(found, RunConfig(model_dir=str(model_dir), model="mlp"))
