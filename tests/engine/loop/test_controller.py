"""The Controller: arguments checked at once, and the sidecar evaluator's loop
(`evaluate_continuously`) over checkpoints as a chief writes them."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfloop import inputs
from tfloop import models
from tfloop.engine.loop.controller import Controller
from tfloop.engine.loop.evaluator import Evaluator
from fakes import FakeEvaluator, FakeTrainer, Recorder, step_variable


def _watch(directory, **trackables):
    """What the evaluator reads: no max_to_keep, never saved through."""
    return tf.train.CheckpointManager(tf.train.Checkpoint(**trackables),
                                      directory=str(directory), max_to_keep=None)


class _Chief:
    """Writes `ckpt-<step>` into a directory as a training chief would."""

    def __init__(self, directory):
        self.step = step_variable()
        self.manager = tf.train.CheckpointManager(tf.train.Checkpoint(global_step=self.step),
                                                  directory=str(directory), max_to_keep=None)

    def save_at(self, step):
        self.step.assign(step)
        self.manager.save(checkpoint_number=step)


def test_each_new_checkpoint_is_evaluated_until_the_last_train_step(tmp_path):
    chief = _Chief(tmp_path)
    chief.save_at(5)
    step = step_variable()
    # While step 5 is evaluated the chief writes ckpt-10, the last.
    evaluator = FakeEvaluator(step, after=lambda at: chief.save_at(10) if at == 5 else None)
    after_eval = Recorder()
    controller = Controller(global_step=step, evaluator=evaluator,
                            checkpoint_manager=_watch(tmp_path, global_step=step),
                            eval_actions=[after_eval])
    metrics = controller.evaluate_continuously(timeout=60, last_step=10)
    assert evaluator.evaluated == [5, 10]
    assert [e.step for e in after_eval.ends] == [5, 10]
    assert metrics == {"loss": 10.0, "examples": 16.0}
    assert controller.last_eval_metrics == metrics


def test_no_new_checkpoint_within_the_timeout_stops_with_one_line(tmp_path, caplog):
    chief = _Chief(tmp_path)
    chief.save_at(5)
    step = step_variable()
    evaluator = FakeEvaluator(step)
    controller = Controller(global_step=step, evaluator=evaluator,
                            checkpoint_manager=_watch(tmp_path, global_step=step))
    with caplog.at_level(logging.INFO, logger="tfloop"):
        metrics = controller.evaluate_continuously(timeout=1, last_step=10)
    assert evaluator.evaluated == [5]
    assert metrics["loss"] == 5.0
    assert f"no new checkpoint in {tmp_path} for 1s; stopping" in caplog.text


def test_evaluate_continuously_restores_the_model_it_evaluates(tmp_path, cpu_devices):
    """A real model: the evaluator's own (differently initialized) weights are
    replaced by the checkpoint's before it evaluates."""
    splits = inputs.load("synthetic", seed=1)
    examples = inputs.Examples(splits.eval.x[:256], splits.eval.y[:256])
    strategy = tf.distribute.OneDeviceStrategy(cpu_devices[0])

    def build(seed):
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            return models.build("mlp"), step_variable()

    def evaluator(model):
        return Evaluator(strategy=strategy, model=model,
                         eval_dataset=inputs.eval_batches(examples, global_batch_size=64))

    trained, trained_step = build(1)
    trained_step.assign(3)
    tf.train.Checkpoint(model=trained, global_step=trained_step).save(str(tmp_path / "ckpt"))
    expected = evaluator(trained).evaluate()

    fresh, step = build(2)
    controller = Controller(global_step=step, evaluator=evaluator(fresh),
                            checkpoint_manager=_watch(tmp_path, model=fresh, global_step=step))
    metrics = controller.evaluate_continuously(timeout=30, last_step=3)
    assert controller.step == 3
    assert metrics["examples"] == 256
    np.testing.assert_allclose(metrics["loss"], expected["loss"], rtol=1e-6)
    for a, b in zip(trained.trainable_variables, fresh.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_what_a_controller_lacks_is_named_when_asked_for(tmp_path):
    step = step_variable()
    evaluate_only = Controller(global_step=step, evaluator=FakeEvaluator(step))
    with pytest.raises(ValueError, match="`checkpoint_manager` is None"):
        evaluate_only.evaluate_continuously(timeout=1, last_step=1)
    with pytest.raises(ValueError, match="`trainer` is None"):
        evaluate_only.train(5)
    train_only = Controller(global_step=step, trainer=FakeTrainer(step))
    with pytest.raises(ValueError, match="`evaluator` is None"):
        train_only.evaluate()
    with pytest.raises(ValueError, match="`eval_interval` needs an `evaluator`"):
        train_only.train(5, eval_interval=2)


def _hook(step, metrics):
    pass


@pytest.mark.parametrize("overrides,says", [
    (dict(global_step=5), "`global_step` (5) must be a tf.Variable"),
    (dict(trainer="fit"), "`trainer` ('fit') must be an engine.loop.contracts.AbstractTrainer"),
    (dict(evaluator=object), "`evaluator` (<class 'object'>) must be an"),
    (dict(trainer=None), "`trainer` and `evaluator` are both None"),
    (dict(steps_per_loop=0), "`steps_per_loop` (0) must be a positive integer"),
    (dict(steps_per_loop=2.5), "`steps_per_loop` (2.5) must be a positive integer"),
    (dict(checkpoint_interval=-1), "`checkpoint_interval` (-1) must be an integer >= 0"),
    (dict(checkpoint_manager="runs/x"), "`checkpoint_manager` ('runs/x') must be a"),
    (dict(train_actions=[_hook]), "`train_actions` holds <function _hook"),
    (dict(eval_actions=[print]), "`eval_actions` holds <built-in function print>"),
])
def test_bad_arguments_are_refused_at_construction_naming_them(overrides, says):
    step = step_variable()
    arguments = dict(global_step=step, trainer=FakeTrainer(step))
    arguments.update(overrides)
    with pytest.raises(ValueError) as error:
        Controller(**arguments)
    assert says in str(error.value)
    assert "\n" not in str(error.value)


def test_the_outcome_is_what_the_loops_did_as_a_plain_value():
    """`Controller.outcome()`: the run record's only view of the loop (issue
    32: run_record reaches into no trainer); a trainer without a clock
    counts no FLOPs and names no peak."""
    from tfloop.engine.run_dir import run_record

    step = step_variable()
    controller = Controller(global_step=step, trainer=FakeTrainer(step), steps_per_loop=2)
    controller.train(6)
    outcome = controller.outcome()
    assert isinstance(outcome, run_record.Outcome)
    assert (outcome.step, outcome.stopped_early, outcome.eval_metrics) == (6, None, {})
    assert outcome.train_metrics == controller.last_train_metrics
    assert outcome.steps_per_second == controller.steps_per_second
    assert (outcome.flops_per_step, outcome.peak, outcome.devices) == (None, None, ())
    assert controller.phase() == (None, (4, 6))
