"""Inside a 2-worker run through bin/launch: the slow worker named, the hang dumped and gathered.

One launch checks both (a cluster is the costly part): worker 1's input
sleeps a little on every batch (a straggler, forced: its own time per step
is its input's sleep, worker 0's a few ms; threshold 2x), then blocks once for
`BLOCK_S` seconds, far past `--hang_timeout`, and goes on, so the run ends
cleanly after both workers dumped what they were doing into the folder
bin/launch passed down.
"""

import glob
import os
import re

import tensorflow as tf

from helpers import run_bin

BLOCK_S, HANG_TIMEOUT_S = 10, 3

_TASK = f'''
import json, os, time
import tensorflow as tf
from tfloop.engine.task import ClassificationTask

def _index():
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]

class SlowWorker1(ClassificationTask):
    """Worker 1's input: 150 ms per batch, and its 25th batch blocks {BLOCK_S} s."""

    def train_dataset(self, context):
        dataset = super().train_dataset(context)
        if _index() != 1:
            return dataset
        seen = [0]

        def block_here():
            time.sleep({BLOCK_S})

        def slow(*batch):
            seen[0] += 1
            time.sleep(0.15)
            if seen[0] == 25:
                block_here()
            return 0

        def add_sleep(*batch):
            done = tf.py_function(slow, [], tf.int32)
            with tf.control_dependencies([done]):
                return tf.nest.map_structure(tf.identity, batch)

        return dataset.map(add_sleep)
'''


def test_the_slow_worker_is_named_and_a_hang_is_dumped_by_every_worker(tmp_path):
    (tmp_path / "slow_task.py").write_text(_TASK)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    diagnostics = tmp_path / "diagnostics"
    result = run_bin(
        "launch", "--num_workers=2", "--grace_period=5", f"--diagnostics_dir={diagnostics}",
        "--timeout=280", "--",
        "bin/train", "--task=slow_task:SlowWorker1", f"--model_dir={tmp_path / 'run'}",
        "--strategy=multi_worker", "--collective=ring", "--global_batch_size=32",
        "--train_steps=40", "--steps_per_loop=4", "--checkpoint_interval=0", "--export=false",
        f"--hang_timeout={HANG_TIMEOUT_S}", "--straggler_threshold=2", "--mode=train",
        env=env, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # The chief names the slow worker, its host, and its input as the cause; not worker 0.
    assert re.search(r"straggler: worker:1 \(host localhost\) takes \d+ ms per step of its "
                     r"own, [\d.]+x the other workers' median", output), output[-4000:]
    assert "its input pipeline waits" in output
    assert "straggler: worker:0" not in output
    # Every worker's times, per loop, in TensorBoard (the chief's summaries/train).
    tags = {value.tag for path in glob.glob(str(tmp_path / "run/summaries/train/events.*"))
            for event in tf.compat.v1.train.summary_iterator(path)
            for value in event.summary.value}
    assert {f"workers/worker:{i}/{name}_seconds_per_step" for i in (0, 1)
            for name in ("own", "input")} <= tags, sorted(tags)
    # Each worker dumped while worker 1 was blocked, into bin/launch's folder, which named them.
    dumps = {name: (diagnostics / name).read_text() for name in os.listdir(diagnostics)}
    assert "diagnostics:" in result.stderr and "hang dump(s)" in result.stderr
    for worker in ("worker:0", "worker:1"):
        blocked = [text for text in dumps.values() if text.startswith(f"hang dump: {worker} ")
                   and "why: no train loop ended in 3 s (--hang_timeout)" in text
                   and re.search(r"last completed step: (1[2-9]|2\d|3\d)", text)]
        assert blocked, (worker, sorted(dumps), output[-3000:])
        assert "phase: train (the compiled loop from step" in blocked[-1]
        assert "--- thread MainThread" in blocked[-1]
    # Worker 1's dump holds the stack of the thread that blocks, in the task's own code.
    assert any("block_here" in text for name, text in dumps.items() if "worker_1" in name)
    # The run went on after the dumps and finished.
    assert "train step 40/40" in output
