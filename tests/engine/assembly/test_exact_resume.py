"""Exact resume at every kind of point of every epoch, whatever the engine measures.

A run stopped at step s and run again to the end holds bit for bit the
weights of the run that never stopped: stopped mid first epoch, at an epoch
boundary, mid second and mid third epoch (`reshuffled_task`: 8 steps an
epoch, reshuffled every epoch with the run's seed), each side with an
input-bound sampled loop, so the step-time report probes the input's own
rate (`engine.observe.step_time.pipeline_rate`) at another point of the
stream in every run. (Every sampled loop counts as input-bound here,
`INPUT_BOUND = 0`: what a slow pipeline does, without depending on how
fast this machine is at the moment; the runs are in processes of their
own, since op determinism, which other tests enable in the suite's
process, allows no sampled loop.) The probe reads a pipeline built for it
(`Task.probe_dataset`); when it read the run's own dataset it took seeds of
the run's later epochs, and resumes after the first epoch differed (issue 38).
The same after kill -9 with local checkpoints, and with `--synthetic_on_device`
(one batch kept on the devices: the stream's first, on resume too).
"""

import json
import signal

import numpy as np
import tensorflow as tf

from helpers import bin_env, run_python
from tfloop.engine import run
from tfloop.engine.config import RunConfig

#: mid first epoch, its end, mid second, mid third (8 steps an epoch); then to END.
STOPS = (5, 8, 12, 20)
END = 28
SETTINGS = dict(strategy="mirrored", devices="cpu:0,cpu:1", collective="reduce_to_one_device",
                global_batch_size=8, steps_per_loop=2, checkpoint_interval=1000, mode="train",
                export=False, seed=5, summary_interval=0, optimizer="adam", learning_rate=0.05)
LOCAL = dict(local_checkpoint_interval=2)

#: Runs the engine on `reshuffled_task` in a process of its own (op determinism,
#: which another test may have enabled in the suite's process, allows no
#: sampled loop and so no probe): for each [model_dir, train_steps, kill_at] of
#: argv[2] (JSON), one run, SIGKILLing itself at the end of the loop that
#: reaches kill_at (0: never), printing how many times it probed its input.
RUNS = """
import json, os, signal, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "engine", "assembly"))
from reshuffled_task import Reshuffled
from tfloop.engine import run
from tfloop.engine.config import RunConfig
from tfloop.engine.observe import step_time
step_time.INPUT_BOUND = 0.0  # every sampled loop probes the input (the test's docstring)
measure, probes = step_time.pipeline_rate, []
def counted(dataset, **kwargs):
    probes.append(1)
    return measure(dataset, **kwargs)
step_time.pipeline_rate = counted
settings = json.loads(sys.argv[1])
for model_dir, steps, kill_at in json.loads(sys.argv[2]):
    def on_loop_end(step, metrics):
        if step == kill_at:
            print(json.dumps({"model_dir": model_dir, "probed": len(probes)}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    probes.clear()
    run(RunConfig(**settings, model_dir=model_dir, train_steps=steps), task=Reshuffled(),
        on_loop_end=on_loop_end, verbose=True)
    print(json.dumps({"model_dir": model_dir, "probed": len(probes)}), flush=True)
"""


def _runs(settings, runs):
    """`RUNS` in a subprocess: (its CompletedProcess, how many times each run probed its input)."""
    ended = run_python(["-c", RUNS, json.dumps(settings), json.dumps(runs)], timeout=300,
                       env=bin_env())
    probed = [json.loads(line)["probed"] for line in ended.stdout.splitlines()
              if line.startswith("{")]
    return ended, probed


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


def test_stops_at_every_kind_of_point_resume_bit_identical_with_and_without_local_checkpoints(
        tmp_path):
    straight, stopped, killed = (str(tmp_path / name) for name in ("straight", "stopped",
                                                                   "killed"))
    ended, probed = _runs(SETTINGS, [[straight, END, 0]]
                          + [[stopped, stop, 0] for stop in (*STOPS, END)])
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert len(probed) == 2 + len(STOPS) and min(probed) >= 1, (
        f"every run must probe its input: {probed}")
    expected = _weights(straight)
    _assert_same(_weights(stopped), expected)

    # kill -9 at 12 (mid second epoch) and 20 (mid third), resumed from the local checkpoints.
    local = dict(SETTINGS, **LOCAL, local_checkpoint_dir=str(tmp_path / "shm"))
    for kill_at in (12, 20):
        ended, probed = _runs(local, [[killed, END, kill_at]])
        assert ended.returncode == -signal.SIGKILL, ended.stderr[-3000:]
        assert probed and probed[0] >= 1, probed
    ended, probed = _runs(local, [[killed, END, 0]])
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert "resuming from the local checkpoint" in ended.stdout + ended.stderr
    assert probed == [probed[0]] and probed[0] >= 1, probed
    _assert_same(_weights(killed), expected)


def test_synthetic_on_device_resumes_on_the_same_batch(tmp_path):
    settings = dict(SETTINGS, model="mlp", dataset="synthetic", synthetic_on_device=True)
    run(RunConfig(**settings, model_dir=str(tmp_path / "straight"), train_steps=12))
    for stop in (5, 12):
        run(RunConfig(**settings, model_dir=str(tmp_path / "stopped"), train_steps=stop))
    _assert_same(_weights(tmp_path / "stopped"), _weights(tmp_path / "straight"))
