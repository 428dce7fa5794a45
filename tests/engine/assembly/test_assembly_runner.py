"""`engine.assembly.runner.Runner`: the run's assembly in its build steps, built once, in order,
for every mode (the evaluator task's too).

`build_actions` owns both action lists in their final order (nothing is
patched afterwards), metrics.json's progress among them; the hang watch gets
the Controller when it starts, not a lambda that reads it before it exists.
In process, one logical CPU, a fake trainer: nothing is trained here (the
runs themselves: tests/engine/assembly/test_run*.py).
"""

import json

import tensorflow as tf

from tfloop.engine.assembly import parts as parts_lib
from tfloop.engine.assembly.plan import make_plan
from tfloop.engine.assembly.runner import Hooks, Runner
from tfloop.engine.config import RunConfig
from tfloop.engine.loop import actions
from tfloop.engine.loop.controller import Controller
from tfloop.engine.loop.contracts import AbstractTrainer


class FakeTrainer(AbstractTrainer):
    """Counts steps and trains nothing."""

    def __init__(self, step: tf.Variable):
        self.step = step

    def train(self, num_steps):
        self.step.assign_add(num_steps)
        return {"loss": 0.0}


def _runner(tmp_path, hooks=Hooks(), **flags):
    config = RunConfig(**{"model_dir": str(tmp_path / "run"), "devices": "cpu:0",
                          "global_batch_size": 8, "train_steps": 4, "steps_per_loop": 2,
                          "export": False, **flags})
    plan = make_plan(config)
    strategy = plan.spec.build(plan.devices, sections=plan.sections, role=plan.role,
                               connection=plan.connection, implementation=plan.implementation)
    return Runner(plan, parts_lib.build_parts(plan, strategy), hooks=hooks)


def _names(action_list):
    return [type(action).__name__ for action in action_list]


def test_build_actions_gives_both_lists_in_their_final_order(tmp_path):
    class Mine(actions.Action):
        def __call__(self, loop):
            pass

    extra = actions.RunActions(train=[Mine()], eval=[Mine()])
    runner = _runner(tmp_path, Hooks(on_loop_end=lambda step, metrics: None,
                                     add_actions=lambda **_: extra),
                     profile_steps="2,3", best_metric="eval/loss",
                     local_checkpoint_dir=str(tmp_path / "local"), local_checkpoint_interval=1)
    checkpoints = runner.build_checkpointing(str(tmp_path / "run"), runner.plan.latest_checkpoint)
    trainer = FakeTrainer(runner.parts.global_step)
    loop = runner.build_actions(trainer, checkpoints)
    try:
        train = _names(loop.train)
        assert train[:6] == ["RecordProgress", "History", "Profile", "TrainProgress",
                             "TrainSummaries", "OnLoopEnd"], train
        assert train[6] == "Mine" and train[-2:] == ["SaveLocal", "StopOnSignal"], train
        assert "_LoopEnded" in train[7:-2]  # the hang watch's, among the watchers'
        assert loop.train[-2].saver is loop.local_saver is not None  # what a finished run removes
        assert _names(loop.eval) == ["History", "EvalProgress", "EvalSummaries", "Mine",
                                     "KeepBest"]
        controller = runner.build_controller(trainer, checkpoints, loop)
        assert controller.train_actions == tuple(loop.train)
        loop.watchers.start(controller)  # the hang watch reads the Controller from here on
        assert loop.watchers.watch.phase() == (None, (0, 0))
    finally:
        loop.close(Controller(global_step=runner.parts.global_step, trainer=trainer))


def test_a_run_that_only_evaluates_records_evaluations_and_no_progress(tmp_path):
    runner = _runner(tmp_path)  # the evaluate mode's path: no write_dir, no trainer
    checkpoints = runner.build_checkpointing(None, runner.plan.latest_checkpoint)
    assert checkpoints.manager is None and checkpoints.start_step == 0
    loop = runner.build_actions(None, checkpoints)
    try:
        assert loop.progress is None and loop.watchers is None
        assert _names(loop.train) == ["History", "TrainProgress", "TrainSummaries",
                                      "StopOnSignal"]
        assert _names(loop.eval) == ["History", "EvalProgress", "EvalSummaries",
                                     "RecordEvaluation"]
    finally:
        loop.close(Controller(global_step=runner.parts.global_step,
                              evaluator=runner.parts.evaluator))
    assert isinstance(runner.parts.global_step, tf.Variable)


def test_the_evaluator_task_is_built_by_the_same_steps(tmp_path, monkeypatch):
    """`continuous_evaluate` (the sidecar evaluator) goes through
    build_checkpointing, build_actions and build_controller: a checkpoint of
    the model and step (no manager, nothing restored up front: each
    checkpoint as it appears), its own `summaries/eval`, evaluations.json by
    "evaluator", the best checkpoint kept as the chief keeps it but stopping
    nothing, and no stop request (a signal stops the evaluator at once)."""
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["localhost:1"]}, "task": {"type": "evaluator", "index": 0}}))
    runner = _runner(tmp_path, strategy="one_device", mode="", best_metric="eval/loss",
                     early_stopping_patience=0)
    assert runner.plan.mode == "continuous_evaluate" and runner.plan.role.is_evaluator
    checkpoints = runner.build_checkpointing(None, None)
    assert (checkpoints.manager, checkpoints.restored, checkpoints.start_step) == (None, None, 0)
    checkpoint = checkpoints.checkpoint
    assert checkpoint.model is runner.parts.model
    assert checkpoint.global_step is runner.parts.global_step
    assert not hasattr(checkpoint, "optimizer")  # an evaluator restores no optimizer
    loop = runner.build_actions(None, checkpoints)
    try:
        assert (loop.stop_request, loop.progress, loop.watchers) == (None, None, None)
        assert loop.writers[0] is None and loop.writers[1] is not None
        assert _names(loop.train) == ["History", "TrainProgress", "TrainSummaries"]
        assert _names(loop.eval) == ["History", "EvalProgress", "EvalSummaries",
                                     "RecordEvaluation", "KeepBest"]
        assert loop.eval[3].by == "evaluator" and loop.eval[4] is loop.keep_best
        assert loop.keep_best.checkpoint is checkpoints.checkpoint
        assert loop.keep_best.is_chief and loop.keep_best.patience == 0
        controller = runner.build_controller(None, checkpoints, loop)
        assert controller.trainer is None and controller.checkpoint_manager is None
        assert controller.evaluator is runner.parts.evaluator
        assert controller.eval_actions == tuple(loop.eval)
    finally:
        loop.close(Controller(global_step=runner.parts.global_step,
                              evaluator=runner.parts.evaluator))
