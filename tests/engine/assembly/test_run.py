"""`engine.assembly.run.run`: what one call gives back, and the arguments it refuses.

`run()`'s own contract, apart from what the loop does (tests/engine/assembly/test_run_and_resume.py)
and how each failure ends (tests/engine/assembly/test_exit_classes.py, test_run_end.py):
it returns the record `metrics.json` holds, with the trained model (the
weights of the last checkpoint), the task it ran and every loop and
evaluation of the call in order; `on_loop_end` sees each train loop's end
step and metrics; a task object together with `--task`, or a task that is
not a `Task`, is refused before anything is written. One tiny run in
process (2 logical CPUs, 4 steps), shared by the tests that read it.
"""

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.run import run
from tfloop.engine.task import ClassificationTask

TRAIN_STEPS, STEPS_PER_LOOP = 4, 2


def _config(model_dir, **flags):
    return RunConfig(**{
        "model_dir": str(model_dir), "devices": "cpu:0,cpu:1", "collective": "reduce_to_one_device",
        "global_batch_size": 16, "train_steps": TRAIN_STEPS, "steps_per_loop": STEPS_PER_LOOP,
        "checkpoint_interval": TRAIN_STEPS, "eval_steps": 2, "export": False, "seed": 1, **flags})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One run to its last step: (its config, the task passed in, what run() returned,
    the (step, metrics) on_loop_end saw)."""
    config = _config(tmp_path_factory.mktemp("run") / "run")
    task = ClassificationTask.from_config(config)
    seen = []
    result = run(config, task=task, on_loop_end=lambda step, metrics: seen.append((step, metrics)))
    return config, task, result, seen


def test_run_returns_the_record_metrics_json_holds(finished):
    config, _, result, _ = finished
    with open(f"{config.model_dir}/metrics.json") as f:
        assert dict(result) == json.load(f)
    assert result["step"] == TRAIN_STEPS


def test_the_result_holds_the_task_the_history_and_the_checkpoints_model(finished):
    config, task, result, _ = finished
    assert result.task is task
    assert [(entry["kind"], entry["step"]) for entry in result.history] == [
        ("train", 2), ("train", 4), ("eval", 4)]
    assert all(np.isfinite(entry["loss"]) for entry in result.history)
    # The model is the trained one: the weights of the last checkpoint, variable by variable.
    reader = tf.train.load_checkpoint(config.model_dir)
    names = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith("model_weights/"))
    assert len(names) == len(result.model.variables)
    for name, variable in zip(names, result.model.variables):
        np.testing.assert_array_equal(reader.get_tensor(name), variable.numpy())


def test_on_loop_end_sees_each_train_loops_end_step_and_metrics(finished):
    _, _, result, seen = finished
    assert [step for step, _ in seen] == [2, 4]
    trained = [entry for entry in result.history if entry["kind"] == "train"]
    assert [metrics["loss"] for _, metrics in seen] == [entry["loss"] for entry in trained]


def test_a_task_object_and_a_task_flag_together_are_refused_and_nothing_is_written(tmp_path):
    config = _config(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"run\(\) got a task and --task=examples.regression:"
                       r"RegressionTask; give one"):
        run(dataclasses.replace(config, task="examples.regression:RegressionTask"),
            task=ClassificationTask.from_config(config))
    with pytest.raises(ConfigError, match=r"task must be a tfloop Task \(subclass "
                       r"tfloop.engine.task.Task\), got dict"):
        run(config, task={"model": "mlp"})
    assert not (tmp_path / "run").exists()
