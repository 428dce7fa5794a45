"""The hang dump's view inside a step (`engine.loop.step_phase`): two
counters and the global step, marked once per step each, read from outside."""

import threading
import time

import numpy as np
import tensorflow as tf

from tfloop.engine.loop import step_phase

#: Bounded waits (seconds) for a loop in another thread.
WAIT_S = 60


def _phase(steps_done: int, batches: int, reductions: int, *, takes_input=True, reduces=True):
    step = tf.Variable(steps_done, dtype=tf.int64)
    phase = step_phase.StepPhase(step, "/cpu:0", takes_input=takes_input)
    phase.batches.assign(batches)
    phase.reductions.assign(reductions)
    phase._reduces = reduces
    return phase.describe_phase()


def test_the_counters_name_the_phase():
    assert _phase(7, 7, 7) == step_phase.INPUT  # step 8's batch has not arrived
    assert _phase(7, 8, 7) == step_phase.FORWARD_BACKWARD
    assert _phase(7, 8, 8) == step_phase.ALL_REDUCE
    assert _phase(7, 8, 7, reduces=False) == step_phase.STEP  # one replica: no all-reduce
    # One batch kept on the devices (--synthetic_on_device): no step waits on input.
    assert _phase(7, 7, 7, takes_input=False) == step_phase.FORWARD_BACKWARD
    assert _phase(7, 7, 8, takes_input=False) == step_phase.ALL_REDUCE


def test_a_loop_blocked_on_its_input_is_read_as_waiting_on_input(mirrored_trainer):
    """A dataset whose fourth batch waits for an event: the loop stops in
    `next(iterator)`, and the dump's thread reads that, while the loop runs."""
    release = threading.Event()

    def batches():
        for index in range(64):
            if index == 3:
                release.wait(WAIT_S)
            yield np.full([8, 4], index, np.float32), np.zeros([8], np.int64)

    dataset = tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec([8, 4], tf.float32), tf.TensorSpec([8], tf.int64)))
    trainer = mirrored_trainer(dataset, features=4, outputs=3)
    step = trainer.global_step
    trainer.train(1)  # traced; its counters now equal the global step
    assert trainer.step_phase.describe_phase() == step_phase.INPUT
    loop = threading.Thread(target=trainer.train, args=(4,), daemon=True)
    loop.start()
    try:
        deadline, last, steady_since = time.monotonic() + WAIT_S, -1, time.monotonic()
        while time.monotonic() < deadline:  # until the step stops moving for a second
            now = int(step.numpy())
            if now != last:
                last, steady_since = now, time.monotonic()
            elif time.monotonic() - steady_since > 1.0:
                break
            time.sleep(0.05)
        assert 1 <= last < 5
        assert trainer.step_phase.describe_phase() == step_phase.INPUT
    finally:
        release.set()
        loop.join(WAIT_S)
    assert not loop.is_alive() and int(step.numpy()) == 5
    # Every step marked its batch and its all-reduce once.
    assert int(trainer.step_phase.batches.numpy()) == 5
    assert int(trainer.step_phase.reductions.numpy()) == 5
