"""Exact resume at every kind of point of every epoch, whatever the engine measures.

A run stopped at step s and run again to the end holds bit for bit the
weights of the run that never stopped: stopped mid first epoch, at an epoch
boundary, mid second and mid third epoch (`reshuffled_task`: 8 steps an
epoch, reshuffled every epoch with the run's seed), each side with an
input-bound sampled loop, so the step-time report probes the input's own
rate (`engine.observe.step_time.pipeline_rate`) at another point of the
stream in every run. (Every sampled loop counts as input-bound here,
`INPUT_BOUND = 0`: what a slow pipeline does, without depending on how
fast this machine is at the moment.) The probe reads a pipeline built for it
(`Task.probe_dataset`); when it read the run's own dataset it took seeds of
the run's later epochs, and resumes after the first epoch differed (issue 38).
The same after kill -9 with local checkpoints, and with `--synthetic_on_device`
(one batch kept on the devices: the stream's first, on resume too).
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import REPO, bin_env
from reshuffled_task import Reshuffled
from tfloop.engine import run
from tfloop.engine.config import RunConfig
from tfloop.engine.observe import step_time

#: mid first epoch, its end, mid second, mid third (8 steps an epoch); then to END.
STOPS = (5, 8, 12, 20)
END = 28
SETTINGS = dict(strategy="mirrored", devices="cpu:0,cpu:1", collective="reduce_to_one_device",
                global_batch_size=8, steps_per_loop=2, checkpoint_interval=1000, mode="train",
                export=False, seed=5, summary_interval=0, optimizer="adam", learning_rate=0.05)

#: Runs the engine on `reshuffled_task` with a config (JSON), SIGKILLing itself
#: at the end of the loop that reaches a step (0: never).
KILL_AT_STEP = """
import json, os, signal, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "engine"))
from reshuffled_task import Reshuffled
from tfloop.engine import run
from tfloop.engine.config import RunConfig
from tfloop.engine.observe import step_time
step_time.INPUT_BOUND = 0.0  # every sampled loop probes the input (the test's docstring)
kill_at = int(sys.argv[2])
def on_loop_end(step, metrics):
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
run(RunConfig(**json.loads(sys.argv[1])), task=Reshuffled(), on_loop_end=on_loop_end,
    verbose=True)
"""


def _weights(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith("model_weights/")]
    assert names, reader.get_variable_to_shape_map()
    return {n: reader.get_tensor(n) for n in names}, int(
        reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE"))


def _assert_same(got, expected):
    assert got[1] == expected[1], (got[1], expected[1])
    for name, value in expected[0].items():
        np.testing.assert_array_equal(got[0][name], value, err_msg=name)


@pytest.fixture
def probes(monkeypatch):
    """How many times the input-rate probe ran (it still runs, for real)."""
    calls = []
    measure = step_time.pipeline_rate

    def counted(dataset, **kwargs):
        calls.append(dataset)
        return measure(dataset, **kwargs)

    monkeypatch.setattr(step_time, "pipeline_rate", counted)
    monkeypatch.setattr(step_time, "INPUT_BOUND", 0.0)
    return calls


def test_stops_mid_epoch_at_its_end_and_in_later_epochs_resume_bit_identical(tmp_path, probes):
    straight = tmp_path / "straight"
    run(RunConfig(**SETTINGS, model_dir=str(straight), train_steps=END), task=Reshuffled())
    assert len(probes) == 1, "the uninterrupted run's input-bound loop did not probe the input"
    stopped = tmp_path / "stopped"
    for number, stop in enumerate((*STOPS, END), start=1):
        result = run(RunConfig(**SETTINGS, model_dir=str(stopped), train_steps=stop),
                     task=Reshuffled())
        assert result["step"] == stop
        assert len(probes) == 1 + number, f"the run to step {stop} did not probe its input"
    _assert_same(_weights(stopped), _weights(straight))


def test_kill_9_and_resume_from_local_checkpoints_is_bit_identical(tmp_path):
    settings = dict(SETTINGS, train_steps=END, local_checkpoint_dir=str(tmp_path / "shm"),
                    local_checkpoint_interval=2)

    def engine(model_dir, kill_at):
        return subprocess.run(
            [sys.executable, "-c", KILL_AT_STEP,
             json.dumps(dict(settings, model_dir=str(model_dir))), str(kill_at)],
            capture_output=True, text=True, timeout=300, env=bin_env(), cwd=REPO)

    straight = engine(tmp_path / "straight", 0)
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = tmp_path / "killed"
    for kill_at in (12, 20):  # mid second epoch, mid third
        ended = engine(killed, kill_at)
        assert ended.returncode == -signal.SIGKILL, ended.stderr[-3000:]
    resumed = engine(killed, 0)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from the local checkpoint" in resumed.stdout + resumed.stderr
    for ended in (straight, resumed):
        assert "pipeline alone delivers" in ended.stdout + ended.stderr  # the probe ran
    _assert_same(_weights(killed), _weights(tmp_path / "straight"))


def test_synthetic_on_device_resumes_on_the_same_batch(tmp_path):
    settings = dict(SETTINGS, model="mlp", dataset="synthetic", synthetic_on_device=True)
    run(RunConfig(**settings, model_dir=str(tmp_path / "straight"), train_steps=12))
    for stop in (5, 12):
        run(RunConfig(**settings, model_dir=str(tmp_path / "stopped"), train_steps=stop))
    _assert_same(_weights(tmp_path / "stopped"), _weights(tmp_path / "straight"))
