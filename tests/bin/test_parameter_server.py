"""parameter_server through bin/launch on loopback: chief + 2 workers + 1 ps.

One cluster run covers the lot: it trains asynchronously from the chief, the
loss falls, checkpoints and metrics.json land in --model_dir, a worker killed
mid-run is tolerated (TensorFlow's coordinator re-runs its closure on the
other worker; the launcher carries on), the chief's exit ends the cluster,
and no task is left running.
"""

import json
import os
import re
import signal
import threading
import time

import tensorflow as tf

from helpers import process_alive, start_bin

TRAIN_STEPS = 300


def test_chief_two_workers_one_ps_train_and_survive_a_dead_worker(tmp_path):
    model_dir = tmp_path / "run"
    launch = start_bin(
        "launch", "--chief", "--num_workers=2", "--num_ps=1", "--grace_period=5", "--",
        "bin/train", "--strategy=parameter_server", f"--model_dir={model_dir}",
        "--global_batch_size=32", f"--train_steps={TRAIN_STEPS}", "--steps_per_loop=20",
        "--checkpoint_interval=100", "--mode=train", "--optimizer=sgd", "--learning_rate=0.1")
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(launch.stderr), daemon=True)
    reader.start()
    stdout, killed = [], None
    try:
        deadline = time.monotonic() + 240
        for line in launch.stdout:  # ends when the launcher exits
            stdout.append(line)
            if killed is None and "[chief:0]" in line and "train step 20/" in line:
                pids = next(re.search(r"pids: (.*)", l).group(1) for l in list(stderr)
                            if "pids: " in l)
                pids = dict(item.split("=") for item in pids.split(", "))
                killed = int(pids["worker:1"])
                os.kill(killed, signal.SIGKILL)
            assert time.monotonic() < deadline, "".join(stdout[-20:]) + "".join(stderr[-20:])
        assert launch.wait(timeout=30) == 0, "".join(stderr[-40:])
    finally:
        if launch.poll() is None:
            launch.kill()
    reader.join(timeout=5)
    out, err = "".join(stdout), "".join(stderr)

    assert killed is not None, out
    assert "launch: worker:1 died with signal 9 (SIGKILL); the chief's coordinator carries on" in err
    assert "training finished; stopping the workers and ps tasks" in err
    assert re.search(r"\[worker:0\] .*serving at localhost:\d+", out)
    # Every task says its gRPC port is open to every interface, unauthenticated.
    for task in ("chief:0", "worker:0", "worker:1", "ps:0"):
        assert re.search(rf"\[{task}\] .*{task}: security: TensorFlow's gRPC server listens on "
                         r"port \d+ of every network interface \(not only localhost\) and has "
                         "no authentication; run the cluster on a trusted network or behind a "
                         "firewall", out), task
    # The start-up line says no all-reduce runs.
    assert re.search(r"\[chief:0\] .*chief:0: parameter_server over 1 replica\(s\) \[cpu:0\], "
                     r"collective none: the strategy reduces itself, whose workers update the "
                     "variables on the ps tasks, with no all-reduce", out)
    losses = [float(m) for m in re.findall(r"\[chief:0\] .*train step \d+/\d+  loss ([\d.]+)", out)]
    assert len(losses) >= TRAIN_STEPS // 20, out
    metrics = json.loads((model_dir / "metrics.json").read_text())
    # A closure re-run after the kill may apply a few steps twice.
    assert metrics["step"] >= TRAIN_STEPS and metrics["num_replicas"] == 1
    assert metrics["train/loss"] < losses[0] - 0.1, (losses, metrics)
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"ckpt-{metrics['step']}")
    assert os.path.exists(f"{model_dir}/ckpt-100.index")

    pids = [int(p) for p in re.findall(r"=(\d+)", re.search(r"pids: (.*)", err).group(1))]
    assert len(pids) == 4 and not [p for p in pids if process_alive(p)]
