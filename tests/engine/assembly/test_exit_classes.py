"""The exit-code contract (launch/exit_codes.py) where the engine decides it:
each failure carries the status it means, a lost peer and unreachable storage
are retryable (138), a NaN stop, an InternalError, a flag error are not, and
the binaries' last line names the class. In-process and cheap; the real
cluster (a survivor's 138) is tests/bin/test_multi_worker.py, bin/launch's
restarts tests/launch/test_launcher.py."""

from __future__ import annotations

import socket

import pytest
import tensorflow as tf

from helpers import assert_one_line_error, run_bin
from tfloop.bin import cli
from tfloop.engine import errors
from tfloop.engine.config import RunConfig
from tfloop.engine.assembly.run import run
from tfloop.engine.assembly.plan import spec_sections
from tfloop.engine.run_dir import run_identity, storage
from tfloop.engine.strategies.spec import StrategySpec
from tfloop.launch import exit_codes


def _config(model_dir, **overrides):
    settings = dict(strategy="one_device", devices="cpu:0", model="mlp", dataset="synthetic",
                    model_dir=str(model_dir), global_batch_size=32, train_steps=2,
                    steps_per_loop=1, checkpoint_interval=1, summary_interval=0, mode="train",
                    export=False, seed=1)
    settings.update(overrides)
    return RunConfig(**settings)


@pytest.mark.parametrize("failure, status", [
    (errors.RunFailure, exit_codes.FAILED),            # a full disk
    (errors.NonFinite, exit_codes.FAILED),             # a NaN stop
    (errors.TaskFailure, exit_codes.FAILED),           # the task's data ran out
    (errors.UnrecoverableFailure, exit_codes.FAILED),  # an InternalError (NCCL)
    (errors.ExportFailure, exit_codes.UNRECOVERABLE),  # trained, the export lost
    (errors.ClusterFailure, exit_codes.RESTART),       # a lost peer (was 1)
    (errors.StorageUnavailable, exit_codes.RESTART),   # model_dir's storage out of reach
])
def test_each_failure_carries_the_status_it_means(failure, status):
    assert failure("x").exit_status == status
    assert exit_codes.retryable(status) == (status == exit_codes.RESTART)


def test_the_last_line_names_the_class_in_one_wording():
    assert cli.with_class("worker:0 lost the cluster", exit_codes.RESTART) == (
        "worker:0 lost the cluster (exit 138: restart every task from the last checkpoint)")
    assert cli.with_class("NaN", exit_codes.FAILED) == "NaN (exit 1: failed: a restart cannot fix it)"
    assert cli.with_class("bad flag", exit_codes.USAGE) == "bad flag"  # nothing ran: the fix says it


def test_a_peer_lost_before_training_is_one_retryable_line(tmp_path, monkeypatch):
    """After the cluster formed but before step 1, the survivor's collective
    fails while the trainer is built (seen in 2 of 8 trials: `UnavailableError
    ... Collective ops is aborted`, a traceback and exit 1). Injected where it
    happened, on a strategy that counts it as a lost peer (multi_worker's)."""
    def aborted(*args, **kwargs):
        raise tf.errors.UnavailableError(None, None, "Collective ops is aborted by: "
                                         "failed to connect to all addresses\nAdditional GRPC ...")

    monkeypatch.setattr(StrategySpec, "lost_peer_errors", (tf.errors.UnavailableError,))
    monkeypatch.setattr(StrategySpec, "build_trainer", aborted)
    with pytest.raises(errors.ClusterFailure) as failure:
        run(_config(tmp_path / "run"))
    message = str(failure.value)
    assert failure.value.exit_status == exit_codes.RESTART
    assert "\n" not in message
    assert message.startswith("local lost the cluster before training began (Collective ops "
                              "is aborted by: failed to connect to all addresses); the last "
                              "checkpoint is none: restart every task"), message
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_a_flag_error_is_permanent():
    """Parsed before TensorFlow loads: about a second."""
    result = run_bin("train", "--no_such_flag=1", timeout=60)
    assert result.returncode == exit_codes.USAGE
    assert not exit_codes.retryable(result.returncode)
    assert_one_line_error(result, contains="no_such_flag")


# -- storage that cannot be reached -------------------------------------------------------

_OFFLINE = tf.errors.FailedPreconditionError(
    None, None, "Error executing an HTTP request: libcurl code 6 meaning 'Could not resolve "
    "hostname', error details: Could not resolve host: www.googleapis.com\n\t when reading "
    "metadata of gs://bucket/run/run.json")


@pytest.mark.parametrize("raised, expected, says", [
    (_OFFLINE, errors.StorageUnavailable,
     "--model_dir=gs://bucket/run cannot be reached (FailedPreconditionError: Could not resolve "
     "host: www.googleapis.com); nothing was written"),
    (tf.errors.UnavailableError(None, None, "503 backend error"), errors.StorageUnavailable,
     "cannot be reached (UnavailableError: 503 backend error)"),
    (tf.errors.PermissionDeniedError(None, None, "Error executing an HTTP request: HTTP "
                                     "response code 403 with body '...'"), errors.ConfigError,
     "--model_dir=gs://bucket/run refused access (PermissionDeniedError: HTTP response code 403"),
])
def test_storage_out_of_reach_is_one_line_in_its_class(monkeypatch, raised, expected, says):
    """Where the engine first touches model_dir: run_identity.load (bin/train
    reads run.json there) and run()'s plan (check_model_dir)."""
    def exists(path):
        raise raised

    monkeypatch.setattr(tf.io.gfile, "exists", exists)
    with pytest.raises(expected) as first_touch:
        run_identity.load("gs://bucket/run")
    assert says in str(first_touch.value) and "\n" not in str(first_touch.value)
    with pytest.raises(expected, match="gs://bucket/run"):
        run(_config("gs://bucket/run"))
    status = getattr(first_touch.value, "exit_status", exit_codes.USAGE)
    assert exit_codes.retryable(status) == (expected is errors.StorageUnavailable)


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


@pytest.mark.skipif(_resolves("www.googleapis.com"), reason="online: gs:// would answer")
def test_real_gs_without_a_network_is_storage_unavailable():
    """TensorFlow's own GCS filesystem (built in), no network: the host does
    not resolve (at once here; GCS_REQUEST_CONNECTION_TIMEOUT_SECS bounds a
    network that drops packets instead)."""
    with pytest.raises(errors.StorageUnavailable, match="Could not resolve host"):
        storage.check_reachable("gs://tfloop-offline-test-bucket/run")


_A_BUG = """
from tfloop.bin import cli

def main(argv):
    raise KeyError("no_such_key")

cli.run(main, user_errors=())  # () : no TensorFlow import, a fraction of a second
"""


def test_a_bug_keeps_its_traceback_and_the_last_line_names_the_class():
    import os

    from helpers import run_python

    result = run_python(["-c", _A_BUG, "--"], timeout=60, env=dict(os.environ))
    assert result.returncode == exit_codes.FAILED, result.stderr
    assert "Traceback" in result.stderr and "KeyError: 'no_such_key'" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].endswith(
        "KeyError, a bug: the traceback above (exit 1: failed: a restart cannot fix it)")


def test_a_cluster_that_fails_to_form_is_retryable(monkeypatch):
    """The strategy's constructor failing (a peer died while the cluster
    formed; a port taken after tf_config.check_port_free): before, a
    ConfigError, exit 2, which a platform never retries."""
    from tfloop.engine.strategies.multi_worker import MultiWorker

    def dies(**kwargs):
        raise tf.errors.UnavailableError(None, None, "Socket closed")

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", dies)
    with pytest.raises(errors.ClusterFailure, match=r"could not form the cluster .*Socket closed"
                       ) as failure:
        MultiWorker().build(["/cpu:0"], sections=spec_sections(RunConfig(startup_timeout=0)))
    assert failure.value.exit_status == exit_codes.RESTART


# -- a lost peer inside a task method (issue 29 item 5) -----------------------------------

class _Builds:
    """A task whose `method` raises `error` (the survivor's collective
    reporting a lost peer while the task's own code runs)."""

    def __new__(cls, method, error):
        from tfloop.engine.task import ClassificationTask

        class Losing(ClassificationTask):
            pass

        def raises(self, *args, **kwargs):
            raise error

        setattr(Losing, method, raises)
        return Losing.from_config(_config("unused"))


_ABORTED = "Collective ops is aborted by: failed to connect to all addresses"


@pytest.mark.parametrize("method, error", [
    ("build_model", tf.errors.UnavailableError(None, None, _ABORTED)),
    ("train_dataset", tf.errors.AbortedError(None, None, _ABORTED)),
    ("build_optimizer", tf.errors.DeadlineExceededError(None, None, _ABORTED)),
])
def test_a_peer_lost_inside_a_task_method_is_the_lost_cluster_class(
        tmp_path, monkeypatch, method, error):
    """Before: `build_model raised UnavailableError`, a TaskError, exit 2
    ("a mistake in the request"), which no platform retries: a TFJob with 6
    restarts stopped for good. On a strategy that counts these as a lost peer
    (multi_worker's), they are the lost-cluster class wherever they surface."""
    from tfloop.engine.strategies.multi_worker import PEER_LOST

    monkeypatch.setattr(StrategySpec, "lost_peer_errors", PEER_LOST)
    with pytest.raises(errors.ClusterFailure) as failure:
        run(_config(tmp_path / "run"), task=_Builds(method, error))
    message = str(failure.value)
    assert failure.value.exit_status == exit_codes.RESTART
    assert "\n" not in message
    assert message.startswith(f"local lost the cluster before training began (Losing.{method} "
                              f"raised {type(error).__name__}: {_ABORTED}); the last checkpoint "
                              "is none: restart every task"), message
    assert not (tmp_path / "run").exists()


def test_outside_a_cluster_the_same_error_stays_the_tasks(tmp_path):
    """One process has no peer to lose: the method's error is the task's (exit 2)."""
    with pytest.raises(errors.TaskError, match="Losing.build_model raised UnavailableError"):
        run(_config(tmp_path / "run"),
            task=_Builds("build_model", tf.errors.UnavailableError(None, None, _ABORTED)))


def test_every_site_translates_through_the_one_context_manager():
    """The assembly (engine/assembly/run.py and runner.py) has no `except` ladder
    of its own: each stage runs under `task_failures.exit_class` (issue 32)."""
    import importlib
    import inspect

    source = "".join(inspect.getsource(importlib.import_module(f"tfloop.engine.assembly.{name}"))
                     for name in ("run", "runner"))
    assert "lost_peer_errors as" not in source and "unrecoverable_errors as" not in source
    assert "except tf.errors.OpError" not in source
    assert source.count("exit_class(") >= 3


@pytest.mark.parametrize("url", ["s3://bucket/run", "hdfs://namenode/run"])
def test_storage_other_than_gcs_gets_no_google_advice(monkeypatch, url):
    """Issue 29 item 17. TensorFlow 2.21 has no s3:// or hdfs:// built in:
    the real refusal names the missing filesystem; a refusal of access names
    the scheme's own credentials."""
    with pytest.raises(errors.ConfigError) as missing:
        storage.check_reachable(url)
    said = str(missing.value)
    assert "GOOGLE" not in said and "service account" not in said, said
    assert f"has no filesystem for {url.split(':')[0]}://" in said and "tensorflow-io" in said

    def refuses(path):
        raise tf.errors.PermissionDeniedError(None, None, "Access Denied")

    monkeypatch.setattr(tf.io.gfile, "exists", refuses)
    with pytest.raises(errors.ConfigError) as refused:
        storage.check_reachable(url)
    said = str(refused.value)
    assert "refused access (PermissionDeniedError: Access Denied)" in said
    assert "GOOGLE" not in said and "service account" not in said, said
    assert ("AWS_ACCESS_KEY_ID" if url.startswith("s3") else "HADOOP_USER_NAME") in said
