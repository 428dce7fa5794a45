"""Multi-worker training through bin/launch on loopback (SIGTERM: test_train_cli.py)."""

import json
import os
import signal
import socket
import time

import numpy as np
import tensorflow as tf

from helpers import run_bin

FLAGS = ["--global_batch_size=32", "--train_steps=30", "--steps_per_loop=10",
         "--checkpoint_interval=10", "--optimizer=sgd", "--learning_rate=0.1",
         "--mode=train", "--seed=3"]


def _weights(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    names = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith("model_weights/"))
    assert names
    return {n: reader.get_tensor(n) for n in names}


def test_two_workers_train_like_mirrored_over_two_devices(tmp_path):
    worker_tmp = tmp_path / "worker_tmp"
    worker_tmp.mkdir()
    cluster_dir = tmp_path / "cluster"
    result = run_bin(
        "launch", "--num_workers=2", "--grace_period=5", "--",
        "bin/train", "--strategy=multi_worker", "--collective=ring", f"--model_dir={cluster_dir}",
        *FLAGS, env={"TMPDIR": str(worker_tmp)}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[worker:1]" in result.stdout and "train step 30/30" in result.stdout
    # Only the chief wrote to model_dir; the other worker's saves are gone.
    assert tf.train.latest_checkpoint(str(cluster_dir)).endswith("ckpt-30")
    assert json.loads((cluster_dir / "metrics.json").read_text())["num_replicas"] == 2
    assert os.listdir(worker_tmp) == []

    mirrored_dir = tmp_path / "mirrored"
    result = run_bin("train", "--strategy=mirrored", "--devices=cpu:0,cpu:1",
                     f"--model_dir={mirrored_dir}", *FLAGS)
    assert result.returncode == 0, result.stderr[-3000:]
    cluster_weights, mirrored_weights = _weights(cluster_dir), _weights(mirrored_dir)
    for name, value in mirrored_weights.items():
        np.testing.assert_allclose(cluster_weights[name], value, rtol=1e-5, atol=1e-6)


def test_tf_config_mistakes_are_one_line(tmp_path):
    from helpers import assert_one_line_error

    bad = json.dumps({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 3}})
    result = run_bin("train", "--strategy=multi_worker", f"--model_dir={tmp_path / 'run'}",
                     env={"TF_CONFIG": bad})
    assert_one_line_error(result, contains="task index 3 is out of range")
    result = run_bin("train", "--strategy=mirrored", f"--model_dir={tmp_path / 'run'}",
                     env={"TF_CONFIG": bad.replace('"index": 3', '"index": 0')})
    assert_one_line_error(result, contains="use --strategy=multi_worker")
    assert not (tmp_path / "run").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_a_port_in_use_is_one_line_and_writes_nothing(tmp_path):
    from helpers import assert_one_line_error

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        address = f"localhost:{busy.getsockname()[1]}"
        config = json.dumps({"cluster": {"worker": [address]}, "task": {"type": "worker", "index": 0}})
        result = run_bin("train", "--strategy=multi_worker", f"--model_dir={tmp_path / 'run'}",
                         env={"TF_CONFIG": config})
    assert_one_line_error(result, contains=f"{address}, but port")
    assert not (tmp_path / "run").exists()


def test_a_worker_that_never_comes_up_ends_the_wait_with_one_line(tmp_path):
    from helpers import assert_one_line_error

    # worker:1 is never started: worker:0 would wait in TensorFlow forever.
    cluster = {"worker": [f"localhost:{_free_port()}", f"localhost:{_free_port()}"]}
    config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    start = time.monotonic()
    result = run_bin("train", "--strategy=multi_worker", "--startup_timeout=3",
                     f"--model_dir={tmp_path / 'run'}", env={"TF_CONFIG": config}, timeout=120)
    assert time.monotonic() - start < 100  # bounded: the subprocess timeout is the hard stop
    assert result.returncode == -signal.SIGKILL  # see engine/watchdog.py for why
    line = assert_one_line_error(result, contains="worker:0 waited 3 s for the cluster")
    assert cluster["worker"][1] in line and "--startup_timeout" in line
    assert not (tmp_path / "run").exists()


def test_the_evaluator_evaluates_checkpoints_and_stops_after_the_last(tmp_path):
    model_dir = tmp_path / "run"
    result = run_bin(
        "launch", "--num_workers=2", "--evaluator", "--grace_period=5", "--evaluator_timeout=120",
        "--", "bin/train", "--strategy=multi_worker", f"--model_dir={model_dir}",
        "--eval_timeout=60", *FLAGS, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # It may skip checkpoints written while it was busy, never the final one.
    assert "[evaluator]" in result.stdout and "eval  step 30" in result.stdout
    steps = set()
    for path in (model_dir / "summaries" / "eval").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            if any(value.tag == "accuracy" for value in event.summary.value):
                steps.add(event.step)
    assert 30 in steps and steps <= {10, 20, 30}
