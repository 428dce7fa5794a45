"""tfloop.launch.platforms and tf_config.resolve: the cluster where no TF_CONFIG is written
(JobSet / Indexed Job, Vertex AI's CLUSTER_SPEC), which source wins, and the AIP_* directories.
Pure functions of an environ mapping: offline, no TensorFlow."""

import json
import logging

import pytest

from tfloop.launch import TFConfigError, platforms, tf_config


def _no_lookup(hosts):
    return {}


def _resolve(environ, source="auto"):
    return tf_config.resolve(environ, source, lookup=_no_lookup)


JOBSET = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "train-worker-0-1", "TFLOOP_NUM_WORKERS": "3",
          "TFLOOP_CHIEF": "1", "TFLOOP_EVALUATOR": "1"}
CHIEF = "train-chief-0-0.train:2222"
WORKERS = [f"train-worker-0-{i}.train:2222" for i in range(3)]


def test_jobset_worker_from_its_hostname():
    resolution = _resolve(JOBSET)
    role = resolution.role
    assert resolution.source == "jobset" and resolution.rewritten
    assert (role.task_type, role.task_index, role.is_chief) == ("worker", 1, False)
    assert role.cluster == {"chief": (CHIEF,), "worker": tuple(WORKERS)}
    assert role.address == WORKERS[1] and role.evaluator_address is None
    assert json.loads(resolution.tf_config) == {
        "cluster": {"chief": [CHIEF], "worker": WORKERS}, "task": {"type": "worker", "index": 1}}
    assert resolution.describe() == (
        "cluster from the JobSet / Indexed Job environment: this task is worker:1 at "
        f"{WORKERS[1]}; 4 task(s): chief:0={CHIEF}, worker:0={WORKERS[0]}, "
        f"worker:1={WORKERS[1]}, worker:2={WORKERS[2]}")


def test_jobset_names_from_the_downward_api_win_over_the_hostname():
    environ = {**JOBSET, "HOSTNAME": "whatever", "JOBSET_NAME": "my-run",
               "REPLICATED_JOB_NAME": "chief", "JOB_INDEX": "0", "JOB_COMPLETION_INDEX": "0",
               "TFLOOP_PORT": "5000", "TFLOOP_SUBDOMAIN": "net", "TFLOOP_NUM_PS": "1"}
    role = _resolve(environ).role
    assert (role.task_type, role.is_chief) == ("chief", True)
    assert role.cluster == {"chief": ("my-run-chief-0-0.net:5000",),
                            "worker": tuple(f"my-run-worker-0-{i}.net:5000" for i in range(3)),
                            "ps": ("my-run-ps-0-0.net:5000",)}


def test_jobset_evaluator_is_a_sidecar():
    environ = {**JOBSET, "HOSTNAME": "a-b-evaluator-0-0", "JOB_COMPLETION_INDEX": "0"}
    role = _resolve(environ).role
    assert role.is_evaluator and role.cluster["chief"] == ("a-b-chief-0-0.a-b:2222",)


def test_indexed_job_pods_are_workers():
    environ = {"JOB_COMPLETION_INDEX": "0", "HOSTNAME": "trainer-0", "TFLOOP_NUM_WORKERS": "2",
               "TFLOOP_SUBDOMAIN": "trainers"}
    role = _resolve(environ).role
    assert role.cluster == {"worker": ("trainer-0.trainers:2222", "trainer-1.trainers:2222")}
    assert role.is_chief and role.name == "worker:0"


@pytest.mark.parametrize("change, message", [
    ({"TFLOOP_NUM_WORKERS": "0"}, "TFLOOP_NUM_WORKERS='0' must be a whole number, at least 1"),
    ({"TFLOOP_NUM_PS": "x"}, "TFLOOP_NUM_PS='x' must be a whole number"),
    ({"TFLOOP_CHIEF": "maybe"}, "TFLOOP_CHIEF='maybe' must be 1 or 0"),
    ({"HOSTNAME": "train-worker-0-2"}, "says pod 2, but JOB_COMPLETION_INDEX=1"),
    ({"HOSTNAME": "train-worker-3-1"}, "in Job 3 of replicated job 'worker'"),
    ({"HOSTNAME": "train-chief-0-1"}, "task index 1 is out of range: job 'chief' has 1"),
    ({"HOSTNAME": "train-ps-0-1"}, "in replicated job 'ps', but TFLOOP_NUM_PS is not set"),
    ({"JOBSET_NAME": "train", "REPLICATED_JOB_NAME": "leader"},
     "REPLICATED_JOB_NAME='leader'; name the JobSet's replicated jobs chief, worker"),
    ({"HOSTNAME": "somepod"}, "is not an Indexed Job pod's <job>-1"),
    ({"HOSTNAME": "trainer-1", "TFLOOP_SUBDOMAIN": "s"}, "a chief, ps or evaluator needs a JobSet"),
    ({"TFLOOP_PORT": "70000"}, "TFLOOP_PORT='70000' must be a whole number, at least 1 and at "
                               "most 65535"),
    ({"HOSTNAME": "train-worker-0-7", "JOB_COMPLETION_INDEX": "7"},
     "task index 7 is out of range: job 'worker' has 3 task(s), indices 0..2 (the TF_CONFIG "
     "built from the JobSet / Indexed Job environment)"),
])
def test_jobset_mistakes_are_one_line(change, message):
    with pytest.raises(TFConfigError) as error:
        _resolve({**JOBSET, **change})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_jobset_asked_for_without_its_variables():
    with pytest.raises(TFConfigError, match="JOB_COMPLETION_INDEX='' is not a pod index"):
        _resolve({}, "jobset")
    with pytest.raises(TFConfigError, match="TFLOOP_NUM_WORKERS is not set"):
        _resolve({"JOB_COMPLETION_INDEX": "0"}, "jobset")


VERTEX = {"cluster": {"workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
                      "workerpool1": ["cmle-training-workerpool1-ab-0:2222",
                                      "cmle-training-workerpool1-ab-1:2222"],
                      "workerpool3": ["cmle-training-workerpool3-ab-0:2222"]},
          "environment": "cloud", "task": {"type": "workerpool1", "index": 1},
          "job": "{\"python_module\":\"\",\"package_uris\":[]}"}


def test_vertex_cluster_spec_without_tf_config():
    resolution = _resolve({"CLUSTER_SPEC": json.dumps(VERTEX)})
    role = resolution.role
    assert resolution.source == "vertex"
    assert (role.task_type, role.task_index) == ("worker", 1)
    assert role.cluster == {"chief": ("cmle-training-workerpool0-ab-0:2222",),
                            "worker": ("cmle-training-workerpool1-ab-0:2222",
                                       "cmle-training-workerpool1-ab-1:2222")}
    assert role.evaluator_address == "cmle-training-workerpool3-ab-0:2222"
    written = json.loads(resolution.tf_config)
    assert written["task"] == {"type": "worker", "index": 1}
    assert written["environment"] == "cloud" and written["cluster"]["evaluator"] == [
        "cmle-training-workerpool3-ab-0:2222"]
    chief = _resolve({"CLUSTER_SPEC": json.dumps({**VERTEX, "task": {"type": "workerpool0",
                                                                      "index": 0}})}).role
    assert chief.task_type == "chief" and chief.is_chief


def test_a_vertex_job_of_one_replica_is_no_cluster():
    spec = {"cluster": {"workerpool0": ["h:2222"]}, "task": {"type": "workerpool0", "index": 0}}
    resolution = _resolve({"CLUSTER_SPEC": json.dumps(spec)})
    assert resolution.source is None and not resolution.role.in_cluster


@pytest.mark.parametrize("text, message", [
    ("{", "CLUSTER_SPEC is not valid JSON"),
    ("{}", "CLUSTER_SPEC has no 'cluster'"),
    (json.dumps({"cluster": {"workerpool9": ["h:1"]}, "task": {}}), "worker pool 'workerpool9'"),
    (json.dumps({**VERTEX, "task": {"type": "chief"}}), "names none of workerpool0"),
])
def test_vertex_mistakes_are_one_line(text, message):
    with pytest.raises(TFConfigError, match=message):
        _resolve({"CLUSTER_SPEC": text})


def test_precedence_tf_config_then_vertex_then_jobset():
    tf_config_text = json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                 "task": {"type": "worker", "index": 0}})
    everything = {"TF_CONFIG": tf_config_text, "CLUSTER_SPEC": json.dumps(VERTEX), **JOBSET}
    resolution = _resolve(everything)
    assert resolution.source == "tf_config" and not resolution.rewritten
    assert resolution.tf_config == tf_config_text
    assert _resolve({**everything, "TF_CONFIG": " "}).source == "vertex"
    assert _resolve({**JOBSET, "CLUSTER_SPEC": ""}).source == "jobset"
    # One source asked for: that one only.
    assert _resolve(everything, "jobset").source == "jobset"
    assert _resolve(everything, "vertex").source == "vertex"
    with pytest.raises(TFConfigError, match="TF_CONFIG is not set"):
        _resolve(JOBSET, "tf_config")
    with pytest.raises(TFConfigError, match="cluster source 'k8s' is not one of auto"):
        _resolve(JOBSET, "k8s")


def test_an_index_alone_starts_no_cluster():
    """An Indexed Job sets JOB_COMPLETION_INDEX for any use (a sweep, say)."""
    resolution = _resolve({"JOB_COMPLETION_INDEX": "3", "HOSTNAME": "sweep-3"})
    assert resolution.source is None and not resolution.role.in_cluster
    assert resolution.describe().startswith("no cluster")
    assert tf_config.current_role({}) == tf_config.Role()


def test_master_is_handed_to_tensorflow_as_chief():
    text = json.dumps({"cluster": {"master": ["m:1"], "worker": ["w:1"]},
                       "task": {"type": "master", "index": 0}, "environment": "cloud"})
    resolution = _resolve({"TF_CONFIG": text})
    assert resolution.rewritten and resolution.role.is_chief
    assert json.loads(resolution.tf_config) == {
        "cluster": {"chief": ["m:1"], "worker": ["w:1"]}, "task": {"type": "chief", "index": 0},
        "environment": "cloud"}


def test_adopt_logs_the_source_and_hands_tensorflow_the_value(caplog):
    environ = dict(JOBSET)
    with caplog.at_level(logging.INFO, logger="tfloop.launch.tf_config"):
        role = tf_config.adopt(environ)
    assert role.name == "worker:1"
    assert json.loads(environ["TF_CONFIG"])["cluster"]["worker"] == WORKERS
    assert [r.getMessage() for r in caplog.records][-1].startswith(
        "cluster from the JobSet / Indexed Job environment: this task is worker:1 at ")
    # What it wrote reads back as the same role, from TF_CONFIG now.
    again = _resolve(environ)
    assert again.source == "tf_config" and not again.rewritten and again.role == role
    untouched = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]},
                                          "task": {"type": "worker", "index": 0}})}
    before = dict(untouched)
    tf_config.adopt(untouched)
    assert untouched == before
    assert tf_config.adopt({}) == tf_config.Role()


def test_the_engine_refuses_a_sparse_cluster_in_one_line():
    """TFJob enableDynamicWorker: read as TF reads it, but no strategy can run it."""
    text = json.dumps({"cluster": {"ps": ["p:2222"], "worker": {"1": "w1:2222"}},
                       "task": {"type": "worker", "index": 1}})
    environ = {"TF_CONFIG": text}
    assert _resolve(environ).role.is_sparse
    with pytest.raises(TFConfigError) as error:
        tf_config.adopt(environ)
    assert "lists only some tasks of a job (ps:0=p:2222, worker:1=w1:2222)" in str(error.value)
    assert "set enableDynamicWorker: false" in str(error.value) and environ["TF_CONFIG"] == text


def test_describe_names_a_few_peers_and_counts_the_rest():
    cluster = {"worker": [f"w{i}:1" for i in range(20)]}
    text = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 3}})
    line = _resolve({"TF_CONFIG": text}).describe(limit=2)
    assert line == ("cluster from TF_CONFIG: this task is worker:3 at w3:1; 20 task(s): "
                    "worker:0=w0:1, worker:1=w1:1 and 18 more")


def test_aip_directories_are_platform_defaults():
    dirs = platforms.platform_dirs({"AIP_MODEL_DIR": "gs://b/out/model/",
                                    "AIP_CHECKPOINT_DIR": "gs://b/out/checkpoints/",
                                    "AIP_TENSORBOARD_LOG_DIR": "gs://b/out/logs/"})
    assert dirs == platforms.PlatformDirs(model_dir="gs://b/out/model/",
                                          checkpoint_dir="gs://b/out/checkpoints/",
                                          tensorboard_log_dir="gs://b/out/logs/")
    assert dirs.run_dir == "gs://b/out/checkpoints/"
    # Kept as set: bin/train refuses a blank one (test_a_bad_aip_directory_is_one_line).
    assert platforms.platform_dirs({"AIP_MODEL_DIR": " "}).run_dir == " "
    assert platforms.platform_dirs({"AIP_CHECKPOINT_DIR": "", "AIP_MODEL_DIR": "/m"}).run_dir == ""
    assert platforms.platform_dirs({"AIP_MODEL_DIR": "/m"}).run_dir == "/m"


def test_cluster_from_is_a_run_flag_the_engine_reads_its_source_by(monkeypatch):
    """--cluster_from (RunConfig, Cluster section) reaches tf_config.adopt: asked
    of one source, a missing variable is one line naming it, not "no cluster"."""
    from tfloop.engine.config import RunConfig
    from tfloop.engine.errors import ConfigError
    from tfloop.engine.assembly.plan import make_plan

    assert RunConfig().cluster_from == "auto" and platforms.SOURCES[0] == "auto"
    assert "cluster_from" in RunConfig().section("Cluster")
    with pytest.raises(ConfigError, match="--cluster_from='k8s' is not a cluster source; "
                                          "choose one of: auto, tf_config, vertex, jobset"):
        RunConfig(cluster_from="k8s")
    for name in ("TF_CONFIG", "CLUSTER_SPEC", "JOB_COMPLETION_INDEX", "TFLOOP_NUM_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(TFConfigError, match="TF_CONFIG is not set, and the cluster was asked "
                                            "of it"):
        make_plan(RunConfig(cluster_from="tf_config", devices="cpu:0", model_dir="unused"))
    with pytest.raises(TFConfigError, match="CLUSTER_SPEC is not set"):
        make_plan(RunConfig(cluster_from="vertex", devices="cpu:0", model_dir="unused"))


@pytest.mark.parametrize("name, value", [
    ("TFLOOP_NUM_WORKERS", "100000000"), ("TFLOOP_NUM_WORKERS", "4097"),
    ("TFLOOP_NUM_PS", "100000000"), ("TFLOOP_NUM_WORKERS", "9" * 5000)])
def test_a_jobsets_task_counts_are_bounded(name, value):
    """Issue 29 item 11: TFLOOP_NUM_WORKERS=100000000 grew to 14.5 GB in 60 s
    building the cluster; bounded like bin/launch --num_workers, one line."""
    with pytest.raises(TFConfigError) as error:
        _resolve({**JOBSET, name: value})
    said = str(error.value)
    assert said.startswith(f"{name}=") and "at most 4096" in said and len(said) < 200, said
    assert _resolve({**JOBSET, "TFLOOP_NUM_WORKERS": "4096"}).role.num_workers == 4097
