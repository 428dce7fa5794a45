"""Where a loop's time goes and how close it comes to the hardware (issue 25):
the input-bound warning and the `time/` scalars, `mfu` in the progress line
and metrics.json, and the FLOPs of a dense model's step against the hand count.

No timing assertions: the slow pipeline's cause is forced (a map that sleeps
0.05 s a batch, against a step of a few milliseconds), and the fast one reads batches
already made from memory.
"""

import glob
import json
import logging
import os
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfloop.engine.config import RunConfig
from tfloop.engine.observe import step_flops, step_time
from tfloop.engine.loop.replica_step import replica_gradients
from tfloop.engine.task.losses import LossOutput
from tfloop.engine.assembly.run import run
from tfloop.engine.run_dir.layout import RunDir
from tfloop.engine.runtime import hardware
from tfloop.engine.task import Task

# A step of a hundred milliseconds or more, so that even on a busy machine the fast
# pipeline's hand-over latency (a thread woken under load) stays a small share.
FEATURES, HIDDEN, BATCH = 256, 1024, 512


def _model(hidden=HIDDEN):
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(1)])


def _hand_count(batch, hidden=HIDDEN):
    """Forward 2·B·in·out per layer, the weight gradient as much, the input
    gradient as much for every layer but the first (its input needs none)."""
    layers = [(FEATURES, hidden), (hidden, hidden), (hidden, 1)]
    return sum(2 * batch * i * o * (2 if k == 0 else 3) for k, (i, o) in enumerate(layers))


def _loss(model, batch, *, training):
    x, y = batch
    return LossOutput(per_example_loss=tf.square(model(x, training=training)[:, 0] - y))


class Regression(Task):
    """Batches made once, in memory, prefetched; `sleep`: instead a map that
    sleeps that long per batch, not prefetched."""

    def __init__(self, sleep=0.0, hidden=HIDDEN):
        self.sleep, self.hidden = sleep, hidden

    def build_model(self):
        return _model(self.hidden)

    def train_dataset(self, context):
        rng = np.random.default_rng(0)
        x = rng.random((4, context.global_batch_size, FEATURES), np.float32)
        ds = tf.data.Dataset.from_tensor_slices((x, np.zeros((4, context.global_batch_size),
                                                             np.float32))).repeat()
        if self.sleep:
            def slow(x):
                time.sleep(self.sleep)
                return x

            ds = ds.map(lambda x, y: (tf.ensure_shape(tf.py_function(slow, [x], tf.float32),
                                                      x.shape), y))
            return ds  # no prefetch: nothing hides the sleep
        return ds.prefetch(2)

    def loss(self, model, batch, *, training):
        return _loss(model, batch, training=training)


def _train(model_dir, task, caplog, **overrides):
    config = RunConfig(**{**dict(strategy="mirrored", devices="cpu:0,cpu:1", model_dir=str(model_dir),
                       global_batch_size=BATCH, train_steps=12, steps_per_loop=4,
                       summary_interval=4, checkpoint_interval=0, optimizer="sgd", seed=1,
                       mode="train"), **overrides})
    with caplog.at_level(logging.INFO):
        record = run(config, task=task)
    lines = [r.getMessage() for r in caplog.records]
    return record, lines


def _scalars(logdir):
    values = {}
    for path in sorted(glob.glob(os.path.join(str(logdir), "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name != "scalars":
                    continue  # the run's graph and HParams are there too
                values.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor))))
    return values


def test_a_starved_pipeline_is_called_input_bound_with_the_breakdown_in_tensorboard(
        tmp_path, caplog):
    _, lines = _train(tmp_path / "run", Regression(sleep=0.05, hidden=64), caplog)
    warned = [line for line in lines if line.startswith("input-bound")]
    assert len(warned) == 1, lines  # once
    assert "prefetch" in warned[0] and "num_parallel_calls=tf.data.AUTOTUNE" in warned[0]
    assert "cache()" in warned[0] and "tf.data service" in warned[0]
    said = [line for line in lines if line.startswith("step time, steps 5-8: ")]
    assert len(said) == 1 and "input wait" in said[0] and "all-reduce" in said[0], lines
    scalars = _scalars(RunDir(str(tmp_path / "run")).summaries("train"))
    for tag in ("time/input_share", "time/all_reduce_share", "time/compute_share",
                "time/step_ms", "memory/host_peak_mb"):
        assert [step for step, _ in scalars[tag]] == [8, 12], (tag, scalars.get(tag))
    assert all(share > step_time.INPUT_BOUND for _, share in scalars["time/input_share"])
    for step in (8, 12):  # the shares add up to the loop
        total = sum(dict(scalars[f"time/{part}_share"])[step]
                    for part in ("input", "all_reduce", "compute"))
        assert total == pytest.approx(1.0, abs=1e-4)


def test_a_fast_pipeline_is_not_input_bound_and_mfu_is_reported(tmp_path, caplog, monkeypatch):
    # The peak a fast machine would measure: a probe while other tests load
    # this one reads low, and a loop faster than the peak reports no mfu
    # (step_flops.mfu), which would fail this test for the machine's load alone.
    monkeypatch.setenv("TFLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(hardware, "_MEASURED", {})
    monkeypatch.setattr(hardware, "matmul_flops_per_second",
                        lambda devices, dtype="float32": 1e13)
    record, lines = _train(tmp_path / "run", Regression(), caplog, strategy="one_device",
                           devices="cpu:0")
    assert not [line for line in lines if "input-bound" in line], lines
    progress = [line for line in lines if line.startswith("train step 12/12")]
    assert len(progress) == 1 and float(progress[0].split("  mfu ")[1].split()[0]) > 0, progress
    written = json.loads(open(RunDir(str(tmp_path / "run")).metrics_json).read())
    assert written["mfu"] > 0 and written["train/mfu"] > 0
    assert written["peak_flops_per_second"] > 0 and "matmul rate" in written["peak_source"]
    assert written["peak_memory"]["host_peak_mb"] > 0
    # The step's FLOPs, counted in its own graph.
    assert 0.9 < written["flops_per_step"] / _hand_count(BATCH) < 1.5


def test_a_dense_steps_flops_are_the_hand_count():
    model, optimizer = _model(256), keras.optimizers.SGD()
    spec = step_flops.replica_spec(
        (tf.TensorSpec([None, FEATURES]), tf.TensorSpec([None])), 64)
    flops = step_flops.count(lambda batch: replica_gradients(
        _loss, model, batch, model.trainable_variables, optimizer=optimizer,
        global_batch_size=64), spec)
    assert 0.9 < flops / _hand_count(64, hidden=256) < 1.5
    assert step_flops.count(lambda batch: 1 / 0, spec) is None  # no count, no failure
    assert step_flops.mfu(flops, 10, 2.0, 5 * flops) == pytest.approx(1.0)
    assert step_flops.mfu(None, 10, 2.0, 1.0) is None


def test_the_breakdown_adds_up_and_its_line_reads():
    loop = step_time.LoopTime(start=10, steps=10, seconds=0.2, input=0.1, all_reduce=0.02)
    assert loop.shares() == pytest.approx({"input": 0.5, "all_reduce": 0.1, "compute": 0.4})
    assert loop.input_bound
    assert step_time.describe(loop, 0.123, {"host_peak_mb": 812.0}) == (
        "step time, steps 11-20: 20.00 ms/step = input wait 50% + all-reduce 10% + compute "
        "40%; mfu 12.3%; peak memory host 812 MB")


def test_sigusr1_samples_the_next_loop_and_logs_its_breakdown(caplog):
    import signal
    import threading

    from tfloop.engine.loop.actions import LoopEnd
    from tfloop.engine.observe.clock import SampledClock

    # pytest (and each xdist worker) runs tests on the main thread, where
    # signal handlers can be installed.
    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGUSR1)
    clock = SampledClock(sample_every=100, first_samples=3)
    stamps = {"input": 0.01, "all_reduce": 0.02, "stamped": 0.2}
    report = step_time.Report(clock=clock, writer=None, interval=0)
    end = LoopEnd(start=0, step=10, target=100, num_steps=10, seconds=0.2, metrics={})

    def loop():  # what the trainer does: the clock's three points, then the actions
        sampled = clock.begin(0)
        clock.end(None, start=0, steps=10, stamped=stamps if sampled else {})
        report(end)
        return sampled

    report.train_begin(0)
    try:
        with caplog.at_level(logging.INFO, logger="tfloop.engine.observe.step_time"):
            ran = [loop() for _ in range(5)]  # the first loop traces; 2-4 are sampled
            os.kill(os.getpid(), signal.SIGUSR1)
            ran += [loop(), loop()]  # asked: the next loop is sampled, then no more
    finally:
        report.close()
    assert ran == [False, True, True, True, False, True, False]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step time")]
    assert len(said) == 2, said
    assert said[0].startswith("step time, steps 1-10: 20.00 ms/step = input wait 5% + "
                              "all-reduce 10% + compute 85%")
    assert signal.getsignal(signal.SIGUSR1) == before  # given back


@pytest.mark.parametrize("rate, warned", [(1000.0, False), (30.0, True), (None, True)])
def test_a_long_input_wait_warns_only_where_the_pipeline_cannot_keep_up(caplog, rate, warned):
    """60% input wait on 10 ms steps (100 steps/s): a pipeline alone at 1000
    batches/s keeps up (the wait is the iterator's hand-over: one info line,
    no warning); at 30 it does not; unknown, the share decides."""
    import types

    from tfloop.engine.loop.actions import LoopEnd

    loop = step_time.LoopTime(start=0, steps=10, seconds=0.1, input=0.06, all_reduce=0.0,
                              stamped=0.1)
    clock = types.SimpleNamespace(last=loop, ask=lambda: None)
    asked = []
    report = step_time.Report(clock=clock, writer=None, interval=0,
                              pipeline_rate=lambda: asked.append(1) or rate)
    end = LoopEnd(start=0, step=10, target=100, num_steps=10, seconds=0.1, metrics={})
    with caplog.at_level(logging.INFO, logger="tfloop.engine.observe.step_time"):
        for _ in range(3):
            report(end)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if "not input-bound" in r.getMessage()]
    assert len(asked) == 1  # measured once
    assert len(warnings) == (1 if warned else 0), warnings
    assert len(infos) == (0 if warned else 1), infos
    if warned:
        assert warnings[0].startswith("input-bound: the replicas waited on tf.data for 60% of "
                                      "steps 1-10")
    else:
        assert "delivers 1000 batches/s, 10.0x the loop's 100 steps/s" in infos[0]
