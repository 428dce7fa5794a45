"""The tf.data service on loopback: bin/data_service and bin/train --data_service.

A run whose train pipeline the service's two data workers prepare trains to
its end and writes its checkpoints (and the same command resumes it, on a
new pass of the data), and both workers did work: the pipeline
(tests/bin/served_task.py) leaves a file named after the pid of the process
that ran it, so the test reads who worked, never how fast. A data worker
SIGKILLed mid-run stops nothing: the run finishes (exit 0) on the other.
The supervisor prints the address once every server is up, stops them all
on SIGTERM (exit 0, no process left) and refuses a port in use in one line.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time

import pytest

from helpers import REPO, assert_one_line_error, bin_env, process_alive, run_bin, start_python

HERE = os.path.dirname(os.path.abspath(__file__))
_WORKER = re.compile(r"data worker (\d+) \(pid (\d+)\)")


class LocalService:
    """`bin/data_service --workers=N --port=0`, its address and its pids."""

    def __init__(self, workers: int, folder: str):
        self.log = os.path.join(folder, "service.log")
        with open(self.log, "w") as log:
            self.popen = start_python(
                [os.path.join(REPO, "bin", "data_service"),
                 f"--workers={workers}", "--port=0", "--worker_timeout=2"],
                stderr=log, env=bin_env(PYTHONUNBUFFERED="1"),
                fresh=True)  # as run_bin starts it (helpers.WITHOUT_TENSORFLOW)
        self.address = self._first_line(timeout=180)
        self.dispatcher_pid = int(re.search(r"dispatcher \(pid (\d+)\) and", self.stderr()).group(1))
        self.worker_pids = {int(i): int(pid) for i, pid in _WORKER.findall(self.stderr())}
        assert len(self.worker_pids) == workers, self.stderr()

    def _first_line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        line = ""
        while not line and time.monotonic() < deadline and self.popen.poll() is None:
            os.set_blocking(self.popen.stdout.fileno(), False)
            line = (self.popen.stdout.readline() or "").strip()
            if not line:
                time.sleep(0.2)
        assert line.startswith("grpc://localhost:"), self.stderr()
        return line

    def stderr(self) -> str:
        with open(self.log) as f:
            return f.read()

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(60)
        finally:
            if self.popen.poll() is None:
                self.popen.kill()

    def pids(self) -> list[int]:
        return [self.dispatcher_pid, *self.worker_pids.values()]


@pytest.fixture
def service(tmp_path):
    started = LocalService(2, str(tmp_path))
    yield started
    started.stop()
    for pid in started.pids():
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)


def _train(service: LocalService, folder, *, steps: int, marks: str) -> subprocess.Popen:
    env = bin_env({"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])},
                  SERVED_TASK_MARKS=marks, SERVED_TASK_SLEEP_MS="5")
    return start_python(
        [os.path.join(REPO, "bin", "train"), "--task=served_task:Served",
         "--strategy=one_device", "--devices=cpu:0", "--global_batch_size=8",
         f"--train_steps={steps}", "--steps_per_loop=8", f"--checkpoint_interval={steps // 2}",
         f"--model_dir={folder}", f"--data_service={service.address}", "--startup_timeout=60"],
        stderr=subprocess.STDOUT, env=env)


def _workers_marked(marks: str) -> dict[int, int]:
    """pid -> examples that process prepared (its `<pid>-<example>` files)."""
    counts: dict[int, int] = {}
    for name in os.listdir(marks):
        pid = int(name.split("-")[0])
        counts[pid] = counts.get(pid, 0) + 1
    return counts


def test_a_run_trains_on_two_data_workers_resumes_and_a_killed_worker_stops_nothing(
        service, tmp_path):
    """One service (its three processes are the costly part) serves three runs:
    a run on both data workers, the same command resumed, then a run during
    which data worker 1 is SIGKILLed; then SIGTERM stops what is left."""
    marks = tmp_path / "marks"
    marks.mkdir()
    run = _train(service, tmp_path / "run", steps=24, marks=str(marks))
    output, _ = run.communicate(timeout=240)
    assert run.returncode == 0, output
    assert "runs on its data workers" in output and "exact resume" in output, output
    assert {"ckpt-12.index", "ckpt-24.index"} <= set(os.listdir(tmp_path / "run")), output
    worked = _workers_marked(str(marks))
    assert set(worked) == set(service.worker_pids.values()), (worked, service.worker_pids)
    # The same command resumes, on a new pass (a served pipeline cannot skip exactly).
    resumed = _train(service, tmp_path / "run", steps=32, marks=str(marks))
    output, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, output
    assert "resumes at step 24 on a new pass" in output and "-step24-batch8" in output, output
    assert "ckpt-32.index" in os.listdir(tmp_path / "run"), output

    # A data worker killed mid-run stops nothing: the run finishes on the other.
    marks = tmp_path / "marks_killed"
    marks.mkdir()
    run = _train(service, tmp_path / "killed", steps=400, marks=str(marks))
    victim = service.worker_pids[1]
    deadline = time.monotonic() + 180
    while victim not in _workers_marked(str(marks)) and time.monotonic() < deadline:
        assert run.poll() is None, run.stdout.read()
        time.sleep(0.2)
    assert victim in _workers_marked(str(marks)), service.stderr()
    survivor_before = _workers_marked(str(marks)).get(service.worker_pids[0], 0)
    os.kill(victim, signal.SIGKILL)
    assert run.poll() is None  # killed mid-run
    output, _ = run.communicate(timeout=240)
    assert run.returncode == 0, output
    assert "ckpt-400.index" in os.listdir(tmp_path / "killed"), output
    # The survivor went on preparing examples after its peer died.
    assert _workers_marked(str(marks))[service.worker_pids[0]] > survivor_before
    assert f"worker:1 (pid {victim}) exited with status -9; 1 data worker(s) serve on" in \
        service.stderr()

    assert service.stop() == 0, service.stderr()
    assert not any(process_alive(pid) for pid in service.pids()), service.stderr()
    assert "stopping the data workers" in service.stderr()


def test_a_port_in_use_is_one_line():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        result = run_bin("data_service", f"--port={taken.getsockname()[1]}", timeout=60)
    assert result.returncode == 2
    assert_one_line_error(result, contains="the port is in use")
    assert result.stdout == ""


@pytest.mark.parametrize("args, says", [
    (["--role=worker"], "needs --dispatcher"),
    (["--role=worker", "--dispatcher=http://x:1"], "--dispatcher='http://x:1' has http://"),
    (["--role=dispatcher", "--workers=3"], "--workers applies to --role=all"),
    (["--workers=0"], "--workers=0 must be 1 to"),
])
def test_mistakes_are_one_line(args, says):
    result = run_bin("data_service", *args, timeout=60)
    assert result.returncode == 2
    assert_one_line_error(result, contains=says)


def test_train_refuses_an_address_where_nothing_answers(tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = run_bin("train", "--strategy=one_device", "--devices=cpu:0", "--train_steps=4",
                     f"--model_dir={tmp_path / 'run'}", f"--data_service=grpc://127.0.0.1:{port}",
                     "--startup_timeout=1", timeout=120)
    assert result.returncode == 2
    assert_one_line_error(result, contains="no dispatcher answers there")
    assert not (tmp_path / "run").exists()
