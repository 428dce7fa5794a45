"""`bin/launch --spec=deploy/tfjob.yaml`: the TFJob rehearsed on loopback loses a
worker to SIGKILL mid-run, and the survivor's own exit status is in the
retryable class: on the platform, that status is what makes the job live
(TFJob recreates only the failed pod; `restartPolicy: ExitCode` retries 128
and above). One cluster start: a chief and one worker, tiny steps, no restart
(`--max_restarts=0`: the launcher's restart and exact resume are
tests/bin/test_multi_worker.py's; the spec's restart count reaching the
launcher is `test_the_rehearsal_gives_each_task_its_pods_variables_on_loopback`).
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import tensorflow as tf

from helpers import KILL_AFTER_FIRST_CHECKPOINT, bin_env, launcher_endings
from tfloop.launch import exit_codes

REPO = Path(__file__).resolve().parents[2]
TRAIN_STEPS = 200
FLAGS = [f"--train_steps={TRAIN_STEPS}", "--steps_per_loop=10", "--checkpoint_interval=20",
         "--global_batch_size=32", "--noexport", "--startup_timeout=120"]

def test_a_worker_killed_in_a_tfjob_rehearsal_leaves_survivors_a_platform_retries(tmp_path):
    model_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "bin/launch", "--spec=deploy/tfjob.yaml",
         "--replicas=worker:1,evaluator:0", f"--local_model_dir={model_dir}",
         "--max_restarts=0", "--grace_period=5", "--peer_exit_wait=60", "--", *FLAGS],
        cwd=REPO, env=bin_env(PYTHONUNBUFFERED="1"), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 180
    while not re.search(r"pids: .*worker:0=(\d+)", "".join(lines)):
        assert process.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
        time.sleep(0.05)
    pid = re.search(r"pids: .*worker:0=(\d+)", "".join(lines)).group(1)
    # The kill comes from a process of its own, the moment the first checkpoint is there.
    killer = subprocess.Popen([sys.executable, "-c", KILL_AFTER_FIRST_CHECKPOINT,
                               str(model_dir), pid])
    try:
        assert killer.wait(timeout=200) == 0
        process.wait(timeout=300)
    finally:
        for child in (killer, process):
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=30)
    reader.join(timeout=10)
    text = "".join(lines)

    # Each pod got the operator's TF_CONFIG, on loopback.
    assert "rehearsing deploy/tfjob.yaml (tfjob 'tfloop-mnist') on loopback: chief:1, worker:1" \
        in text, text[-3000:]
    assert re.search(r"\[chief:0\] .*cluster from TF_CONFIG: this task is chief:0 at "
                     r"127\.0\.0\.1:\d+", text), text[-3000:]
    # Killed mid-run, after the first checkpoint, which stays.
    assert not tf.train.latest_checkpoint(str(model_dir)).endswith(f"ckpt-{TRAIN_STEPS}")
    assert "Traceback" not in text, text

    # What the platform sees, in whichever order the tasks ended: the killed
    # worker died of the SIGKILL; the survivor exited on its own (a status,
    # not a signal) with a status the platform retries; bin/launch stopped
    # without restarting, with the retryable status of the task it saw first
    # (the chief may notice the lost worker, 138, before the launcher's poll
    # sees the kill).
    endings = launcher_endings(text)
    assert endings.get("worker:0") == -signal.SIGKILL, (endings, text[-3000:])
    survivor = endings.get("chief:0")
    assert survivor is not None and survivor > 0, (
        f"the survivor did not exit on its own: {endings}\n" + text[-3000:])
    assert exit_codes.retryable(survivor), (
        f"the survivor exited {survivor}: a permanent failure to the platform\n" + text[-3000:])
    assert process.returncode in {exit_codes.shell_status(code) for code in endings.values()}
    assert exit_codes.retryable(process.returncode), process.returncode
    assert (f"retryable, but stopping the cluster (no restarts allowed); exit status "
            f"{process.returncode}") in text, text[-3000:]
    assert not os.path.exists(REPO / "runs" / "rehearsal" / "tfloop-mnist")
