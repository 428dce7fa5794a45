"""How long and how large: `--epochs`, `--steps_per_epoch`, `--per_replica_batch_size`
and `--accumulation_steps` as the plan resolves them, and their refusals."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from tfloop.engine.loop.actions import LoopEnd, TrainProgress
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.plan import make_plan
from tfloop.engine.assembly.run import run
from train_only_task import TrainOnly

SYNTHETIC_TRAIN_EXAMPLES = 8192


def _plan(tmp_path, **flags):
    return make_plan(RunConfig(model_dir=str(tmp_path / "run"), **flags))


def test_epochs_train_to_epochs_times_the_split_over_the_batch_rounded_up(tmp_path):
    plan = _plan(tmp_path, devices="cpu:0,cpu:1", epochs=3, global_batch_size=96)
    per_epoch = -(-SYNTHETIC_TRAIN_EXAMPLES // 96)  # 86: the last batch of an epoch spills over
    assert (plan.config.steps_per_epoch, plan.config.train_steps) == (per_epoch, 3 * per_epoch)
    assert plan.config.epochs == 3


def test_steps_per_epoch_sets_an_epoch_for_data_of_unknown_size(tmp_path):
    plan = _plan(tmp_path, epochs=2, steps_per_epoch=7)
    assert plan.config.train_steps == 14


def test_epochs_of_a_task_of_unknown_size_are_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"needs the size of the train split, and "
                       r"TrainOnly.train_examples is None; define it, give --steps_per_epoch"):
        run(RunConfig(model_dir=str(tmp_path / "run"), epochs=2, global_batch_size=8),
            task=TrainOnly())
    assert not (tmp_path / "run").exists()
    result = run(RunConfig(model_dir=str(tmp_path / "run"), epochs=2, steps_per_epoch=3,
                           global_batch_size=8, export=False), task=TrainOnly())
    assert result["step"] == 6


def test_per_replica_batch_times_replicas_and_micro_batches_is_the_global_batch(tmp_path):
    plan = _plan(tmp_path, devices="cpu:0,cpu:1,cpu:2,cpu:3", per_replica_batch_size=8,
                 accumulation_steps=2)
    assert plan.config.global_batch_size == 64
    assert "global batch 64 (16 per replica in 2 micro-batches of 8)" in plan.describe(4)


@pytest.mark.parametrize("flags, message", [
    (dict(devices="cpu:0,cpu:1", global_batch_size=64, accumulation_steps=3),
     "--global_batch_size=64 does not divide by 2 replicas x 3 micro-batches "
     "(--accumulation_steps); use a multiple of 6, e.g. 60"),
    (dict(epochs=2, train_steps=50), "--epochs=2 and --train_steps=50 both say how long"),
    (dict(per_replica_batch_size=8, global_batch_size=64), "both set the batch; give one"),
    (dict(steps_per_epoch=10), "is the length of an epoch for --epochs"),
    (dict(ema_decay=1.0), "--ema_decay=1.0 must be at least 0 and below 1"),
    (dict(clip_norm=float("nan")), "--clip_norm=nan must be 0 or a positive number"),
    (dict(accumulation_steps=0), "--accumulation_steps=0 must be a positive integer"),
])
def test_bad_run_length_and_step_options_are_refused_before_anything_is_written(
        tmp_path, flags, message):
    with pytest.raises(ConfigError) as error:
        run(RunConfig(model_dir=str(tmp_path / "run"), **flags))
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_the_progress_line_counts_epochs(caplog):
    progress = TrainProgress(global_batch_size=32, steps_per_epoch=10, epochs=3)
    with caplog.at_level(logging.INFO):
        for step in (5, 10, 11, 30):
            progress(LoopEnd(start=step - 1, step=step, target=30, num_steps=1, seconds=0.1,
                             metrics={"loss": 1.0}))
    epochs = [line.split("(")[1].split(")")[0] for line in caplog.messages]
    assert epochs == ["epoch 1/3", "epoch 1/3", "epoch 2/3", "epoch 3/3"]


def _ids_per_step(split, *, batch, steps, start_step=0):
    """The example ids (the first pixel) of the real rows (weight > 0) of
    each batch the built-in task's --epochs pipeline gives the step."""
    from tfloop.engine.task import ClassificationTask
    from tfloop.inputs import InputContext

    task = ClassificationTask.from_config(RunConfig(epochs=2, seed=4))
    assert task.exact_epochs
    task.splits = type("Splits", (), {"train": split})()
    context = InputContext.create(start_step=start_step, global_batch_size=batch, num_replicas=1,
                                  num_input_pipelines=1, input_pipeline_id=0, seed=4,
                                  shard_policy="data", deterministic=True)
    seen = []
    for images, _, weight in task.train_dataset(context).take(steps):
        pixels = images.numpy().reshape(batch, -1)[:, :2].astype(np.int64)
        seen.append((pixels[:, 0] * 256 + pixels[:, 1])[weight.numpy() > 0])
    return seen


def test_epochs_2_over_1500_examples_at_batch_64_see_each_example_exactly_twice():
    """Each epoch one pass (23 batches of 64 and the last of 28, padded and
    weighted: inputs.exact_epochs), not passes running into each other (which
    saw 1428 examples twice and 72 three times); resumed mid-epoch, the same batches."""
    from tfloop.inputs import Examples

    ids = np.arange(1500)
    x = np.zeros((1500, 2, 1, 1), np.uint8)
    x[:, 0, 0, 0], x[:, 1, 0, 0] = ids // 256, ids % 256
    split = Examples(x=x, y=(ids % 3).astype(np.int64))
    batches = _ids_per_step(split, batch=64, steps=48)
    assert [len(b) for b in batches[:24]] == [64] * 23 + [28]
    assert sorted(np.concatenate(batches[:24])) == list(range(1500))
    counts = np.bincount(np.concatenate(batches), minlength=1500)
    assert counts.min() == counts.max() == 2
    for a, b in zip(_ids_per_step(split, batch=64, steps=18, start_step=30), batches[30:],
                    strict=True):
        np.testing.assert_array_equal(a, b)
