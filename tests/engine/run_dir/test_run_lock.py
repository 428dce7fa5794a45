"""One writer per `--model_dir`: `engine.run_dir.run_lock`, and two real processes on one directory."""

import json
import os
import signal
import socket

import pytest
import tensorflow as tf

from helpers import (REPO, assert_one_line_error, bin_env, run_bin, start_bin, start_python,
                     wait_for_output)
from tfloop.engine.run_dir import plan_reading, run_lock
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.run import run
from tfloop.launch import tf_config

_HOLD = """
import sys, time
from tfloop.engine.run_dir import run_lock
lock = run_lock.acquire(sys.argv[1], sys.argv[2])
print("held", flush=True)
while True:
    time.sleep(3600)
"""


def _holder(model_dir, name=run_lock.TRAIN):
    """A process of its own holding `name` on `model_dir` until it is killed:
    a fork of the binary server (`helpers.start_python`), which has imported
    the engine already, so the holder costs no TensorFlow import of its own
    (importing `run_lock` imports TensorFlow: 5 s of CPU in a fresh interpreter)."""
    process = start_python(["-c", _HOLD, str(model_dir), name], env=bin_env(), cwd=REPO)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_held_lock_refuses_a_second_taker_naming_the_holder_and_dies_with_it(tmp_path):
    model_dir = tmp_path / "run"
    holder = _holder(model_dir)
    expected = (f"--model_dir={model_dir} is in use by process {holder.pid} on host "
                f"{socket.gethostname()}; wait for it to end or use another --model_dir")
    try:
        with pytest.raises(ConfigError) as probe:
            run_lock.check_free(str(model_dir))
        assert str(probe.value) == expected
        with pytest.raises(ConfigError) as taken:
            run_lock.acquire(str(model_dir))
        assert str(taken.value) == expected
        run_lock.acquire(str(model_dir), run_lock.EVALUATE).release()  # another lock name
    finally:
        holder.kill()  # SIGKILL: no chance to release
        holder.wait(timeout=30)
    lock = run_lock.acquire(str(model_dir))
    assert (model_dir / "train.lock").read_text() == f"{os.getpid()} {socket.gethostname()}\n"
    lock.release()
    run_lock.check_free(str(model_dir))


def test_a_lock_removes_the_directory_it_created_unless_kept(tmp_path):
    lock = run_lock.acquire(str(tmp_path / "new" / "run"))
    assert lock.created == str(tmp_path / "new")
    lock.discard()
    assert os.listdir(tmp_path) == []
    lock = run_lock.acquire(str(tmp_path / "run"))
    lock.keep()
    lock.discard()
    assert os.listdir(tmp_path / "run") == ["train.lock"]
    (tmp_path / "existing").mkdir()
    run_lock.acquire(str(tmp_path / "existing")).discard()
    assert (tmp_path / "existing").is_dir()


def test_a_url_model_dir_is_not_locked():
    assert run_lock.acquire("ram://tfloop-lock-test/run") is None
    run_lock.check_free("ram://tfloop-lock-test/run")


@pytest.mark.parametrize("task,mode,lock", [
    (None, "train", "train"), (None, "evaluate", "evaluate"),
    (("chief", 0), "train", "train"), (("worker", 0), "train", None),
    (("evaluator", 0), "continuous_evaluate", "evaluate"),
])
def test_only_the_processes_that_write_model_dir_take_a_lock(monkeypatch, task, mode, lock):
    if task:
        monkeypatch.setenv("TF_CONFIG", json.dumps({
            "cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]},
            "task": {"type": task[0], "index": task[1]}}))
    else:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    assert plan_reading.lock_name(tf_config.current_role(), mode) == lock


def test_a_second_evaluator_task_on_one_model_dir_is_refused(tmp_path, monkeypatch):
    model_dir = tmp_path / "run"
    holder = _holder(model_dir, run_lock.EVALUATE)
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["localhost:1"]}, "task": {"type": "evaluator", "index": 0}}))
    try:
        with pytest.raises(ConfigError, match=rf"is in use by process {holder.pid} on host "):
            run(RunConfig(strategy="one_device", devices="cpu:0", model_dir=str(model_dir),
                          eval_timeout=1))
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_second_bin_train_on_the_same_model_dir_is_one_line_and_the_first_goes_on(tmp_path):
    model_dir = tmp_path / "run"
    flags = [f"--model_dir={model_dir}", "--strategy=one_device", "--devices=cpu:0",
             "--global_batch_size=32", "--steps_per_loop=20", "--checkpoint_interval=20",
             "--summary_interval=0", "--mode=train", "--noexport"]
    first = start_bin("train", *flags, "--train_steps=100000000")
    try:
        wait_for_output(first, "saved checkpoint")
        # Paused while the second starts: a run training flat out (a checkpoint
        # every 20 steps) took the cores the second's TensorFlow start-up needs
        # (23 s for this test on a quiet machine, 114 s loaded). A stopped
        # process keeps its flock, so the refusal is the same.
        first.send_signal(signal.SIGSTOP)
        try:
            paused_at = int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])
            second = run_bin("train", *flags, "--train_steps=40")
        finally:
            first.send_signal(signal.SIGCONT)
        assert second.returncode == 2
        assert assert_one_line_error(second) == (
            f"train: error: --model_dir={model_dir} is in use by process {first.pid} on host "
            f"{socket.gethostname()}; wait for it to end or use another --model_dir")
        # Undisturbed: it goes on training and saving after the refusal.
        wait_for_output(first, f"saved checkpoint {model_dir}/ckpt-{paused_at + 20}\n")
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    record = json.loads((model_dir / "metrics.json").read_text())
    assert record["status"] == "interrupted" and record["step"] > paused_at
