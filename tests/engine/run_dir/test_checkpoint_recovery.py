"""A run resumes from the newest checkpoint that reads, never from step 0 over
existing checkpoints, and never deletes or overwrites one: damaged files go to
`damaged/`, the state file is rebuilt; a checkpoint of another model is its
own one-line message; stale save directories are removed; metrics.json tells
the truth while the run goes and after it fails; a full disk is one line."""

import json
import logging
import os
import shutil
import types

import keras
import pytest
import tensorflow as tf

from helpers import assert_one_line_error, run_bin, run_python
from tfloop.engine.run_dir import checkpoint_files, checkpointing
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError, RunFailure
from tfloop.engine.assembly.run import export_checkpoint, run
from tfloop.engine.task import ClassificationTask

DATA = "ckpt-30.data-00000-of-00001"



def _run_with_model(config, model_fn):
    """The built-in task with another model (the task's `model_fn`)."""
    return run(config, task=ClassificationTask.from_config(config, model_fn=model_fn))

def _config(model_dir, **overrides):
    settings = dict(
        strategy="one_device", devices="cpu:0", model="mlp", dataset="synthetic",
        model_dir=str(model_dir), global_batch_size=32, train_steps=30, steps_per_loop=10,
        checkpoint_interval=10, summary_interval=0, mode="train", export=False, seed=1,
        max_checkpoints=10)
    settings.update(overrides)
    return RunConfig(**settings)


#: The tests that read the module's one trained run (a copy of it, or what it
#: saw while training): one xdist group, so that one worker trains it once.
SHARED = pytest.mark.xdist_group("checkpoint_recovery_trained")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A run with ckpt-10, ckpt-20 and ckpt-30, never changed (tests change a
    copy: `model_dir`), and what it said while it ran: metrics.json as each
    loop ended (`seen`, by step), metrics.json at the end (`final`) and run()'s
    record (`result`)."""
    model_dir = tmp_path_factory.mktemp("trained") / "run"
    seen = {}

    def look(step, metrics):
        seen[step] = json.loads((model_dir / "metrics.json").read_text())

    result = run(_config(model_dir), on_loop_end=look)
    final = json.loads((model_dir / "metrics.json").read_text())
    return types.SimpleNamespace(model_dir=model_dir, seen=seen, final=final, result=result)


@pytest.fixture(scope="module")
def trained(trained_run):
    return trained_run.model_dir


@pytest.fixture
def model_dir(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def _bytes(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
            if (directory / name).is_file()}


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _garble(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        middle = f.read(64)
        f.seek(-len(middle), os.SEEK_CUR)
        f.write(bytes(255 - b for b in middle))


NEWEST_DAMAGED = {
    "index deleted": lambda d: os.remove(d / "ckpt-30.index"),
    "data deleted": lambda d: os.remove(d / DATA),
    "index truncated": lambda d: _truncate(d / "ckpt-30.index"),
    "data truncated": lambda d: _truncate(d / DATA),
    "index garbled": lambda d: _garble(d / "ckpt-30.index"),
    "data garbled": lambda d: _garble(d / DATA),
    "both removed": lambda d: [os.remove(d / n) for n in ("ckpt-30.index", DATA)],
}


@SHARED
@pytest.mark.parametrize("case", NEWEST_DAMAGED)
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
        model_dir, case, caplog):
    intact = _bytes(model_dir)
    NEWEST_DAMAGED[case](model_dir)
    damaged = {n: b for n, b in _bytes(model_dir).items() if n.startswith("ckpt-30.")}
    with caplog.at_level(logging.INFO):
        result = run(_config(model_dir, train_steps=40))
    assert result["start_step"] == 20 and result["step"] == 40
    assert result["resumed_from"] == f"{model_dir}/ckpt-20"
    lines = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("ckpt-30 is damaged (")
    assert lines[0].endswith("); resuming from ckpt-20"), lines
    # Moved aside as they were, never deleted or overwritten.
    if damaged:
        assert _bytes(model_dir / "damaged") == damaged
    else:
        assert not (model_dir / "damaged").exists()
    now = _bytes(model_dir)
    for name in ("ckpt-10.index", "ckpt-20.index", "ckpt-20.data-00000-of-00001"):
        assert now[name] == intact[name]
    state = tf.train.get_checkpoint_state(str(model_dir))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "ckpt-10", "ckpt-20", "ckpt-30", "ckpt-40"]


STATE_FILE = {
    "deleted": lambda path: os.remove(path),
    "emptied": lambda path: open(path, "w").close(),
    "random bytes": lambda path: path.write_bytes(bytes(range(256)) * 2),
    "naming a checkpoint that is gone": lambda path: path.write_text(
        'model_checkpoint_path: "ckpt-99"\nall_model_checkpoint_paths: "ckpt-99"\n'),
    "naming a checkpoint without a step": lambda path: path.write_text(
        'model_checkpoint_path: "model.ckpt"\nall_model_checkpoint_paths: "model.ckpt"\n'),
}


@SHARED
@pytest.mark.parametrize("case", STATE_FILE)
def test_a_damaged_state_file_is_rebuilt_from_the_checkpoints_on_disk(model_dir, case):
    STATE_FILE[case](model_dir / "checkpoint")
    result = run(_config(model_dir, train_steps=40, max_checkpoints=3))
    assert result["start_step"] == 30 and result["step"] == 40
    # Rotation knew every checkpoint: the oldest went, as with an intact state file.
    state = tf.train.get_checkpoint_state(str(model_dir))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "ckpt-20", "ckpt-30", "ckpt-40"]
    assert not (model_dir / "ckpt-10.index").exists()


@SHARED
def test_a_checkpoint_the_state_file_does_not_name_yet_is_resumed_from(model_dir):
    """A kill -9 between `ckpt-30.index` appearing and the state file naming it."""
    state = (model_dir / "checkpoint").read_text().splitlines()
    (model_dir / "checkpoint").write_text("\n".join(
        ['model_checkpoint_path: "ckpt-20"'] + [
            line for line in state if "ckpt-30" not in line and "model_checkpoint_path:" not in
            line and "timestamps" not in line]) + "\n")
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-20")
    result = run(_config(model_dir, train_steps=40, max_checkpoints=3))
    assert result["start_step"] == 30
    state = tf.train.get_checkpoint_state(str(model_dir))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "ckpt-20", "ckpt-30", "ckpt-40"]


@SHARED
def test_when_no_checkpoint_reads_it_is_one_line_and_nothing_is_written(model_dir):
    for step in (10, 20, 30):
        _truncate(model_dir / f"ckpt-{step}.data-00000-of-00001")
    before, entries = _bytes(model_dir), sorted(os.listdir(model_dir))
    with pytest.raises(ConfigError) as error:
        run(_config(model_dir, train_steps=40))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"--model_dir={model_dir} holds checkpoints and none of them "
                              "reads (ckpt-30: ")
    assert sorted(os.listdir(model_dir)) == entries and _bytes(model_dir) == before


@SHARED
def test_evaluate_and_export_read_the_newest_readable_and_move_nothing(model_dir, caplog):
    _truncate(model_dir / DATA)
    before = _bytes(model_dir)
    with caplog.at_level(logging.INFO):
        result = run(_config(model_dir, mode="evaluate", eval_steps=2))
    assert result["step"] == 20
    assert any(r.getMessage().startswith("ckpt-30 is damaged (") and
               r.getMessage().endswith("; evaluating ckpt-20") for r in caplog.records)
    exported = export_checkpoint(_config(model_dir))
    assert exported.endswith("export/20")
    with pytest.raises(ConfigError, match=r"--step=30: ckpt-30 in --model_dir=.* is damaged \("):
        export_checkpoint(_config(model_dir), step=30)
    after = _bytes(model_dir)
    assert {n: after[n] for n in before} == before
    assert not (model_dir / "damaged").exists()


@SHARED
def test_stale_save_directories_are_removed_at_start_up(model_dir, caplog):
    (model_dir / "ckpt-35_temp").mkdir()
    (model_dir / "ckpt-35_temp" / "part-00000-of-00001.index").write_bytes(b"x")
    with caplog.at_level(logging.INFO):
        result = run(_config(model_dir, train_steps=40))
    assert result["start_step"] == 30
    assert not (model_dir / "ckpt-35_temp").exists()
    assert f"removing {model_dir}/ckpt-35_temp, left by a save that did not finish" in [
        r.getMessage() for r in caplog.records]


def _small_model(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(32), keras.layers.Dense(num_classes)])


@SHARED
def test_a_checkpoint_of_another_model_names_the_first_variable_that_differs(model_dir):
    with pytest.raises(ConfigError) as error:
        _run_with_model(_config(model_dir, train_steps=40), _small_model)
    assert str(error.value) == (
        f"--model_dir={model_dir} holds ckpt-30, which does not fit this model "
        "(model_weights/000_kernel is float32 (784, 256) there and float32 (784, 32) in this "
        "model); use a new --model_dir, or the flags that wrote it")


class ScaledModel(keras.Model):
    """A variable set on the model itself: a checkpoint stores it as
    model/scale, not under model_weights/."""

    def __init__(self, num_classes):
        super().__init__()
        self.flatten = keras.layers.Flatten()
        self.dense = keras.layers.Dense(num_classes)
        self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

    def call(self, inputs):
        return self.dense(self.flatten(inputs)) * self.scale


def test_a_model_with_a_variable_of_its_own_resumes_from_its_checkpoint(tmp_path):
    def scaled(input_shape, num_classes):
        model = ScaledModel(num_classes)
        model(keras.Input(input_shape))
        return model

    _run_with_model(_config(tmp_path / "run", train_steps=10), scaled)
    keys = checkpointing.stored_names(f"{tmp_path}/run/ckpt-10")
    assert "model/scale/.ATTRIBUTES/VARIABLE_VALUE" in keys  # not under model_weights/
    result = _run_with_model(_config(tmp_path / "run", train_steps=20), scaled)
    assert result["resumed_from"] == f"{tmp_path}/run/ckpt-10"
    assert result["start_step"] == 10 and result["step"] == 20


@SHARED
def test_bin_train_over_another_models_checkpoint_is_one_line_without_tensorflow_warnings(
        model_dir):
    os.remove(model_dir / "run.json")  # else the stored --model=mlp is the refusal
    result = run_bin("train", f"--model_dir={model_dir}", "--model=cnn", "--dataset=synthetic",
                     "--strategy=one_device", "--devices=cpu:0", "--train_steps=40",
                     "--global_batch_size=32", "--mode=train")
    line = assert_one_line_error(result, contains="which does not fit this model (")
    assert result.returncode == 2
    assert "model_weights/000_kernel is float32 (784, 256) there and float32 (3, 3, 1, 32) in " \
           "this model" in line
    assert "could not be found" not in result.stdout + result.stderr


@SHARED
def test_metrics_json_says_running_with_the_last_checkpoints_step_while_training(trained_run):
    """Read from the module's trained run (the same config, 30 steps), which
    records metrics.json at each loop's end and after the run."""
    seen, result, final = trained_run.seen, trained_run.result, trained_run.final
    # The loop ending at step 20 has not saved ckpt-20 yet.
    assert (seen[20]["status"], seen[20]["step"], seen[20]["interrupted"]) == ("running", 10, True)
    assert seen[20]["checkpoint"] == f"{trained_run.model_dir}/ckpt-10"
    assert (seen[10]["status"], seen[10]["step"], seen[10]["checkpoint"]) == ("running", 0, None)
    assert (final["status"], final["step"], final["interrupted"]) == ("finished", 30, False)
    assert result["status"] == "finished" and "unsaved_step" not in final


def test_a_full_disk_during_a_save_is_one_line_and_the_previous_checkpoint_stays_latest(
        tmp_path, monkeypatch):
    model_dir = tmp_path / "run"
    real_save = checkpointing.Manager.save

    def save(self, checkpoint_number=None, **kwargs):
        if checkpoint_number == 20:  # what a full disk leaves: a half-written save
            (model_dir / "ckpt-20_temp").mkdir()
            (model_dir / "ckpt-20.index").write_bytes(b"half")
            raise tf.errors.ResourceExhaustedError(
                None, None, f"{model_dir}/ckpt-20_temp/part-00000-of-00001.data-00000-of-00001; "
                "No space left on device")
        return real_save(self, checkpoint_number=checkpoint_number, **kwargs)

    monkeypatch.setattr(checkpointing.Manager, "save", save)
    with pytest.raises(RunFailure) as failure:
        run(_config(model_dir))
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith(f"could not save ckpt-20 in {model_dir} (")
    assert "No space left on device); " in message and " free there; " in message
    assert message.endswith("the latest checkpoint is still ckpt-10: free some space and run "
                            "the same command to resume from it")
    assert tf.train.latest_checkpoint(str(model_dir)) == f"{model_dir}/ckpt-10"
    assert checkpoint_files.damage(f"{model_dir}/ckpt-10") is None
    assert not (model_dir / "ckpt-20_temp").exists() and not (model_dir / "ckpt-20.index").exists()
    record = json.loads((model_dir / "metrics.json").read_text())
    assert (record["status"], record["step"], record["unsaved_step"]) == ("failed", 10, 20)
    assert record["interrupted"] is True


_FAILING_MAIN = """
import sys
sys.argv = ["train"]
from tfloop.bin import cli
from tfloop.engine.errors import RunFailure
def main(argv):
    raise RunFailure("could not save ckpt-20 in /x (No space left on device); 0 bytes free there")
cli.run(main)
"""


def test_the_binaries_print_a_run_failure_as_one_line_and_exit_1():
    result = run_python(["-c", _FAILING_MAIN], timeout=120,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 1
    assert assert_one_line_error(result) == (
        "train: error: could not save ckpt-20 in /x (No space left on device); 0 bytes free there"
        " (exit 1: failed: a restart cannot fix it)")
