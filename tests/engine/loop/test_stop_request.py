"""Stopping on a signal: a flag, never an exception mid-step (but a second Ctrl-C);
in one process the signal's relay also ends the running compiled loop after
the step in flight (the trainer's host-side stop flag); at that loop's end
the StopOnSignal action saves and raises `Preempted`."""

import os
import signal

import pytest
import tensorflow as tf

from tfloop.engine.loop.actions import StopOnSignal
from tfloop.engine.loop.controller import Controller
from tfloop.engine.loop.preemption import Preempted, StopRequest
from fakes import FakeTrainer, step_variable


def _deliver(signum):
    os.kill(os.getpid(), signum)  # the handler runs before the next bytecode


def test_sigterm_and_ctrl_c_only_record_a_request():
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        request = StopRequest().install()
        try:
            _deliver(signum)
            assert request.agreed() and request.signum == signum
            assert Preempted(7, "ckpt-7", request.signum).exit_status == status
        finally:
            request.uninstall()
    # uninstall() puts back whatever handlers were there before.
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_a_second_ctrl_c_stops_at_once():
    request = StopRequest().install()
    try:
        _deliver(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            _deliver(signal.SIGINT)
    finally:
        request.uninstall()


def _controller(tmp_path, signal_at, request, signum=signal.SIGTERM):
    step = step_variable()
    trainer = FakeTrainer(step, during=lambda at: _deliver(signum) if at == signal_at else None)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(global_step=step),
                                         directory=str(tmp_path), max_to_keep=None)
    stop = StopOnSignal(request=request, checkpoint_manager=manager)
    return Controller(global_step=step, trainer=trainer, steps_per_loop=3,
                      checkpoint_manager=manager, checkpoint_interval=10,
                      train_actions=[stop]), trainer


def test_a_signal_mid_loop_stops_at_its_end_saves_and_raises_preempted(tmp_path):
    for signum, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        request = StopRequest().install()
        try:
            controller, trainer = _controller(tmp_path / str(signum), 6, request, signum)
            with pytest.raises(Preempted) as stopped:
                controller.train(30)
        finally:
            request.uninstall()
        assert trainer.loop_ends == [3, 6]  # the loop the signal arrived in ran to its end
        assert stopped.value.step == 6 and stopped.value.exit_status == status
        assert stopped.value.checkpoint.endswith("ckpt-6")  # not a checkpoint_interval multiple
        assert tf.train.latest_checkpoint(str(tmp_path / str(signum))).endswith("ckpt-6")


def test_a_signal_in_the_last_loop_lets_the_run_finish(tmp_path):
    request = StopRequest().install()
    try:
        controller, trainer = _controller(tmp_path, 9, request)
        controller.train(9)  # no Preempted: the run ends here with its final checkpoint
    finally:
        request.uninstall()
    assert trainer.loop_ends == [3, 6, 9]
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-9")


def test_the_stop_flag_is_summed_as_float32(cpu_devices):
    """What multi_worker all-reduces each loop: float32, the dtype every
    collective (NCCL included) reduces on GPUs; int32 lives in host memory there."""
    strategy = tf.distribute.MirroredStrategy(cpu_devices[:2])
    reduced = []

    class Spy:
        def __getattr__(self, name):
            return getattr(strategy, name)

        def reduce(self, op, value, axis):
            reduced.append({part.dtype for part in value.values})
            return strategy.reduce(op, value, axis=axis)

    request = StopRequest(Spy())
    assert request.agreed() is False
    request.requested = True
    assert request.agreed() is True
    assert reduced == [{tf.float32}, {tf.float32}]


#: Seconds each step of `_slow_trainer` takes at least (a wait on the host clock).
SLOW_STEP = 0.05


def _slow_trainer(devices, stops_at_any_step=True):
    """A Trainer over `devices` whose every step waits `SLOW_STEP` s on each replica."""
    import keras

    from tfloop import collectives
    from tfloop.engine.loop.trainer import Trainer
    from tfloop.engine.task.losses import LossOutput

    def slow_loss(model, batch, training):
        features, labels = batch
        start = tf.timestamp()
        waited = tf.while_loop(lambda now: now - start < SLOW_STEP,
                               lambda now: [tf.timestamp()], [start])
        with tf.control_dependencies(waited):
            features = tf.identity(features)
        return LossOutput(per_example_loss=keras.losses.sparse_categorical_crossentropy(
            labels, model(features, training=training), from_logits=True))

    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        step = tf.Variable(0, dtype=tf.int64,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    dataset = tf.data.Dataset.from_tensors((tf.zeros([8, 8]), tf.zeros([8], tf.int64))).repeat()
    return Trainer(strategy=strategy, model=model, global_step=step, train_dataset=dataset,
                   collective=collectives.create("reduce_to_one_device", devices=devices),
                   global_batch_size=8, optimizer=keras.optimizers.SGD(0.1), loss_fn=slow_loss,
                   stops_at_any_step=stops_at_any_step)


def test_a_signal_mid_loop_ends_a_one_process_loop_after_the_step_in_flight(cpu_devices):
    """The signal's byte reaches the relay thread while the main thread is
    inside the compiled loop (no Python handler can run there), which sets
    the trainer's host-side stop flag: the loop of 400 steps ends a few steps
    after the signal, not at its end; every later loop makes one step."""
    import threading

    trainer = _slow_trainer(cpu_devices[:2])
    trainer.train(1)  # traced and compiled before the clock starts
    request = StopRequest(stop_step=trainer.request_stop).install()
    try:
        assert request.stops_at_a_step
        signal_after = 20 * SLOW_STEP
        threading.Timer(signal_after, _deliver, args=(signal.SIGTERM,)).start()
        trainer.train(400)
        stopped_at = int(trainer.global_step.numpy())
        assert request.requested and request.signum == signal.SIGTERM
        # A step takes SLOW_STEP or more: the signal came by step 21; TensorFlow's
        # while loop may have started up to 10 iterations ahead (parallel_iterations).
        assert 1 < stopped_at <= 1 + 20 + 10, stopped_at
        trainer.train(400)
        assert int(trainer.global_step.numpy()) == stopped_at + 1
    finally:
        request.uninstall()


def test_a_cluster_trainer_ends_its_loop_where_planned():
    """A multi-worker trainer (`stops_at_any_step=False`) has no flag to set:
    its workers stop together at the loop's end (`agreed`)."""
    trainer = _slow_trainer(["/cpu:0"], stops_at_any_step=False)
    trainer.request_stop()
    trainer.train(3)
    assert int(trainer.global_step.numpy()) == 3


def test_stop_step_is_for_one_process_only(cpu_devices):
    with pytest.raises(ValueError, match="not both"):
        StopRequest(tf.distribute.OneDeviceStrategy("/cpu:0"), stop_step=lambda: None)
