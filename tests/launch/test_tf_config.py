"""tfloop.launch.tf_config: TF_CONFIG mistakes are one line each, both chief conventions are
understood, and what the launcher writes is what the engine reads."""

import json
import os

import pytest

from tfloop.launch import TFConfigError, tf_config
from tfloop.launch.tf_config import Role

WORKERS = {"worker": ["localhost:1001", "localhost:1002"]}


def _config(cluster_spec, task):
    return json.dumps({"cluster": cluster_spec, "task": task})


def test_no_tf_config_means_no_cluster():
    role = tf_config.parse(None)
    assert not role.in_cluster and role.is_chief


def test_worker_zero_is_chief_without_a_chief_job():
    assert tf_config.parse(_config(WORKERS, {"type": "worker", "index": 0})).is_chief
    assert not tf_config.parse(_config(WORKERS, {"type": "worker", "index": 1})).is_chief


def test_a_separate_chief_job():
    spec = {"chief": ["localhost:1000"], **WORKERS}
    assert tf_config.parse(_config(spec, {"type": "chief", "index": 0})).is_chief
    worker0 = tf_config.parse(_config(spec, {"type": "worker", "index": 0}))
    assert not worker0.is_chief and worker0.num_workers == 3


def test_the_evaluator_is_outside_the_cluster():
    role = tf_config.parse(_config(WORKERS, {"type": "evaluator", "index": 0}))
    assert role.is_evaluator and not role.is_chief


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), "has no 'cluster'"),
    (json.dumps({"cluster": WORKERS}), "has no 'task'"),
    (_config(WORKERS, {"type": "worker", "index": 2}), "task index 2 is out of range"),
    (_config(WORKERS, {"type": "master", "index": 0}), "task type 'master' is not one of"),
    (_config(WORKERS, {"type": "chief", "index": 0}), "has no job in the cluster"),
    (_config({"trainer": ["localhost:1"]}, {"type": "worker", "index": 0}), "has a job 'trainer'"),
    (_config({"worker": ["localhost"]}, {"type": "worker", "index": 0}), "write host:port"),
    (_config(WORKERS, {"type": "worker", "index": -1}), "must be a non-negative integer"),
    (_config({"worker": ["localhost:70000"]}, {"type": "worker", "index": 0}),
     "port is not between 1 and 65535"),
    (_config({"worker": ["localhost:0"]}, {"type": "worker", "index": 0}),
     "port is not between 1 and 65535"),
    (_config({"worker": ["localhost:1001", "LOCALHOST:1001"]}, {"type": "worker", "index": 0}),
     "to both worker:0 and worker:1"),
    (_config({"chief": ["h:1001"], "ps": ["h:01001"]}, {"type": "chief", "index": 0}),
     "to both chief:0 and ps:0"),
])
def test_malformed_tf_config(text, message):
    with pytest.raises(TFConfigError) as error:
        tf_config.parse(text)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


# -- what the launcher writes ---------------------------------------------------------------


def test_cluster_spec_leaves_the_evaluator_out():
    tasks = [Role("chief"), Role("worker", 0), Role("worker", 1), Role("ps", 0),
             Role("evaluator")]
    cluster = tf_config.cluster_spec(tasks, [1001, 1002, 1003, 1004])
    assert cluster == {"chief": ["localhost:1001"],
                       "worker": ["localhost:1002", "localhost:1003"],
                       "ps": ["localhost:1004"]}
    assert tf_config.tf_config_for(tasks[-1], cluster) == {
        "cluster": cluster, "task": {"type": "evaluator", "index": 0}}
    assert tf_config.tf_config_for(tasks[2], cluster)["task"] == {"type": "worker", "index": 1}
    with pytest.raises(ValueError, match="need 4 ports"):
        tf_config.cluster_spec(tasks, [1001])


def test_cluster_spec_wants_each_job_in_index_order():
    with pytest.raises(ValueError, match="must come in index order; got worker:1 after 0"):
        tf_config.cluster_spec([Role("worker", 1), Role("worker", 0)], [1001, 1002])


def test_one_role_serves_engine_and_launcher():
    """The engine's names (`evaluator:0`, `local`) and the launcher's labels
    (`[evaluator]`) are both output today; both stay."""
    evaluator = tf_config.parse(_config(WORKERS, {"type": "evaluator", "index": 0}))
    assert evaluator.in_cluster and not evaluator.is_member and not evaluator.is_training
    assert (evaluator.name, evaluator.label, evaluator.address) == ("evaluator:0", "evaluator", None)
    worker = tf_config.parse(_config(WORKERS, {"type": "worker", "index": 1}))
    assert worker.is_member and worker.is_training and worker.label == worker.name == "worker:1"
    assert worker.address == "localhost:1002"
    assert worker.describe_cluster() == "worker:0=localhost:1001, worker:1=localhost:1002"
    ps = Role("ps", 0)
    assert ps.is_member and not ps.is_training
    assert Role().name == "local" and not Role().in_cluster


def test_a_port_in_use_is_one_line():
    import socket

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        address = f"localhost:{busy.getsockname()[1]}"
        role = tf_config.parse(_config({"worker": [address]}, {"type": "worker", "index": 0}))
        with pytest.raises(TFConfigError) as error:
            tf_config.check_port_free(role)
    assert f"gives worker:0 the address {address}, but port" in str(error.value)
    tf_config.check_port_free(Role())  # no cluster, no port to check


def test_launch_imports_only_the_standard_library():
    """bin/launch starts at once, and the engine reads its role before TensorFlow does."""
    import subprocess
    import sys

    code = ("import sys, launch, launch.launcher, launch.tf_config; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'tensorflow', 'numpy', 'absl', 'engine', 'collectives', 'models', 'inputs', 'bench'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                                os.path.abspath(__file__)))))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
