"""bin/train under what the platforms write: the engine hands TensorFlow the value it read.

Subprocesses (bin/train), one task each, on loopback: a few seconds of training.
"""

import json
import socket

from helpers import assert_one_line_error, run_bin

FLAGS = ["--strategy=multi_worker", "--collective=ring", "--global_batch_size=16",
         "--train_steps=4", "--steps_per_loop=2", "--checkpoint_interval=4", "--mode=train",
         "--startup_timeout=20"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_a_master_task_trains_as_the_chief_into_the_platforms_directories(tmp_path):
    """AI Platform's `master` (seed 003): TensorFlow alone refuses it ("Disallowed task type").
    And with Vertex AI's AIP_* directories set, no --model_dir given: the run
    goes to $AIP_CHECKPOINT_DIR (not $AIP_MODEL_DIR: a restarted job finds its
    checkpoints there); a --summaries_dir given wins over $AIP_TENSORBOARD_LOG_DIR;
    each decision is one log line. --cluster_from=tf_config reads that source only."""
    config = json.dumps({"cluster": {"master": [f"localhost:{_free_port()}"]},
                         "task": {"type": "master", "index": 0}, "environment": "cloud"})
    aip = {"AIP_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
           "AIP_MODEL_DIR": str(tmp_path / "model"),
           "AIP_TENSORBOARD_LOG_DIR": str(tmp_path / "logs")}
    result = run_bin("train", *FLAGS, "--cluster_from=tf_config", "--summary_interval=2",
                     f"--summaries_dir={tmp_path / 'given'}", env={"TF_CONFIG": config, **aip},
                     timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert ("TF_CONFIG calls the chief 'master' (AI Platform's name for it); read as 'chief'"
            in output)
    assert "cluster from TF_CONFIG: this task is chief:0 at localhost:" in output
    assert (f"--model_dir={tmp_path / 'checkpoints'} from $AIP_CHECKPOINT_DIR (Vertex AI); "
            "--model_dir overrides it") in output
    assert (f"--summaries_dir={tmp_path / 'given'} as given (not $AIP_TENSORBOARD_LOG_DIR="
            f"{tmp_path / 'logs'})") in output
    assert (tmp_path / "checkpoints" / "checkpoint").exists()
    assert list((tmp_path / "given" / "train").glob("events.out.tfevents.*"))
    assert not (tmp_path / "model").exists() and not (tmp_path / "logs").exists()
    assert not (tmp_path / "checkpoints" / "summaries").exists()


def test_one_address_written_two_ways_is_one_line_not_a_wait(tmp_path):
    """`localhost:P` and `127.0.0.1:P`: before, worker:0 waited out --startup_timeout."""
    port = _free_port()
    config = json.dumps({"cluster": {"worker": [f"localhost:{port}", f"127.0.0.1:{port}"]},
                         "task": {"type": "worker", "index": 0}})
    result = run_bin("train", *FLAGS[:-1], "--startup_timeout=3", f"--model_dir={tmp_path / 'run'}",
                     env={"TF_CONFIG": config}, timeout=120)
    assert result.returncode == 2
    assert_one_line_error(result, contains="which are the same address (this machine's loopback)")
    assert not (tmp_path / "run").exists()
