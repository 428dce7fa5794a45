"""`run()` refuses impossible requests before it builds or writes anything.

In process, on the session's logical CPUs: each case is one user error whose
message names the fix, and `model_dir` is never created: the engine's
`ConfigError`, or the error type of the package that refused (`ModelError`,
`InputError`). That the binaries
print such an error as one line with exit status 2 and no traceback is
checked once, through `bin/train` in a subprocess (tests/bin/test_train_cli.py).
"""

import os

import pytest

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.run import run
from tfloop.inputs import InputError
from tfloop.models import ModelError

SMALL = dict(train_steps=20, steps_per_loop=10, global_batch_size=32)


@pytest.mark.parametrize("overrides, error_type, message", [
    (dict(strategy="mirrord"), ConfigError, "--strategy='mirrord' is not a strategy"),
    (dict(model="resnet"), ModelError, "--model='resnet' is not a model"),
    (dict(dataset="cifar10"), InputError, "--dataset='cifar10' is not a dataset"),
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


@pytest.mark.parametrize("body, says", [
    ("import sys\n\ndef build():\n    sys.exit(0)\n",
     "CompiledClassificationTask.build_model called sys.exit(0), which would end the run as if "
     "it had succeeded; return from it instead"),
    ("import sys\nsys.exit(0)\n\ndef build():\n    pass\n",
     "--task='{module}:build': importing '{module}' called sys.exit(0)"),
], ids=["in_the_function", "at_import"])
def test_a_task_that_calls_sys_exit_is_a_clear_failure(tmp_path, monkeypatch, request, body,
                                                       says):
    """Issue 29 item 15: a `--task` function calling sys.exit(0) ended bin/train
    with status 0, nothing trained and nothing said: a platform's success."""
    from tfloop.engine.errors import TaskError

    module = f"exits_{request.node.callspec.id}"
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TaskError) as error:
        run(RunConfig(model_dir=str(tmp_path / "run"), task=f"{module}:build", devices="cpu:0",
                      strategy="default", **SMALL))
    assert says.format(module=module) in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


# -- one path check for every path input (issue 29 items 8, 12, 16) -----------------------

@pytest.mark.parametrize("field", ["model_dir", "summaries_dir", "init_from", "data_dir",
                                   "local_checkpoint_dir"])
@pytest.mark.parametrize("value, says", [
    ("~/s", "starts with ~, which nothing expanded"),
    ("runs/a\nb", "holds the control character '\\n'"),
    ("runs/a\x00b", "holds the control character '\\x00'"),
    ("   ", "is blank; name a directory"),
    (os.fsdecode(b"runs/\xff"), "is not valid UTF-8"),
], ids=["tilde", "newline", "nul", "blank", "not-utf8"])
def test_every_path_field_gets_the_model_dirs_check(tmp_path, monkeypatch, field, value, says):
    """`--summaries_dir=~/s` made a folder named `~`; a path with a newline was
    taken; NUL was a ValueError traceback. The check bin/train runs on each
    given flag before TensorFlow loads (config.check_field) and RunConfig's."""
    from tfloop.engine.config import check_field

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as given:
        check_field(field, value)
    with pytest.raises(ConfigError) as built:
        RunConfig(**{"model_dir": str(tmp_path / "run"), **SMALL, field: value})
    for error in (given, built):
        assert str(error.value).startswith(f"--{field}=") and says in str(error.value)
        assert "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_summaries_dir_is_refused_before_anything_is_written(tmp_path):
    """Issue 29 item 8: a traceback, exit 1, and a half-made model folder
    saying `running`. Checked with model_dir, in its terms."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(ConfigError) as error:
        run(RunConfig(model_dir=str(tmp_path / "run"), summaries_dir=str(blocker / "logs"),
                      **SMALL))
    assert str(error.value).startswith(f"--summaries_dir={blocker / 'logs'} cannot be written")
    assert not (tmp_path / "run").exists() and blocker.read_text() == ""


def test_init_from_out_of_reach_is_the_retryable_class(tmp_path, monkeypatch):
    """Issue 29 item 12: --init_from=gs://... offline was a traceback and exit
    1 (an offline gs:// model_dir was already 138)."""
    import tensorflow as tf

    from tfloop.engine.errors import StorageUnavailable
    from tfloop.launch import exit_codes

    exists = tf.io.gfile.exists

    def offline(path):
        if str(path).startswith("gs://"):
            raise tf.errors.FailedPreconditionError(
                None, None, "Error executing an HTTP request: libcurl code 6 meaning 'Could not "
                "resolve hostname', error details: Could not resolve host: storage.googleapis.com")
        return exists(path)

    monkeypatch.setattr(tf.io.gfile, "exists", offline)
    with pytest.raises(StorageUnavailable) as error:
        run(RunConfig(model_dir=str(tmp_path / "run"), init_from="gs://bucket/base", **SMALL))
    assert str(error.value).startswith("--init_from=gs://bucket/base cannot be reached "
                                       "(FailedPreconditionError: Could not resolve host")
    assert error.value.exit_status == exit_codes.RESTART
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("environ, says", [
    ({"AIP_CHECKPOINT_DIR": "gs://b/run\n"}, "$AIP_CHECKPOINT_DIR='gs://b/run\\n' holds the "
                                               "control character '\\n'"),
    ({"AIP_CHECKPOINT_DIR": " "}, "$AIP_CHECKPOINT_DIR=' ' is blank; name a directory, or unset"),
    ({"AIP_CHECKPOINT_DIR": "", "AIP_MODEL_DIR": "/m"}, "$AIP_CHECKPOINT_DIR='' is blank"),
    ({"AIP_TENSORBOARD_LOG_DIR": "~/logs"}, "$AIP_TENSORBOARD_LOG_DIR=~/logs starts with ~"),
], ids=["newline", "blank", "empty", "tilde"])
def test_a_bad_aip_directory_is_one_line(environ, says):
    """A blank AIP_CHECKPOINT_DIR was ignored in silence (the run trained into
    ./runs/default); one with a newline was taken."""
    from absl import flags

    from tfloop.bin import flag_defs

    values = flags.FlagValues()
    for name in ("model_dir", "summaries_dir"):
        flags.DEFINE_string(name, "", "", flag_values=values)
    values.mark_as_parsed()
    with pytest.raises(ConfigError) as error:
        flag_defs.platform_dir_defaults(environ, flag_values=values)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert values["model_dir"].value == "" or "AIP_TENSORBOARD" in says
    good = flag_defs.platform_dir_defaults({"AIP_CHECKPOINT_DIR": "gs://b/run"},
                                           flag_values=values)
    assert values["model_dir"].value == "gs://b/run" and good
