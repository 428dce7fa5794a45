"""Nothing outlives bin/launch: kill -9 of the launcher of a real two-worker
training run takes both workers with it (launch.guardian)."""

import os
import re
import signal
import subprocess
import sys
import time

from helpers import REPO, process_alive


def test_kill_9_of_the_launcher_stops_every_training_worker(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    launcher = subprocess.Popen(
        [sys.executable, f"{REPO}/bin/launch", "--num_workers=2", "--",
         sys.executable, f"{REPO}/bin/train", "--strategy=multi_worker", "--devices=cpu:0",
         "--train_steps=1000000", "--steps_per_loop=20", "--global_batch_size=32",
         "--mode=train", f"--model_dir={tmp_path / 'run'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        pids = None
        for line in launcher.stderr:  # "launch: pids: worker:0=123, worker:1=456"
            found = re.search(r"pids: (.*)", line)
            if found:
                pids = {k: int(v) for k, v in re.findall(r"(\S+)=(\d+)", found.group(1))}
                break
        assert pids and len(pids) == 2, pids
        deadline = time.monotonic() + 180
        for line in launcher.stdout:  # both workers train: a step is done
            if "train step" in line or time.monotonic() > deadline:
                break
        assert all(process_alive(pid) for pid in pids.values())
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    deadline = time.monotonic() + 10
    while any(process_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = {name: pid for name, pid in pids.items() if process_alive(pid)}
    for pid in survivors.values():  # leave nothing behind on failure either
        os.kill(pid, signal.SIGKILL)
    assert survivors == {}
