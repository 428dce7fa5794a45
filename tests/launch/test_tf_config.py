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
    (_config(WORKERS, {"type": "master", "index": 0}),
     "task type 'master' (the chief) has no job in the cluster"),
    (_config(WORKERS, {"type": "trainer", "index": 0}), "task type 'trainer' is not one of"),
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


# -- what the platforms write (issue 23) -------------------------------------------------

TFJOB = {"chief": ["job-chief-0.ns.svc:2222"],
         "worker": ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"],
         "evaluator": ["job-evaluator-0.ns.svc:2222"]}


def _no_lookup(hosts):
    return {}


def test_tfjob_lists_the_evaluator_and_it_stays_a_sidecar():
    """TFJob puts every replica type in `cluster`; TensorFlow accepts one evaluator there."""
    worker = tf_config.parse(_config(TFJOB, {"type": "worker", "index": 1}), lookup=_no_lookup)
    assert set(worker.cluster) == {"chief", "worker"} and worker.num_workers == 3
    assert worker.evaluator_address == "job-evaluator-0.ns.svc:2222"
    assert "evaluator" not in worker.describe_cluster()
    assert worker.address == "job-worker-1.ns.svc:2222" and not worker.is_chief
    evaluator = tf_config.parse(_config(TFJOB, {"type": "evaluator", "index": 0}),
                                lookup=_no_lookup)
    assert evaluator.is_evaluator and not evaluator.is_member and evaluator.address is None
    assert evaluator.num_workers == 3 and evaluator.tf_cluster() == TFJOB


@pytest.mark.parametrize("cluster, message", [
    ({**WORKERS, "evaluator": ["localhost:1", "localhost:2"]}, "has 2 evaluators"),
    ({**WORKERS, "evaluator": {"1": "localhost:1"}}, "lists the evaluator as task 1"),
    ({**WORKERS, "chief": {"3": "localhost:1"}}, "lists the chief as task 3"),
])
def test_at_most_one_evaluator_and_chief(cluster, message):
    with pytest.raises(TFConfigError, match=message):
        tf_config.parse(_config(cluster, {"type": "worker", "index": 0}))


def test_dynamic_worker_writes_a_sparse_worker_job():
    """TFJob `enableDynamicWorker`: a worker knows the ps tasks and itself only."""
    text = json.dumps({"cluster": {"ps": ["job-ps-0:2222"], "worker": {"1": "job-worker-1:2222"}},
                       "task": {"type": "worker", "index": 1}})
    role = tf_config.parse(text, lookup=_no_lookup)
    assert role.is_sparse and role.cluster["worker"] == {1: "job-worker-1:2222"}
    assert role.address == "job-worker-1:2222" and not role.is_chief
    assert role.describe_cluster() == "ps:0=job-ps-0:2222, worker:1=job-worker-1:2222"
    assert role.tf_cluster() == {"ps": ["job-ps-0:2222"], "worker": {"1": "job-worker-1:2222"}}
    # Every index given: the list it is.
    dense = tf_config.parse(_config({"worker": {"1": "h:2", "0": "h:1"}},
                                    {"type": "worker", "index": 1}))
    assert dense.cluster == {"worker": ("h:1", "h:2")} and not dense.is_sparse


@pytest.mark.parametrize("cluster, task, message", [
    # TFJob enableDynamicWorker's chief: nothing listed.
    ({"worker": {}, "ps": []}, {"type": "chief", "index": 0}, "set enableDynamicWorker: false"),
    ({"worker": {"1": "h:1"}}, {"type": "worker", "index": 0},
     "task index 0 is not in job 'worker', which lists task(s) 1"),
    ({"worker": {"one": "h:1"}}, {"type": "worker", "index": 0}, "has task index 'one'"),
    ({"worker": {"1": "h:1", "01": "h:2"}}, {"type": "worker", "index": 1},
     "lists task index 1 twice"),
    ({"worker": ["h:1"], "ps": None}, {"type": "worker", "index": 0},
     "cluster job 'ps' must be a list"),
    ({"worker": [7]}, {"type": "worker", "index": 0}, "has address 7; write host:port"),
])
def test_malformed_sparse_and_empty_jobs(cluster, task, message):
    with pytest.raises(TFConfigError) as error:
        tf_config.parse(_config(cluster, task))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_empty_job_is_no_job():
    role = tf_config.parse(_config({"worker": ["h:1"], "ps": [], "chief": {}},
                                   {"type": "worker", "index": 0}))
    assert role.cluster == {"worker": ("h:1",)} and role.is_chief


def test_master_is_the_chief_and_said_so(caplog):
    """AI Platform (seed 003's config.yaml) and legacy TFJob name the chief `master`."""
    cluster = {"master": ["m:2222"], "worker": ["w0:2222", "w1:2222"]}
    with caplog.at_level("INFO", logger="tfloop.launch.tf_config"):
        chief = tf_config.parse(_config(cluster, {"type": "master", "index": 0}),
                                lookup=_no_lookup)
    assert (chief.task_type, chief.is_chief, chief.num_workers) == ("chief", True, 3)
    assert list(chief.cluster) == ["chief", "worker"]
    assert [r.getMessage() for r in caplog.records] == [
        "TF_CONFIG calls the chief 'master' (AI Platform's name for it); read as 'chief'"]
    worker = tf_config.parse(_config(cluster, {"type": "worker", "index": 0}),
                             lookup=_no_lookup)
    assert not worker.is_chief and worker.cluster["chief"] == ("m:2222",)
    with pytest.raises(TFConfigError, match="both a 'master' and a 'chief' job"):
        tf_config.parse(_config({**cluster, "chief": ["c:1"]}, {"type": "worker", "index": 0}))


def test_extra_keys_are_ignored():
    text = json.dumps({"cluster": WORKERS, "task": {"type": "worker", "index": 1},
                       "environment": "cloud", "job": {"job_name": "x"}, "trial": "",
                       "rpc_layer": "grpc"})
    assert tf_config.parse(text) == tf_config.parse(_config(WORKERS, {"type": "worker",
                                                                      "index": 1}))


@pytest.mark.parametrize("first, second", [
    ("localhost:1001", "127.0.0.1:1001"),
    ("127.0.0.1:1001", "127.0.1.1:1001"),
    ("[::1]:1001", "localhost:1001"),
])
def test_one_address_written_two_ways_is_a_duplicate(first, second):
    """Resolved offline: IP literals and localhost need no DNS."""
    with pytest.raises(TFConfigError) as error:
        tf_config.parse(_config({"worker": [first, second]}, {"type": "worker", "index": 0}))
    assert (f"gives {first!r} to worker:0 and {second!r} to worker:1, which are the same "
            "address (this machine's loopback)") in str(error.value)
    assert "\n" not in str(error.value)


def test_a_name_that_resolves_to_the_same_address_is_a_duplicate():
    def lookup(hosts):
        assert set(hosts) == {"trainer-a", "trainer-b", "127.0.0.1"}
        return {"trainer-a": frozenset({"10.0.0.5"}), "trainer-b": frozenset({"10.0.0.5"}),
                "127.0.0.1": frozenset({"loopback"})}
    cluster = {"chief": ["trainer-a:2222"], "worker": ["trainer-b:2222", "127.0.0.1:2222"]}
    with pytest.raises(TFConfigError, match=r"to chief:0 and 'trainer-b:2222' to worker:0, "
                                            r"which are the same address \(10.0.0.5\)"):
        tf_config.parse(_config(cluster, {"type": "worker", "index": 0}), lookup=lookup)


def test_names_that_do_not_resolve_are_no_error():
    """On Kubernetes a peer's name resolves once its pod is up: compare as written."""
    cluster = {"worker": ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"]}
    role = tf_config.parse(_config(cluster, {"type": "worker", "index": 0}))  # real lookup
    assert role.num_workers == 2
    calls = []
    tf_config.parse(_config(cluster, {"type": "worker", "index": 0}),
                    lookup=lambda hosts: calls.append(set(hosts)) or {})
    assert calls == [{"job-worker-0.ns.svc", "job-worker-1.ns.svc"}]


def test_only_tasks_that_share_a_port_are_resolved_and_only_a_few():
    def fail(hosts):
        raise AssertionError(f"looked up {hosts}")
    tf_config.parse(_config({"worker": ["a:1", "b:2", "c:3"]}, {"type": "worker", "index": 0}),
                    lookup=fail)
    many = [f"w{i}:2222" for i in range(tf_config.MAX_RESOLVED + 1)]
    assert tf_config.parse(_config({"worker": many}, {"type": "worker", "index": 0}),
                           lookup=fail).num_workers == len(many)


def test_a_slow_lookup_is_abandoned(monkeypatch):
    import threading

    release = threading.Event()

    def slow(host, *args, **kwargs):
        release.wait(30)
        raise OSError("gave up")
    monkeypatch.setattr(tf_config.socket, "getaddrinfo", slow)
    try:
        assert tf_config.resolve_hosts(["slow-name", "127.0.0.1"], timeout=0.1) == {
            "127.0.0.1": frozenset({"loopback"})}
    finally:
        release.set()


# -- values that gave tracebacks or a wait without end (issue 29 item 13) -------------------

@pytest.mark.parametrize("text, message", [
    (" ", "TF_CONFIG is blank (' '); unset it (no cluster) or give the cluster as JSON"),
    ("\n\t", "TF_CONFIG is blank"),
    (_config(WORKERS, {"type": "worker"}), "has no 'index'; add \"index\": N"),
    (json.dumps({"cluster": WORKERS, "task": {"type": "worker", "index": 0},
                 "rpc_layer": "bogus"}), "has rpc_layer 'bogus', which TensorFlow serves no "
                                         "cluster over; write 'grpc'"),
    (json.dumps({"cluster": WORKERS, "task": {"type": "worker", "index": 0},
                 "rpc_layer": ["grpc"]}), "has rpc_layer ['grpc']"),
    ("[" * 100000 + "]" * 100000, "TF_CONFIG is nested too deeply"),
    ('{"a":' * 50000 + "1" + "}" * 50000, "TF_CONFIG is nested too deeply"),
    (_config({"worker": ["::1:2222"]}, {"type": "worker", "index": 0}),
     "'::1:2222': an IPv6 address takes brackets: write [::1]:port"),
    (_config({"worker": ["local host:2222"]}, {"type": "worker", "index": 0}),
     "'local host:2222': the host is not a host name"),
    (_config({"worker": ["[nonsense]:2222"]}, {"type": "worker", "index": 0}),
     "[nonsense] is not an IPv6 address"),
    (_config({"worker": ["a..b:2222"]}, {"type": "worker", "index": 0}),
     "the host is not a host name"),
    (_config({"worker": ["h:o:2222"]}, {"type": "worker", "index": 0}),
     "a host name has no ':'"),
    (_config({"worker": ["localhost:\uff12\uff12"]}, {"type": "worker", "index": 0}),
     "write host:port"),
], ids=["blank", "whitespace", "no_index", "rpc_layer", "rpc_layer_list", "deep_list",
        "deep_object", "ipv6_bare", "space", "bad_brackets", "empty_label", "colon",
        "fullwidth_port"])
def test_more_malformed_tf_config_is_one_line(text, message):
    with pytest.raises(TFConfigError) as error:
        tf_config.parse(text)
    assert message in str(error.value), str(error.value)
    assert "\n" not in str(error.value)


def test_well_formed_addresses_still_pass():
    for address in ("[::1]:2222", "10.0.0.1:2222", "job-worker-0-1.job.ns.svc.cluster.local:2222",
                    "my_host:1", "HOST.:2"):
        role = tf_config.parse(_config({"worker": [address]}, {"type": "worker", "index": 0}))
        assert role.address == address
    role = tf_config.parse(json.dumps({"cluster": WORKERS, "rpc_layer": "grpc",
                                       "task": {"type": "worker", "index": 1}}))
    assert role.task_index == 1


def test_a_blank_tf_config_is_read_not_skipped():
    """TensorFlow reads a blank TF_CONFIG as JSON (a JSONDecodeError traceback
    from bin/train before); an empty one is none, for both."""
    with pytest.raises(TFConfigError, match="blank"):
        tf_config.resolve({"TF_CONFIG": "  "})
    assert not tf_config.resolve({"TF_CONFIG": ""}).role.in_cluster
