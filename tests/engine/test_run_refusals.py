"""`run()` refuses impossible requests before it builds or writes anything.

In process, on the session's logical CPUs: each case is one user error whose
message names the fix, and `model_dir` is never created: the engine's
`ConfigError`, or the error type of the package that refused (`ModelError`,
`InputError`). That the binaries
print such an error as one line with exit status 2 and no traceback is
checked once, through `bin/train` in a subprocess (tests/bin/test_train_cli.py).
"""

import pytest

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.run import run
from tfloop.inputs import InputError
from tfloop.models import ModelError

SMALL = dict(train_steps=20, steps_per_loop=10, global_batch_size=32)


@pytest.mark.parametrize("overrides, error_type, message", [
    (dict(strategy="mirrord"), ConfigError, "--strategy='mirrord' is not a strategy"),
    (dict(model="resnet"), ModelError, "--model='resnet' is not a model"),
    (dict(dataset="imagenet"), InputError, "--dataset='imagenet' is not a dataset"),
    (dict(devices="gpu:0"), ConfigError, "gpu:0 does not exist"),
    (dict(devices="cpu:0,cpu:1,cpu:2"), ConfigError, "does not divide by the 3 replicas"),
    (dict(dataset="mnist", data_dir="/nonexistent"), InputError, "mnist.npz does not exist"),
    (dict(optimizer="adagrad"), ConfigError, "is not an optimizer"),
    (dict(train_steps=-1), ConfigError, "must be 0 or more"),
    (dict(global_batch_size=16384), ConfigError,
     "--global_batch_size=16384 is larger than the 8192 examples ClassificationTask trains on"),
    (dict(devices="cpu:0,cpu:100000"), ConfigError, "beyond the 64 logical CPU devices"),
    (dict(dataset="mnist", data_dir="/nonexistent", num_classes=3), ConfigError,
     "--num_classes=3 applies to --dataset=synthetic only"),
    (dict(strategy="parameter_server", synthetic_on_device=True), ConfigError,
     "--synthetic_on_device keeps one batch on the devices"),
])
def test_impossible_requests_are_refused_before_anything_is_written(
        tmp_path, overrides, error_type, message):
    model_dir = tmp_path / "run"
    with pytest.raises(error_type) as error:
        run(RunConfig(model_dir=str(model_dir), **{**SMALL, **overrides}))
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not model_dir.exists()


def test_malformed_mnist_npz_is_refused(tmp_path):
    (tmp_path / "mnist.npz").write_bytes(b"not a zip file")
    with pytest.raises(InputError, match="is not a readable .npz file"):
        run(RunConfig(dataset="mnist", data_dir=str(tmp_path), model_dir=str(tmp_path / "run"),
                      **SMALL))
    assert not (tmp_path / "run").exists()


def test_unwritable_model_dir_is_refused(tmp_path):
    # A path below a regular file can never be created, whoever runs the test
    # (permission bits alone do not stop root).
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot be written"):
        run(RunConfig(model_dir=str(blocker / "run"), **SMALL))
    assert blocker.read_text() == ""


def test_model_dir_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        run(RunConfig(model_dir=str(target), **SMALL))


def test_a_cluster_with_a_single_process_strategy_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["localhost:1"]}, '
                                    '"task": {"type": "worker", "index": 0}}')
    with pytest.raises(ConfigError, match="use --strategy=multi_worker"):
        run(RunConfig(strategy="mirrored", model_dir=str(tmp_path / "run"), **SMALL))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe garbage", b"[1, 2]"])
def test_a_damaged_run_json_is_one_line_and_nothing_changes(tmp_path, content):
    """run.json is read before anything is built; a damaged one names itself."""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "run.json").write_bytes(content)
    with pytest.raises(ConfigError) as error:
        run(RunConfig(model_dir=str(model_dir), **SMALL))
    message = str(error.value)
    assert "run.json cannot be read" in message and "\n" not in message
    assert sorted(p.name for p in model_dir.iterdir()) == ["run.json"]
    assert (model_dir / "run.json").read_bytes() == content
