"""`bin/launch --min_workers`: a worker that cannot come back is left out, and
the run goes on on fewer workers with the same global batch, exactly."""

import json
import os
import re
import sys

import pytest

from helpers import REPO, run_bin
from tfloop.launch import LaunchConfig, LaunchError

ENGINE_TESTS = os.path.join(REPO, "tests", "engine")
sys.path.insert(0, ENGINE_TESTS)
import counting_task  # noqa: E402

# 12 examples a step: 4 per worker on 3 workers; 3 per worker in 2 micro-batches on 2.
BATCH, STEPS = 12, 10
FLAGS = [*counting_task.flags(steps=STEPS), "--steps_per_loop=2", "--checkpoint_interval=2",
         f"--global_batch_size={BATCH}", "--max_per_replica_batch_size=4"]


def test_a_lost_worker_is_left_out_and_the_run_finishes_on_two_exactly(tmp_path):
    model_dir, marker = tmp_path / "cluster", tmp_path / "worker-2-lost"
    env = {"COUNTING_BATCH": str(BATCH),
           "PYTHONPATH": os.pathsep.join([ENGINE_TESTS, os.environ.get("PYTHONPATH", "")])}
    result = run_bin(
        "launch", "--num_workers=3", "--min_workers=2", "--max_restarts=3", "--grace_period=3",
        "--timeout=400", "--", sys.executable, os.path.join(REPO, "tests", "bin", "lost_worker.py"),
        str(marker), "2", str(model_dir), "--", os.path.join(REPO, "bin", "train"),
        f"--model_dir={model_dir}", "--strategy=multi_worker", "--collective=ring",
        "--devices=cpu:0", *FLAGS, env=env, timeout=450)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [line for line in result.stderr.splitlines() if "cannot come back" in line]
    assert lines == ["launch: worker:2 exited with status 1 (exit 1: failed: a restart cannot "
                     "fix it): worker:2 cannot come back; restarting the cluster with 2 workers "
                     "instead of 3 (--min_workers=2; 2/3): training resumes from the last "
                     "checkpoint on fewer replicas"], result.stderr[-4000:]
    assert re.search(r"\[worker:0\] .*resuming on 2 replica\(s\) after 3: global batch 12, 6 "
                     r"per replica in 2 micro-batch\(es\) of 3", result.stdout), result.stdout[-3000:]
    record = json.loads((model_dir / "run.json").read_text())
    (change,) = record["replica_changes"]
    assert (change["from"], change["to"], change["accumulation_steps"]) == (3, 2, [1, 2])
    counting_task.assert_exact_against_uninterrupted(
        counting_task.model_weights(model_dir), tmp_path / "uninterrupted", batch=BATCH,
        steps=STEPS, steps_per_loop=2)


@pytest.mark.parametrize("flags, message", [
    (dict(num_workers=2, min_workers=3, max_restarts=1),
     "--min_workers=3 is more than --num_workers=2; give at most 2"),
    (dict(num_workers=3, min_workers=2),
     "--min_workers=2 restarts the cluster without a lost worker, and --max_restarts is 0"),
    (dict(num_workers=3, min_workers=2, max_restarts=1, num_ps=1, chief=True),
     "with ps tasks the chief's coordinator already goes on without a lost worker"),
])
def test_min_workers_that_cannot_work_are_refused_in_one_line(flags, message):
    with pytest.raises(LaunchError) as error:
        LaunchConfig(command=(sys.executable, "-c", "pass"), **flags)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_killed_worker_resumes_the_cluster_from_a_local_checkpoint_every_worker_holds(
        tmp_path):
    """Local checkpoints every 2 steps, no durable one before the end: worker 1
    killed once after its local ckpt-6; the restarted cluster agrees on the
    newest step both workers hold and resumes from it, to the uninterrupted
    examples and weights."""
    from tfloop.engine.run_dir import local_checkpoints

    model_dir, local = tmp_path / "cluster", tmp_path / "shm"
    steps, batch = 12, 8
    victim = local_checkpoints.folder(str(local), str(model_dir), "worker:1")
    env = {"COUNTING_BATCH": str(batch),
           "PYTHONPATH": os.pathsep.join([ENGINE_TESTS, os.environ.get("PYTHONPATH", "")])}
    result = run_bin(
        "launch", "--num_workers=2", "--max_restarts=1", "--grace_period=3", "--timeout=400",
        "--", sys.executable, os.path.join(REPO, "tests", "bin", "kill_once.py"),
        str(tmp_path / "killed"), "1", os.path.join(victim, "ckpt-6.index"), "--",
        os.path.join(REPO, "bin", "train"), f"--model_dir={model_dir}",
        "--strategy=multi_worker", "--collective=ring", "--devices=cpu:0",
        *counting_task.flags(steps=steps), "--steps_per_loop=1", "--checkpoint_interval=100",
        f"--global_batch_size={batch}", f"--local_checkpoint_dir={local}",
        "--local_checkpoint_interval=2", env=env, timeout=450)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "worker:1 exited with status 137" in result.stderr, result.stderr[-3000:]
    agreed = re.findall(r"\[(worker:\d)\] .*resuming from the local checkpoint \S+/ckpt-(\d+), "
                        r"which every worker holds", result.stdout)
    assert sorted(agreed) == [("worker:0", agreed[0][1]), ("worker:1", agreed[0][1])], \
        result.stdout[-4000:]
    assert int(agreed[0][1]) >= 4
    counting_task.assert_exact_against_uninterrupted(
        counting_task.model_weights(model_dir), tmp_path / "uninterrupted", batch=batch,
        steps=steps, steps_per_loop=4)
