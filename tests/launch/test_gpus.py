"""Per-task GPUs: `bin/launch --gpus_per_task` gives each computing task its own
`CUDA_VISIBLE_DEVICES`, ps tasks and the evaluator none unless asked, and
refuses more GPUs than the machine has in one line. No GPU is needed: the
machine's count comes from a stand-in `nvidia-smi` on PATH or `--num_gpus`."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tfloop.launch import gpus, launcher
from tfloop.launch.launcher import LaunchConfig, LaunchError
from helpers import assert_one_line_error, run_bin

_REPORT = ("import json, os; print(json.dumps({'visible': os.environ.get('CUDA_VISIBLE_DEVICES'),"
           " 'task': json.loads(os.environ['TF_CONFIG'])['task']}))")


def _fake_nvidia_smi(tmp_path, count: int) -> dict:
    """An environment whose PATH finds an `nvidia-smi` that lists `count` GPUs."""
    folder = tmp_path / "fakebin"
    folder.mkdir()
    script = folder / "nvidia-smi"
    lines = "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})'\n"
                    for i in range(count))
    script.write_text("#!/bin/sh\n" + lines)
    script.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def _without_cuda_visible_devices(env: dict) -> dict:
    """The launcher's environment as on a GPU host where nothing restricts the GPUs."""
    return {**env, "CUDA_VISIBLE_DEVICES": None}


def _tasks(stdout: str) -> dict[str, str]:
    seen = {}
    for line in stdout.splitlines():
        label, _, text = line.partition("] ")
        report = json.loads(text)
        seen[label.lstrip("[")] = report["visible"]
    return seen


def test_assign_deals_blocks_to_chief_and_workers_only():
    tasks = launcher.plan_cluster(num_workers=2, chief=True, num_ps=1, evaluator=True)
    assert gpus.assign(tasks, gpus_per_task=2, gpus=[str(i) for i in range(8)]) == {
        "chief:0": "0,1", "worker:0": "2,3", "worker:1": "4,5", "ps:0": "", "evaluator": ""}
    # The evaluator asked for: it gets its own block after the workers'.
    assert gpus.assign(tasks, gpus_per_task=1, gpus=["3", "5", "6", "7"],
                       gpu_jobs=("chief", "worker", "evaluator")) == {
        "chief:0": "3", "worker:0": "5", "worker:1": "6", "ps:0": "", "evaluator": "7"}


def test_assign_refuses_more_gpus_than_exist():
    tasks = launcher.plan_cluster(num_workers=3)
    with pytest.raises(gpus.GPUAssignmentError) as error:
        gpus.assign(tasks, gpus_per_task=2, gpus=["0", "1", "2", "3"])
    message = str(error.value)
    assert "\n" not in message
    assert ("--gpus_per_task=2 for 3 task(s) (worker:0, worker:1, worker:2) needs 6 GPU(s)"
            in message)
    assert "4 are available" in message


@pytest.mark.process  # launch.gpus runs nvidia-smi
def test_visible_gpu_ids_follow_the_launchers_own_restriction(tmp_path, monkeypatch):
    assert gpus.visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "2, 5"}) == ["2", "5"]
    assert gpus.visible_gpu_ids({}, num_gpus=3) == ["0", "1", "2"]
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, 4)["PATH"])
    assert gpus.visible_gpu_ids({}) == ["0", "1", "2", "3"]
    assert len(gpus.nvidia_smi_gpus()) == 4


def test_no_nvidia_smi_and_no_count_is_one_line(monkeypatch):
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    assert gpus.nvidia_smi_gpus() is None
    with pytest.raises(gpus.GPUAssignmentError, match="give it with --num_gpus=N"):
        gpus.visible_gpu_ids({})


def test_launch_config_checks_gpu_options():
    with pytest.raises(LaunchError, match=r"--gpus_per_task \(-1\) must be an integer from 0 to 256"):
        LaunchConfig(command=(sys.executable,), gpus_per_task=-1)
    with pytest.raises(LaunchError, match="--gpu_jobs names 'evaluater'"):
        LaunchConfig(command=(sys.executable,), gpu_jobs=("worker", "evaluater"))


# The launcher stops the ps task once the workers are done, so the workers
# wait (bounded) for the ps task's report before they end: else a ps task
# slower to start than the workers to finish is stopped before it prints.
_REPORT_AFTER_PS = _REPORT + """
import pathlib, time
marker = pathlib.Path(MARKER)
if json.loads(os.environ['TF_CONFIG'])['task']['type'] == 'ps':
    marker.touch()
deadline = time.monotonic() + 30
while not marker.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def test_every_task_gets_its_own_gpus(tmp_path):
    env = _fake_nvidia_smi(tmp_path, 4)
    script = _REPORT_AFTER_PS.replace("MARKER", repr(str(tmp_path / "ps_reported")))
    result = run_bin("launch", "--num_workers=2", "--num_ps=1", "--evaluator",
                     "--gpus_per_task=2", "--", sys.executable, "-c", script,
                     timeout=60, env=_without_cuda_visible_devices(env))
    assert result.returncode == 0, result.stderr
    assert _tasks(result.stdout) == {"worker:0": "0,1", "worker:1": "2,3", "ps:0": "",
                                     "evaluator": ""}
    assert ("launch: GPUs: worker:0=GPU 0,1, worker:1=GPU 2,3, ps:0=no GPU, evaluator=no GPU"
            in result.stderr)


def test_without_gpus_per_task_tasks_inherit_the_launchers_view(tmp_path):
    result = run_bin("launch", "--num_workers=2", "--", sys.executable, "-c", _REPORT,
                     timeout=60, env={"CUDA_VISIBLE_DEVICES": "1,2"})
    assert result.returncode == 0, result.stderr
    assert _tasks(result.stdout) == {"worker:0": "1,2", "worker:1": "1,2"}


def test_more_gpus_than_the_machine_has_is_one_line_and_exit_2(tmp_path):
    env = _fake_nvidia_smi(tmp_path, 2)
    result = run_bin("launch", "--num_workers=2", "--chief", "--gpus_per_task=1", "--",
                     sys.executable, "-c", "pass", timeout=30,
                     env=_without_cuda_visible_devices(env))
    assert result.returncode == 2
    assert result.stderr.startswith("launch: error:"), result.stderr
    assert_one_line_error(result, contains="needs 3 GPU(s), and 2 are available (0, 1)")
    assert result.stdout == ""  # nothing started
