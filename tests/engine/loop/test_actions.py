"""Loop-end actions and the loop cutting they and the Controller agree on.

No model and no compiled loop: a fake trainer moves a `tf.Variable` step, so
these tests say exactly where loops end, what was saved and what was written.
"""

import glob
import os
import time

import pytest
import tensorflow as tf

from tfloop.engine.loop import actions
from tfloop.engine.loop.controller import Controller
from tfloop.engine.loop.preemption import StopRequest
from fakes import (FakeEvaluator, FakeTrainer, Recorder, RecordingProfile, RecordingWriter,
                   step_variable)


def _manager(directory, step):
    return tf.train.CheckpointManager(tf.train.Checkpoint(global_step=step),
                                      directory=str(directory), max_to_keep=None)


def _checkpoints(directory):
    return sorted(int(os.path.basename(p)[len("ckpt-"):-len(".index")])
                  for p in glob.glob(os.path.join(str(directory), "ckpt-*.index")))


def test_loops_end_on_checkpoint_and_summary_multiples(tmp_path):
    step = step_variable()
    trainer, writer = FakeTrainer(step), RecordingWriter()
    summaries = actions.TrainSummaries(writer=writer, interval=4, global_batch_size=8)
    controller = Controller(global_step=step, trainer=trainer, steps_per_loop=7,
                            checkpoint_manager=_manager(tmp_path, step), checkpoint_interval=10,
                            train_actions=[summaries])
    controller.train(30)
    assert trainer.loop_ends == [4, 8, 10, 12, 16, 20, 24, 28, 30]
    assert _checkpoints(tmp_path) == [10, 20, 30]
    assert [s for s, _ in writer.writes] == [4, 8, 12, 16, 20, 24, 28, 30]  # and the last
    scalars = writer.writes[0][1]
    assert set(scalars) == {"loss", "steps_per_second", "examples_per_second"}
    assert scalars["examples_per_second"] == pytest.approx(8 * scalars["steps_per_second"])


def test_a_resumed_run_keeps_the_same_boundaries(tmp_path):
    step = step_variable(13)
    trainer, writer = FakeTrainer(step), RecordingWriter()
    controller = Controller(
        global_step=step, trainer=trainer, steps_per_loop=100,
        checkpoint_manager=_manager(tmp_path, step), checkpoint_interval=10,
        train_actions=[actions.TrainSummaries(writer=writer, interval=4, global_batch_size=8)])
    controller.train(30)
    assert trainer.loop_ends == [16, 20, 24, 28, 30]
    assert _checkpoints(tmp_path) == [20, 30]
    assert [s for s, _ in writer.writes] == [16, 20, 24, 28, 30]


def test_summaries_without_a_writer_still_cut_loops():
    """A worker that is not the chief writes nothing but ends its loops at the
    chief's steps (the stop request is a collective at every loop end)."""
    step = step_variable()
    trainer = FakeTrainer(step)
    Controller(global_step=step, trainer=trainer, steps_per_loop=100, train_actions=[
        actions.TrainSummaries(writer=None, interval=5, global_batch_size=8)]).train(12)
    assert trainer.loop_ends == [5, 10, 12]


def test_the_profiler_traces_exactly_steps_a_to_b():
    step = step_variable()
    trainer = FakeTrainer(step)
    profile = RecordingProfile(step, steps=(3, 6), logdir="/tmp/unused")
    Controller(global_step=step, trainer=trainer, steps_per_loop=100,
               train_actions=[profile]).train(9)
    assert trainer.loop_ends == [3, 6, 9]
    assert (profile.started, profile.stopped) == ([3], [6])


def test_a_run_resumed_inside_the_window_traces_at_once():
    step = step_variable(4)
    trainer = FakeTrainer(step)
    profile = RecordingProfile(step, steps=(3, 6), logdir="/tmp/unused")
    Controller(global_step=step, trainer=trainer, steps_per_loop=100,
               train_actions=[profile]).train(9)
    assert trainer.loop_ends == [6, 9]
    assert (profile.started, profile.stopped) == ([4], [6])


def test_a_worker_cuts_at_the_window_without_tracing():
    step = step_variable()
    trainer = FakeTrainer(step)
    profile = RecordingProfile(step, steps=(3, 6), logdir=None)
    Controller(global_step=step, trainer=trainer, steps_per_loop=100,
               train_actions=[profile]).train(9)
    assert trainer.loop_ends == [3, 6, 9]
    assert profile.started == [] and profile.stopped == []


def test_the_profiler_stops_when_training_ends_early_or_fails():
    step = step_variable()
    profile = RecordingProfile(step, steps=(2, 50), logdir="/tmp/unused")
    Controller(global_step=step, trainer=FakeTrainer(step), steps_per_loop=100,
               train_actions=[profile]).train(5)
    assert (profile.started, profile.stopped) == ([2], [5])

    def fail(at):
        if at == 4:
            raise RuntimeError("lost a device")

    step = step_variable()
    profile = RecordingProfile(step, steps=(2, 50), logdir="/tmp/unused")
    controller = Controller(global_step=step, trainer=FakeTrainer(step, during=fail),
                            steps_per_loop=2, train_actions=[profile])
    with pytest.raises(RuntimeError, match="lost a device"):
        controller.train(10)
    assert (profile.started, profile.stopped) == ([2], [4])


def test_actions_run_in_order_with_what_each_loop_did():
    step = step_variable()
    seen = []
    first, second = Recorder(), Recorder(every=3)
    hook = actions.OnLoopEnd(lambda at, metrics: seen.append((at, sorted(metrics))))
    controller = Controller(global_step=step, trainer=FakeTrainer(step), steps_per_loop=4,
                            train_actions=[first, second, hook])
    controller.train(8)
    assert [(e.start, e.step, e.num_steps, e.target) for e in first.ends] == [
        (0, 3, 3, 8), (3, 6, 3, 8), (6, 8, 2, 8)]
    assert first.begins == second.begins == [0, 3, 6]
    assert seen == [(3, ["examples", "loss"]), (6, ["examples", "loss"]), (8, ["examples", "loss"])]
    assert first.closed == second.closed == 1
    assert controller.last_train_metrics == {"loss": 1.0 / 8, "examples": 16.0}


def test_eval_boundaries_are_the_controllers_and_eval_actions_see_each_evaluation():
    step = step_variable()
    trainer, evaluator, after_eval = FakeTrainer(step), FakeEvaluator(step), Recorder()
    controller = Controller(global_step=step, trainer=trainer, evaluator=evaluator,
                            steps_per_loop=100, eval_actions=[after_eval])
    controller.train(10, eval_interval=4, eval_steps=2)
    assert trainer.loop_ends == [4, 8, 10]
    assert evaluator.evaluated == [4, 8, 10]  # the last once, at the end
    assert [(e.step, e.num_steps, e.metrics["loss"]) for e in after_eval.ends] == [
        (4, 2, 4.0), (8, 2, 8.0), (10, 2, 10.0)]
    assert controller.last_eval_metrics["loss"] == 10.0


def test_eval_summaries_leave_out_the_example_count():
    writer = RecordingWriter()
    actions.EvalSummaries(writer=writer)(actions.LoopEnd(
        start=7, step=7, target=7, num_steps=-1, seconds=0.1,
        metrics={"loss": 0.5, "accuracy": 0.9, "examples": 2048.0}))
    assert writer.writes == [(7, {"loss": 0.5, "accuracy": 0.9})]


def test_throughput_leaves_out_each_trains_first_loop():
    """The first loop of a train() call traces and compiles; metrics.json's
    examples/s must not count it (unless it is the only loop)."""
    def slow_first_loop(at):
        if at in (5, 10, 25):  # the first loop of each train() call below
            time.sleep(0.3)

    step = step_variable()
    controller = Controller(global_step=step, trainer=FakeTrainer(step, during=slow_first_loop),
                            steps_per_loop=5)
    controller.train(5)
    assert 0 < controller.steps_per_second < 5 / 0.3  # one loop: it is all there is
    controller.train(20)
    controller.train(45)
    # 30 timed steps in milliseconds; counting one slow loop would give ~120 steps/s.
    assert controller.steps_per_second > 1000


def test_metrics_json_progress_is_an_action_told_of_every_checkpoint(tmp_path):
    """`RecordProgress` writes the record when training starts and after each
    checkpoint the Controller saves, the stop request's included (issue 32:
    an action, not a callback hung on the checkpoint manager)."""
    import json

    from tfloop.engine.run_dir import checkpointing

    step = step_variable()
    _, manager = checkpointing.create(model=tf.Module(), optimizer=tf.Module(), global_step=step,
                                      directory=str(tmp_path / "ckpt"), max_to_keep=5)
    path = str(tmp_path / "metrics.json")
    written = []

    def record(at, checkpoint):
        written.append((at, checkpoint and os.path.basename(checkpoint)))
        return {"step": at, "checkpoint": checkpoint}

    progress = actions.RecordProgress(path=path, record=record, step=0, checkpoint=None)
    request = StopRequest()
    stop = actions.StopOnSignal(request=request, checkpoint_manager=manager)
    controller = Controller(global_step=step, trainer=FakeTrainer(step), steps_per_loop=2,
                            checkpoint_manager=manager, checkpoint_interval=4,
                            train_actions=[progress, stop])
    controller.train(8)
    assert written == [(0, None), (4, "ckpt-4"), (8, "ckpt-8")]
    controller.save_checkpoint()  # the same step again: nothing new, nothing told
    assert len(written) == 3 and json.load(open(path))["step"] == 8
    request.requested = True
    with pytest.raises(actions.Preempted):
        controller.train(20)
    assert written[-1] == (10, "ckpt-10") and progress.last[0] == 10


def test_record_progress_refuses_a_record_that_is_not_callable():
    with pytest.raises(ValueError, match=r"`record` \('x'\) must be callable"):
        actions.RecordProgress(path="/tmp/m.json", record="x", step=0, checkpoint=None)


@pytest.mark.parametrize("build,says", [
    (lambda: actions.TrainSummaries(writer=None, interval=-1, global_batch_size=8),
     "`interval` (-1)"),
    (lambda: actions.TrainProgress(global_batch_size=0), "`global_batch_size` (0)"),
    (lambda: actions.Profile(steps=(5, 5), logdir="/tmp"), "`steps` (5, 5)"),
    (lambda: actions.Profile(steps=(1, 5), logdir=""), "`logdir` ('')"),
    (lambda: actions.EvalSummaries(writer=None), "`writer` (None)"),
    (lambda: actions.OnLoopEnd("print"), "`hook` ('print')"),
    (lambda: actions.StopOnSignal(request=True, checkpoint_manager=None), "`request` (True)"),
])
def test_actions_refuse_bad_arguments_naming_them(build, says):
    with pytest.raises(ValueError) as error:
        build()
    assert says in str(error.value)


def test_an_action_asking_to_stop_in_the_past_is_refused():
    class Stuck(Recorder):
        def next_stop(self, step):
            return step

    step = step_variable()
    controller = Controller(global_step=step, trainer=FakeTrainer(step), train_actions=[Stuck()])
    with pytest.raises(ValueError, match=r"next_stop\(0\) returned 0"):
        controller.train(5)


def _event_scalars(logdir):
    """{tag: [steps]} from the event files under `logdir`."""
    import collections

    steps = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(str(logdir), "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                steps[value.tag].append(event.step)
    return dict(steps)


def test_a_run_summarizes_its_last_step_and_its_learning_rate(tmp_path):
    """30 steps with summaries every 20: the event files hold step 20 and the
    final step 30 (not only 20), and `learning_rate` is a TensorBoard scalar."""
    from tfloop.engine.config import RunConfig
    from tfloop.engine.assembly.run import run

    config = RunConfig(strategy="one_device", devices="cpu:0", global_batch_size=32,
                       train_steps=30, steps_per_loop=10, summary_interval=20, mode="train",
                       export=False, lr_schedule="cosine", model_dir=str(tmp_path / "run"))
    run(config)
    scalars = _event_scalars(tmp_path / "run" / "summaries" / "train")
    assert scalars["loss"] == [20, 30]
    assert scalars["learning_rate"] == [20, 30]
    assert scalars["steps_per_second"] == [20, 30]
