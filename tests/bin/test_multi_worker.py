"""Multi-worker training through bin/launch on loopback (SIGTERM: test_train_cli.py)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from helpers import KILL_AFTER_FIRST_CHECKPOINT, run_bin, start_python
from tfloop.launch import threads

TRAIN_STEPS, CHECKPOINT_INTERVAL = 400, 100
# --deterministic: a resumed run must reproduce the uninterrupted one exactly.
FLAGS = ["--global_batch_size=32", f"--train_steps={TRAIN_STEPS}", "--steps_per_loop=20",
         f"--checkpoint_interval={CHECKPOINT_INTERVAL}", "--optimizer=sgd",
         "--learning_rate=0.1", "--mode=train", "--seed=3", "--deterministic"]
CLUSTER = ["--strategy=multi_worker", "--collective=ring", *FLAGS]
#: The tests that read `mirrored_weights`: on one pytest worker, so it trains once.
MIRRORED = pytest.mark.xdist_group("test_multi_worker_mirrored")


def _launch(*args: str, **kwargs):
    """`bin/launch args...` run to its end (a fresh interpreter: helpers.WITHOUT_TENSORFLOW)."""
    return run_bin("launch", *args, **kwargs)


def _weights(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    names = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith("model_weights/"))
    assert names
    return {n: reader.get_tensor(n) for n in names}


def _assert_same_weights(actual_dir, expected: dict, rtol=1e-5, atol=1e-6):
    actual = _weights(actual_dir)
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=rtol, atol=atol, err_msg=name)


@pytest.fixture(scope="module")
def mirrored_weights(tmp_path_factory):
    """The one-process reference: mirrored over two logical CPUs, same global batch."""
    model_dir = tmp_path_factory.mktemp("mirrored")
    result = run_bin("train", "--strategy=mirrored", "--devices=cpu:0,cpu:1",
                     f"--model_dir={model_dir}", *FLAGS)
    assert result.returncode == 0, result.stderr[-3000:]
    return _weights(model_dir)


@MIRRORED
def test_two_workers_train_like_mirrored_over_two_devices(tmp_path, mirrored_weights):
    worker_tmp = tmp_path / "worker_tmp"
    worker_tmp.mkdir()
    cluster_dir = tmp_path / "cluster"
    result = _launch(
        "--num_workers=2", "--grace_period=5", "--",
        "bin/train", f"--model_dir={cluster_dir}", *CLUSTER,
        env={"TMPDIR": str(worker_tmp)}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[worker:1]" in result.stdout
    assert f"train step {TRAIN_STEPS}/{TRAIN_STEPS}" in result.stdout
    # The start-up line names the reduction that runs; each task warns of its open port.
    for worker in ("worker:0", "worker:1"):
        assert (f"{worker}: multi_worker over 2 replica(s) [cpu:0], collective "
                "MultiWorkerMirroredStrategy's collective all-reduce across the workers, "
                "implementation ring") in result.stdout
        assert f"{worker}: security: TensorFlow's gRPC server listens on port" in result.stdout
    # Only the chief wrote to model_dir; the other worker's saves are gone.
    assert tf.train.latest_checkpoint(str(cluster_dir)).endswith(f"ckpt-{TRAIN_STEPS}")
    assert json.loads((cluster_dir / "metrics.json").read_text())["num_replicas"] == 2
    assert os.listdir(worker_tmp) == []
    _assert_same_weights(cluster_dir, mirrored_weights)


class _Output:
    """Collects a process's stdout and stderr lines in threads, so waits stay bounded."""

    def __init__(self, process: subprocess.Popen):
        self.lines: list[str] = []
        self._threads = [threading.Thread(target=self._pump, args=(stream,), daemon=True)
                         for stream in (process.stdout, process.stderr)]
        for thread in self._threads:
            thread.start()

    def _pump(self, stream):
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        for thread in self._threads:
            thread.join(timeout=10)
        return "".join(self.lines)


def _start(*args: str, env: dict | None = None) -> tuple[subprocess.Popen, _Output]:
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", **(env or {}))
    process = start_python(list(args), env=full_env)
    return process, _Output(process)


def _wait_until(condition, what: str, process: subprocess.Popen, output: _Output, timeout=180):
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"gave up waiting for {what}:\n{output.text()[-3000:]}")
        time.sleep(0.05)


def _first_checkpoint_written(model_dir):
    return lambda: tf.train.latest_checkpoint(str(model_dir)) is not None


@MIRRORED
def test_kill_9_of_one_process_resumes_to_the_uninterrupted_weights(tmp_path, mirrored_weights):
    model_dir = tmp_path / "run"
    command = ["bin/train", "--strategy=mirrored", "--devices=cpu:0,cpu:1",
               f"--model_dir={model_dir}", *FLAGS]
    process, output = _start(*command)
    _wait_until(_first_checkpoint_written(model_dir), "a checkpoint", process, output)
    process.kill()  # SIGKILL: no handler runs, nothing is saved on the way out
    process.wait(timeout=30)
    killed_at = tf.train.latest_checkpoint(str(model_dir))

    result = run_bin("train", *command[1:])
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {killed_at}" in result.stdout
    # Same weights, restored data position included; determinism makes it exact.
    _assert_same_weights(model_dir, mirrored_weights, rtol=0, atol=0)


@MIRRORED
def test_a_killed_worker_leaves_the_survivor_retryable_and_the_cluster_resumes_exactly(
        tmp_path, mirrored_weights):
    """A worker killed mid-run: the SURVIVOR ends with one line naming the
    class and status 138 (retryable: TFJob's ExitCode policy and a JobSet
    recreate only the failed pod, so the survivor's status decides; before,
    it was 1, permanent). The workers are started as a platform starts them,
    each with its TF_CONFIG, so that the survivor's own status is seen (under
    bin/launch the launcher stops it first, whichever it saw). Then
    `bin/launch` starts the cluster again and it resumes to the uninterrupted
    weights. (bin/launch restarting on exactly the retryable set:
    tests/launch/test_launcher.py, with stand-in tasks.)"""
    from tfloop.launch import exit_codes, launcher

    model_dir, worker_tmp = tmp_path / "cluster", tmp_path / "worker_tmp"
    worker_tmp.mkdir()
    cluster = {"worker": [f"localhost:{port}" for port in launcher.pick_free_ports(2)]}
    workers = [_start("bin/train", f"--model_dir={model_dir}", *CLUSTER,
                      env={"TMPDIR": str(worker_tmp), "TF_CONFIG": json.dumps(
                          {"cluster": cluster, "task": {"type": "worker", "index": index}})})
               for index in range(2)]
    (survivor, output), (victim, _) = workers
    try:
        # The kill comes from a process of its own: this one may sit seconds in
        # a thread switch, and the cluster finishes soon after its first checkpoint.
        killer = subprocess.Popen([sys.executable, "-c", KILL_AFTER_FIRST_CHECKPOINT,
                                   str(model_dir), str(victim.pid)])
        assert killer.wait(timeout=200) == 0
        survivor.wait(timeout=120)
    finally:
        for process, _ in workers:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    text = output.text()
    assert survivor.returncode == exit_codes.RESTART, text[-3000:]
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if "error:" in line]
    assert len(errors) == 1 and "worker:0 lost the cluster after step" in errors[0], text
    assert errors[0] == text.rstrip().splitlines()[-1]  # the last line names the class
    assert errors[0].endswith("(exit 138: restart every task from the last checkpoint)")
    killed_at = tf.train.latest_checkpoint(str(model_dir))
    assert killed_at is not None

    result = _launch("--num_workers=2", "--grace_period=3", "--", "bin/train",
                     f"--model_dir={model_dir}", *CLUSTER, env={"TMPDIR": str(worker_tmp)},
                     timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(rf"\[worker:0\] .*resuming from {re.escape(killed_at)} at step",
                     result.stdout), result.stdout[-3000:]
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"ckpt-{TRAIN_STEPS}")
    # The killed worker's save directory was removed when it started again.
    # (TensorFlow's own autograph files of the killed process stay behind.)
    assert [name for name in os.listdir(worker_tmp) if name.startswith("tfloop-")] == []
    _assert_same_weights(model_dir, mirrored_weights)


@pytest.mark.parametrize("flags, says", [
    (dict(), "MultiWorkerMirroredStrategy's collective all-reduce across the workers, "
             "implementation auto (TF's choice: ring on CPUs)"),
    (dict(collective="ring", pack_bytes=4096, gradient_dtype="bfloat16", collective_timeout=30),
     "MultiWorkerMirroredStrategy's collective all-reduce across the workers, implementation "
     "ring, bytes_per_pack=4096, gradients in bfloat16, timeout 30 s"),
])
def test_the_start_up_line_names_the_reduction_that_really_runs(flags, says):
    """Not `collective strategy`: which of TF's implementations, and its options."""
    from tfloop.engine import strategies
    from tfloop.engine.config import RunConfig

    spec = strategies.get("multi_worker")
    config = RunConfig(strategy="multi_worker", **flags)
    collective = spec.create_collective(config.distribution, ["/cpu:0"])
    assert spec.describe_collective(collective, config.distribution, ["/cpu:0"]) == says
    # The evaluator task trains nothing: a --collective it was given is said to be unused.
    assert spec.describe_collective(None, config.distribution, ["/cpu:0"]) == (
        "none (--collective=ring unused: this task does not train)"
        if flags.get("collective") else "none")


def test_the_security_line_names_the_open_port(caplog):
    import logging

    from tfloop.engine.strategies import spec
    from tfloop.launch import tf_config

    role = tf_config.parse(json.dumps({"cluster": {"worker": ["10.0.0.7:2222", "h:1"]},
                                       "task": {"type": "worker", "index": 0}}))
    with caplog.at_level(logging.INFO, logger="tfloop"):
        spec.announce_open_server(role)
    assert caplog.messages == [
        "worker:0: security: TensorFlow's gRPC server listens on port 2222 of every network "
        "interface (not only 10.0.0.7) and has no authentication; run the cluster on a trusted "
        "network or behind a firewall"]


def test_tf_config_mistakes_are_one_line(tmp_path):
    from helpers import assert_one_line_error

    bad = json.dumps({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 3}})
    result = run_bin("train", "--strategy=multi_worker", f"--model_dir={tmp_path / 'run'}",
                     env={"TF_CONFIG": bad})
    assert_one_line_error(result, contains="task index 3 is out of range")
    assert not (tmp_path / "run").exists()
    # The other mistakes: tests/launch/test_tf_config.py, test_run_refusals.py.


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
    from tfloop.launch import exit_codes, launcher

    # worker:1 is never started: worker:0 would wait in TensorFlow forever.
    cluster = {"worker": [f"localhost:{_free_port()}", f"localhost:{_free_port()}"]}
    config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    start = time.monotonic()
    result = run_bin("train", "--strategy=multi_worker", "--startup_timeout=3",
                     f"--model_dir={tmp_path / 'run'}", env={"TF_CONFIG": config}, timeout=120)
    assert time.monotonic() - start < 100  # bounded: the subprocess timeout is the hard stop
    # Ended by the watchdog's SIGUSR1 (see engine/runtime/watchdog.py for why a
    # signal): status 138 to a shell and to Kubernetes, the retryable class (it was 137,
    # which platforms read as an out-of-memory kill).
    assert result.returncode == -signal.SIGUSR1
    assert launcher.exit_status(result.returncode) == exit_codes.RESTART
    line = assert_one_line_error(result, contains="worker:0 waited 3 s for the cluster")
    assert cluster["worker"][1] in line and "--startup_timeout" in line
    assert line.endswith("(exit 138: restart every task from the last checkpoint)")
    assert not (tmp_path / "run").exists()


def test_the_evaluator_evaluates_checkpoints_and_stops_after_the_last(tmp_path):
    """Also: TFRecord shards dealt out to the workers by file (--auto_shard_policy=file),
    and, with no thread count of the user's, each task's share of the cores:
    each worker's start-up line says it computes with cores // 3 threads (the
    two workers and the evaluator; 1 on a 2-core host), instead of a pool of
    every core each. (This run compares no weights, so it may leave the
    threads to bin/launch.)"""
    from helpers import write_tfrecord_dir

    records = write_tfrecord_dir(str(tmp_path / "records"), num_shards=4)
    model_dir = tmp_path / "run"
    result = _launch(
        "--num_workers=2", "--evaluator", "--grace_period=5", "--evaluator_timeout=120",
        "--", "bin/train", "--strategy=multi_worker", f"--model_dir={model_dir}",
        "--dataset=tfrecord", f"--data_dir={records}", "--auto_shard_policy=file",
        "--eval_timeout=60", *FLAGS, env={"TF_NUM_INTRAOP_THREADS": None}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    share = max(1, threads.usable_cores() // 3)
    assert f"launch: threads: TF_NUM_INTRAOP_THREADS={share} for each task" in result.stderr
    for worker in ("worker:0", "worker:1"):
        assert re.search(rf"^\[{worker}\] .*{worker}: multi_worker over 2 replica.*, {share} "
                         r"intra-op thread\(s\) per op$", result.stdout, re.MULTILINE), \
            result.stdout
    for worker in ("worker:0", "worker:1"):
        assert f"{worker}: input sharded by file over 2 workers" in result.stdout
    # It may skip checkpoints written while it was busy, never the final one.
    assert "[evaluator]" in result.stdout and f"eval  step {TRAIN_STEPS}" in result.stdout
    steps = set()
    for path in (model_dir / "summaries" / "eval").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            if any(value.tag == "accuracy" for value in event.summary.value):
                steps.add(event.step)
    assert TRAIN_STEPS in steps
    assert steps <= set(range(CHECKPOINT_INTERVAL, TRAIN_STEPS + 1, CHECKPOINT_INTERVAL))
