"""engine.observe.stragglers: who counts as a straggler (the 2-worker run: tests/bin/test_diagnose.py)."""

import contextlib
import errno
import logging
import types

import pytest
import tensorflow as tf

from tfloop.engine.errors import RunFailure
from tfloop.engine.loop.actions import LoopEnd
from tfloop.engine.loop.summaries import SummaryWriter
from tfloop.engine.observe.step_time import LoopTime
from tfloop.engine.observe.stragglers import PERSISTENT, Stragglers
from tfloop.launch.tf_config import Role


def _stragglers(tables, threshold=3.0):
    role = Role("worker", 0, {"worker": ("node-a:2222", "node-b:2222", "node-c:2222")})
    strategy = types.SimpleNamespace(num_replicas_in_sync=3)
    # This worker's own last loop, as its trainer timed it (engine.observe.step_time).
    timed = LoopTime(start=0, steps=10, seconds=1.0, input=0.0, all_reduce=0.0)
    action = Stragglers(strategy=strategy, times=lambda: timed, role=role, threshold=threshold)
    action._exchange = lambda own, wait: tables.pop(0)  # what the collective would sum
    return action


def _loop(step):
    return LoopEnd(start=step - 10, step=step, target=1000, num_steps=10, seconds=1.0, metrics={})


def test_a_worker_slower_than_the_others_median_for_three_loops_is_named_once(caplog):
    slow = {"worker:0": (0.5, 0.0), "worker:1": (0.6, 0.0), "worker:2": (5.0, 4.0)}
    even = {"worker:0": (0.5, 0.0), "worker:1": (0.6, 0.0), "worker:2": (0.7, 0.0)}
    tables = [slow, slow, even, slow, slow, slow, slow]
    action = _stragglers(list(tables))
    with caplog.at_level(logging.WARNING):
        for step in range(10, 10 * (len(tables) + 1), 10):
            action(_loop(step))
    lines = [r.getMessage() for r in caplog.records if "straggler" in r.getMessage()]
    assert len(lines) == 1, lines  # the streak broke at the third loop; named once after
    assert lines[0].startswith(
        "straggler: worker:2 (host node-c) takes 500 ms per step of its own, 9.1x the other "
        f"workers' median 55 ms (threshold 3x) for {PERSISTENT} loops in a row (steps to 60)")
    assert "its input pipeline waits 400 ms per step" in lines[0]


def test_small_or_even_differences_name_nobody():
    action = _stragglers([])
    # 3x slower, but by less than 10 ms a step: noise on tiny steps.
    assert action.slow_workers({"worker:0": (0.001, 0), "worker:1": (0.004, 0)}) == {}
    assert action.slow_workers({"worker:0": (0.1, 0), "worker:1": (0.2, 0)}) == {}
    assert list(action.slow_workers({"worker:0": (0.1, 0), "worker:1": (0.5, 0.0)})) == [
        "worker:1"]


class _FullDisk:
    """TensorFlow's summary writer on a full disk: each flush fails."""

    def as_default(self, step=None):
        return contextlib.nullcontext()

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        pass


def test_a_full_disk_at_the_chiefs_tensorboard_flush_is_one_run_failure_line(
        tmp_path, monkeypatch):
    """The chief's straggler table flushed to a full disk was a traceback ending
    "a bug" (issue 38); now the RunFailure line of every summary write."""
    monkeypatch.setattr(tf.summary, "create_file_writer", lambda logdir: _FullDisk())
    logdir = tmp_path / "summaries" / "train"
    logdir.mkdir(parents=True)
    action = _stragglers([{"worker:0": (0.5, 0.0), "worker:1": (0.6, 0.0)}])
    action.writer = SummaryWriter(str(logdir))
    with pytest.raises(RunFailure) as failure:
        action(_loop(10))
    assert str(failure.value).startswith(
        f"could not write the TensorBoard summaries in {logdir} (No space left on device); ")
    assert " free there: free some space and run the same command" in str(failure.value)
