"""TF_CONFIG mistakes are one line each, and both chief conventions are understood."""

import json

import pytest

from engine import cluster
from engine.errors import ConfigError

WORKERS = {"worker": ["localhost:1001", "localhost:1002"]}


def _config(cluster_spec, task):
    return json.dumps({"cluster": cluster_spec, "task": task})


def test_no_tf_config_means_no_cluster():
    role = cluster.parse(None)
    assert not role.in_cluster and role.is_chief


def test_worker_zero_is_chief_without_a_chief_job():
    assert cluster.parse(_config(WORKERS, {"type": "worker", "index": 0})).is_chief
    assert not cluster.parse(_config(WORKERS, {"type": "worker", "index": 1})).is_chief


def test_a_separate_chief_job():
    spec = {"chief": ["localhost:1000"], **WORKERS}
    assert cluster.parse(_config(spec, {"type": "chief", "index": 0})).is_chief
    worker0 = cluster.parse(_config(spec, {"type": "worker", "index": 0}))
    assert not worker0.is_chief and worker0.num_workers == 3


def test_the_evaluator_is_outside_the_cluster():
    role = cluster.parse(_config(WORKERS, {"type": "evaluator", "index": 0}))
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
])
def test_malformed_tf_config(text, message):
    with pytest.raises(ConfigError) as error:
        cluster.parse(text)
    assert message in str(error.value)
    assert "\n" not in str(error.value)
