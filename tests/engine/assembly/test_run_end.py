"""The end of a run tells the truth: the final export and what can go wrong in it.

A full disk during the final export is one line (exit class 3), leaves the
checkpoints and no temporary folder, and `metrics.json` says `failed` with
`export: null`; a signal during the export says `interrupted` (bin/train:
exit 143); the same command then writes the missing export. Export staging a
kill -9 left is removed by the next run. An empty evaluation set is no result:
warned about, never the best checkpoint, and `--best_metric` refused up front.
"""

import errno
import json
import logging
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import bin_env, run_python
from tfloop.engine.run_dir import checkpoint_files, export
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError, ExportFailure
from tfloop.engine.task.losses import LossOutput
from tfloop.engine.assembly.run import export_checkpoint, run
from tfloop.engine.task import Task


def _config(model_dir, **overrides):
    settings = dict(
        strategy="one_device", devices="cpu:0", model="mlp", dataset="synthetic",
        model_dir=str(model_dir), global_batch_size=32, train_steps=4, steps_per_loop=2,
        checkpoint_interval=2, summary_interval=0, mode="train", export=True, seed=1)
    settings.update(overrides)
    return RunConfig(**settings)


def _record(model_dir):
    return json.loads((model_dir / "metrics.json").read_text())


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_during_the_final_export_is_one_line_and_the_record_says_failed(
        tmp_path, monkeypatch):
    model_dir = tmp_path / "run"
    # model.keras is written after the SavedModel: the temporary folder is full by then.
    monkeypatch.setattr(keras.Model, "save", _full_disk)
    with pytest.raises(ExportFailure) as failure:
        run(_config(model_dir))
    message = str(failure.value)
    assert "\n" not in message and failure.value.exit_status == 3
    assert message.startswith(f"could not export step 4 to {model_dir}/export (")
    assert "No space left on device); " in message and " free there; " in message
    assert message.endswith("the checkpoints are intact (the latest is ckpt-4): free some space "
                            "and run the same command to write the export")
    assert os.listdir(model_dir / "export") == []  # no export, no temporary folder
    assert checkpoint_files.damage(f"{model_dir}/ckpt-4") is None
    record = _record(model_dir)
    assert (record["status"], record["step"], record["export"]) == ("failed", 4, None)
    assert record["interrupted"] is True and "unsaved_step" not in record

    # bin/export's path says the same, naming the checkpoint it read.
    with pytest.raises(ExportFailure, match=r"; ckpt-4 is intact: free some space and export "
                                            r"again$"):
        export_checkpoint(_config(model_dir))
    assert os.listdir(model_dir / "export") == []

    monkeypatch.undo()  # space freed: the same command writes the missing export
    result = run(_config(model_dir))
    assert result["start_step"] == 4 and result["export"] == f"{model_dir}/export/4"
    record = _record(model_dir)
    assert (record["status"], record["export"]) == ("finished", f"{model_dir}/export/4")
    assert (model_dir / "export" / "4" / "saved_model.pb").exists()


class _Signalled(BaseException):
    """What bin/cli's handler raises for SIGTERM."""


def test_a_signal_during_the_final_export_leaves_interrupted_and_the_checkpoint(
        tmp_path, monkeypatch):
    model_dir = tmp_path / "run"
    real_write = export._write

    def write(model, serve, path):
        os.kill(os.getpid(), signal.SIGTERM)  # its handler raises at once, in this thread
        return real_write(model, serve, path)

    def handler(signum, frame):
        raise _Signalled()

    previous = signal.signal(signal.SIGTERM, handler)
    monkeypatch.setattr(export, "_write", write)
    try:
        with pytest.raises(_Signalled):
            run(_config(model_dir))
    finally:
        signal.signal(signal.SIGTERM, previous)
    record = _record(model_dir)
    assert (record["status"], record["step"], record["export"]) == ("interrupted", 4, None)
    assert os.listdir(model_dir / "export") == []
    assert tf.train.latest_checkpoint(str(model_dir)) == f"{model_dir}/ckpt-4"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_final_evaluation_saves_and_leaves_the_export_to_a_rerun(
        tmp_path, monkeypatch, signum):
    from tfloop.engine.loop import controller as controller_lib
    from tfloop.engine.loop.preemption import Preempted
    model_dir = tmp_path / "run"
    real_evaluate = controller_lib.Controller.evaluate

    def evaluate(self, steps=-1):
        if self.step == 4:  # the final evaluation: the run's handler only records it
            os.kill(os.getpid(), signum)
        return real_evaluate(self, steps)

    monkeypatch.setattr(controller_lib.Controller, "evaluate", evaluate)
    with pytest.raises(Preempted) as stopped:
        run(_config(model_dir, mode="train_and_evaluate", eval_interval=2))
    assert stopped.value.exit_status == 128 + signum
    assert str(stopped.value).endswith(f"at step 4; saved {model_dir}/ckpt-4; run the same "
                                       "command to resume")
    record = _record(model_dir)
    assert (record["status"], record["step"], record["export"]) == ("interrupted", 4, None)
    assert not (model_dir / "export").exists()
    monkeypatch.undo()
    assert run(_config(model_dir))["export"] == f"{model_dir}/export/4"


_TERMINATED_DURING_EXPORT = """
import os, runpy, signal, sys
from tfloop.engine.run_dir import export
real_write = export._write
def write(model, serve, path):
    os.kill(os.getpid(), signal.SIGTERM)
    return real_write(model, serve, path)
export._write = write
sys.argv = ["train", *sys.argv[1:]]
runpy.run_path(os.path.join("bin", "train"), run_name="__main__")
"""


def test_bin_train_terminated_during_the_export_exits_143_and_says_interrupted(tmp_path):
    model_dir = tmp_path / "run"
    result = run_python(
        ["-c", _TERMINATED_DURING_EXPORT, "--strategy=one_device",
         "--devices=cpu:0", "--global_batch_size=32", "--train_steps=4", "--steps_per_loop=2",
         "--mode=train", f"--model_dir={model_dir}"],
        timeout=240, env=bin_env())
    assert result.returncode == 143, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == "train: terminated (SIGTERM)"
    record = _record(model_dir)
    assert (record["status"], record["step"], record["export"]) == ("interrupted", 4, None)
    assert os.listdir(model_dir / "export") == []
    assert checkpoint_files.damage(f"{model_dir}/ckpt-4") is None


def test_export_staging_a_kill_left_is_removed_by_the_next_run_only(tmp_path, caplog):
    model_dir = tmp_path / "run"
    run(_config(model_dir, export=False))
    staging = model_dir / "export" / ".4.tmp-0123abcd"
    (staging / "variables").mkdir(parents=True)
    (staging / "saved_model.pb").write_bytes(b"half")
    unrelated = model_dir / "export" / ".notes"
    unrelated.write_text("mine")
    export_checkpoint(_config(model_dir))  # bin/export holds no lock: it leaves it
    assert staging.exists()
    with caplog.at_level(logging.INFO):
        run(_config(model_dir, train_steps=6))
    assert not staging.exists() and unrelated.exists()
    assert sorted(os.listdir(model_dir / "export")) == [".notes", "4", "6"]
    assert (f"removing {staging}, left by an export that did not finish"
            in [r.getMessage() for r in caplog.records])


class _EmptyEval(Task):
    """Trains on ones; its evaluation dataset holds no example (`known`: of
    cardinality 0, else of unknown cardinality, as a filter makes it)."""

    def __init__(self, known=True):
        self.known = known

    def build_model(self):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])

    def _data(self):
        return tf.data.Dataset.from_tensor_slices(
            (np.ones((64, 4), np.float32), np.zeros(64, np.float32)))

    def train_dataset(self, context):
        return self._data().repeat().batch(context.global_batch_size, drop_remainder=True)

    def eval_dataset(self, context):
        data = self._data().take(0) if self.known else self._data().filter(lambda x, y: False)
        return data.batch(context.global_batch_size)

    def loss(self, model, batch, *, training):
        x, y = batch
        return LossOutput(per_example_loss=tf.square(model(x, training=training)[:, 0] - y))


def test_an_empty_evaluation_is_warned_about_and_never_kept_as_the_best(tmp_path, caplog,
                                                                          monkeypatch):
    from tfloop.engine.loop import best
    # Past the start-up check (as if the data went away mid-run): each evaluation is empty.
    monkeypatch.setattr(best, "check_evaluation_not_empty", lambda config, evaluator: None,
                        raising=False)
    model_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        result = run(_config(model_dir, mode="train_and_evaluate", eval_interval=2,
                             best_metric="eval/loss", early_stopping_patience=1, export=False),
                     task=_EmptyEval())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and r.name.startswith("tfloop")
                and r.name != "tfloop.engine.observe.step_time"]  # a 4-step run may be input-bound
    assert warnings == [f"eval  step {s}: 0 examples, so no result (the evaluation dataset is "
                        "empty; its loss 0 means nothing)" for s in (2, 4)]
    assert result["eval/examples"] == 0
    assert result["best"] is None and result["stopped_early"] is None  # not compared or counted
    assert not (model_dir / "best" / "best.json").exists()


@pytest.mark.parametrize("known", [True, False])
def test_best_metric_over_an_empty_evaluation_set_is_one_line_and_writes_nothing(tmp_path,
                                                                                  known):
    model_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        run(_config(model_dir, mode="train_and_evaluate", eval_interval=2,
                    best_metric="eval/loss", early_stopping_patience=2),
            task=_EmptyEval(known))
    assert str(error.value) == (
        "--best_metric=eval/loss and --early_stopping_patience=2 compare evaluations, and the "
        "evaluation dataset is empty (0 examples): give the run evaluation data (the task's "
        "eval_dataset), or drop --best_metric and --early_stopping_patience")
    assert not model_dir.exists()
