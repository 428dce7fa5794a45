"""parameter_server and tpu mistakes: one line each, before anything is built or written."""

import json
import socket

import pytest

from tfloop.engine.assembly.plan import make_plan
from tfloop.engine.strategies import tpu
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from helpers import assert_one_line_error, run_bin

_PS_CLUSTER = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}


def _tf_config(cluster, task_type, index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


@pytest.mark.parametrize("tf_config, flags, message", [
    (_tf_config(_PS_CLUSTER, "ps"), {"strategy": "mirrored"},
     "makes this process a ps task, which only --strategy=parameter_server uses"),
    (_tf_config({"worker": ["localhost:1", "localhost:2"], "ps": ["localhost:3"]}, "worker"),
     {"strategy": "multi_worker"}, "TF_CONFIG has ps tasks, which --strategy=multi_worker"),
    ("", {"strategy": "parameter_server"}, "needs a TF_CONFIG cluster with a chief"),
    (_tf_config({"worker": ["localhost:1"], "ps": ["localhost:3"]}, "worker"),
     {"strategy": "parameter_server"}, "and it has no chief"),
    (_tf_config(_PS_CLUSTER, "chief"), {"strategy": "parameter_server", "mode": "evaluate"},
     "the chief only trains"),
    (_tf_config(_PS_CLUSTER, "chief"), {"strategy": "parameter_server", "collective": "ring"},
     "--collective=ring does not apply to --strategy=parameter_server"),
    (_tf_config(_PS_CLUSTER, "chief"), {"strategy": "parameter_server", "ema_decay": 0.9},
     "--ema_decay=0.9 is a step option of the synchronous strategies"),
])
def test_parameter_server_mistakes(monkeypatch, tmp_path, tf_config, flags, message):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    model_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        make_plan(RunConfig(model_dir=str(model_dir), **flags))
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not model_dir.exists()


def test_tpu_is_refused_at_once_when_none_is_named():
    with pytest.raises(ConfigError) as error:
        tpu.connect("", environ={})
    assert str(error.value).startswith("--strategy=tpu found no TPU: no --tpu and no TPU_NAME")


def test_tpu_address_where_nothing_listens_is_refused_without_waiting():
    with socket.socket() as sock:  # a port that was free a moment ago
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConfigError) as error:
        tpu.connect(f"grpc://127.0.0.1:{port}", environ={})
    assert f"nothing answers at 127.0.0.1:{port}" in str(error.value)
    assert "use --strategy=mirrored" in str(error.value)


def test_bin_train_tpu_without_a_tpu_is_one_line(tmp_path):
    result = run_bin("train", "--strategy=tpu", f"--model_dir={tmp_path / 'run'}",
                     env={"TPU_NAME": ""}, timeout=120)
    assert result.returncode == 2
    assert_one_line_error(result, contains="--strategy=tpu found no TPU")
    assert not (tmp_path / "run").exists()


# --- multi_worker on GPUs (issue 15): NCCL where it helps, refused where it cannot run ---

GPU_PAIR = ["/gpu:0", "/gpu:1"]


def _multi_worker():
    from tfloop.engine import strategies

    return strategies.get("multi_worker")


@pytest.mark.parametrize("collective, devices, implementation", [
    ("auto", GPU_PAIR, "NCCL"),      # TF's AUTO would run the ring between GPUs
    ("auto", ["/cpu:0"], "AUTO"),
    ("ring", GPU_PAIR, "RING"),
    ("nccl", GPU_PAIR, "NCCL"),
])
def test_multi_worker_auto_is_nccl_when_every_local_device_is_a_gpu(
        collective, devices, implementation):
    import tensorflow as tf
    from tfloop.engine.strategies import multi_worker

    config = RunConfig(strategy="multi_worker", collective=collective, pack_bytes=1 << 20)
    spec = _multi_worker()
    decided = spec.collective_implementation(config.distribution, devices)  # once, by the plan
    options = multi_worker.communication_options(config.distribution, decided)
    assert options.implementation == getattr(
        tf.distribute.experimental.CommunicationImplementation, implementation)
    assert options.bytes_per_pack == 1 << 20
    assert spec.collective_name(collective, devices) == "strategy"
    described = spec.describe_collective(object(), config.distribution, devices, decided)
    if collective == "auto" and devices == GPU_PAIR:
        assert "implementation NCCL (auto: every local device is a GPU)" in described


def test_multi_worker_auto_on_virtual_gpus_stays_tfs_ring(monkeypatch):
    import tensorflow as tf
    from tfloop.collectives import gpus
    from tfloop.engine.strategies import multi_worker

    monkeypatch.setattr(gpus, "logical_split", lambda physical=None: [2])
    config = RunConfig(strategy="multi_worker")
    options = multi_worker.communication_options(
        config.distribution,
        _multi_worker().collective_implementation(config.distribution, GPU_PAIR))
    assert options.implementation == tf.distribute.experimental.CommunicationImplementation.AUTO
    with pytest.raises(ConfigError, match="virtual GPUs on one physical GPU"):
        _multi_worker().collective_name("nccl", GPU_PAIR)
    _multi_worker().collective_name("auto", GPU_PAIR, gradient_dtype="bfloat16")  # the ring: fine


@pytest.mark.parametrize("collective", ["auto", "nccl"])
def test_multi_worker_nccl_with_bfloat16_is_refused_in_one_line(collective):
    with pytest.raises(ConfigError) as raised:
        _multi_worker().collective_name(collective, GPU_PAIR, gradient_dtype="bfloat16")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("--strategy=multi_worker --collective=")
    assert "--gradient_dtype=float16" in message and "--collective=ring" in message
    _multi_worker().collective_name(collective, GPU_PAIR, gradient_dtype="float16")
    _multi_worker().collective_name("auto", ["/cpu:0"], gradient_dtype="bfloat16")


def test_only_a_silent_peer_is_a_lost_peer():
    import tensorflow as tf
    from tfloop.engine.strategies import multi_worker

    assert tf.errors.InternalError not in multi_worker.PEER_LOST
    assert set(multi_worker.PEER_LOST) == {
        tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
        tf.errors.CancelledError}
    assert _multi_worker().unrecoverable_errors == (tf.errors.InternalError,)


_FAILING_TASK = '''
import tensorflow as tf
from examples.regression import Regression
from tfloop.engine.loop import trainer


def _nccl_fails(self, num_steps):
    raise tf.errors.InternalError(None, None, "ncclCommInitRank failed: unhandled cuda error")


# What TensorFlow raises from the first step when NCCL cannot set up: injected
# where the compiled loop runs (no CPU op raises an InternalError on demand).
trainer.Trainer.train = _nccl_fails
NcclFails = Regression
'''


def test_an_internal_error_is_itself_in_one_line_permanent_not_lost_the_cluster(tmp_path):
    """Before: "lost the cluster", which bin/launch --max_restarts restarts
    forever; now the error by name, exit 1 (the table's FAILED: not retryable)."""
    import os

    from tfloop.engine.errors import UnrecoverableFailure
    from tfloop.launch import exit_codes

    assert UnrecoverableFailure.exit_status == exit_codes.FAILED
    assert not exit_codes.retryable(UnrecoverableFailure.exit_status)
    (tmp_path / "nccl_fails.py").write_text(_FAILING_TASK)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    result = run_bin("train", "--strategy=multi_worker", "--devices=cpu:0",
                     "--task=nccl_fails:NcclFails", "--train_steps=2", "--steps_per_loop=1",
                     "--global_batch_size=8", f"--model_dir={tmp_path / 'run'}",
                     env={"PYTHONPATH": path})
    assert result.returncode == exit_codes.FAILED, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "failed at step 0 with InternalError: ncclCommInitRank failed" in lines[0]
    assert "not a lost peer: a restart would fail the same way" in lines[0]
    assert lines[0].endswith("(exit 1: failed: a restart cannot fix it)")
    assert "lost the cluster" not in result.stderr
