"""parameter_server and tpu mistakes: one line each, before anything is built or written."""

import json
import socket

import pytest

from tfloop.engine.plan import make_plan
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
