"""`fit` on two workers under bin/launch: one run checks seed 001's code
shape, seed 000's callback, CSVLogger (chief only), EarlyStopping (agreed by
both workers) and a custom callback recording `logs` (every worker)."""

import json
import os
import sys

import tensorflow as tf

from helpers import REPO, run_bin

SCRIPT = os.path.join(os.path.dirname(__file__), "seed_001_cluster.py")


def test_seed_001_and_keras_callbacks_on_two_workers(tmp_path):
    worker_tmp = tmp_path / "worker_tmp"
    worker_tmp.mkdir()
    result = run_bin("launch", "--num_workers=2", "--grace_period=5", "--",
                     sys.executable, SCRIPT, str(tmp_path),
                     env={"TMPDIR": str(worker_tmp), "PYTHONPATH": REPO}, timeout=300)
    out = result.stdout
    assert result.returncode == 0, result.stderr[-3000:] + out[-3000:]
    for worker in ("worker:0", "worker:1"):
        assert f"{worker}: multi_worker over 2 replica(s)" in out
        # Seed 000's callback runs on both, with fit's log keys.
        epoch_end = [line for line in out.splitlines()
                     if line.startswith(f"[{worker}] End epoch 0 of training; got log keys: ")]
        assert len(epoch_end) == 1 and "'loss'" in epoch_end[0] and "'accuracy'" in epoch_end[0]
        # One batch call per loop of 2 steps: batches 1 and 3 of each 4-step epoch.
        assert f"[{worker}] ...Training: end of batch 1; got log keys" in out
        assert f"[{worker}] ...Training: end of batch 2;" not in out
        assert f"[{worker}] Stop training; got log keys" in out
    # EarlyStopping stopped both workers after epoch 2 of 3, at the same step.
    assert "stopping early at step 8: a Keras callback set model.stop_training" in out
    assert "worker0 history epochs [0, 1] loss 2" in out
    assert "worker1 history epochs [0, 1] loss 2" in out
    assert tf.train.latest_checkpoint(str(tmp_path / "model")).endswith("ckpt-8")
    # CSVLogger wrote on the chief only; the recorder on both, the same all-reduced logs.
    assert (tmp_path / "log-worker0.csv").read_text().splitlines()[0].startswith("epoch,")
    assert len((tmp_path / "log-worker0.csv").read_text().splitlines()) == 3
    assert not (tmp_path / "log-worker1.csv").exists()
    chief, other = (json.loads((tmp_path / f"logs-worker{i}.json").read_text()) for i in (0, 1))
    assert chief == other
    assert [epoch for epoch, _ in chief["epochs"]] == [0, 1] and chief["stop_training"]
    assert {"loss", "accuracy"} <= set(chief["epochs"][0][1])
    assert os.listdir(worker_tmp) == []
