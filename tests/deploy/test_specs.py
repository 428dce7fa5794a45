"""The job specs of deploy/, checked offline: every pod's environment, as the
platform computes it (`launch/specs.py`, a port of each platform), is read by
the engine and by TensorFlow's resolver alike; each exit status of
`launch/exit_codes.py` lands in the intended class of each platform; and a
rehearsal (`bin/launch --spec`) gives each local task the same variables on
loopback. In process and without a cluster: nothing here proves a platform
accepts the YAML (see docs/clusters.md, "Deploying").
"""

import copy
import json
from pathlib import Path

import pytest
import tensorflow as tf
import yaml
from tensorflow.python.distribute import multi_worker_util

from helpers import assert_one_line_error, run_bin
from tfloop.launch import exit_codes, rehearsal, specs, tf_config

REPO = Path(__file__).resolve().parents[2]
SPECS = {"tfjob": "deploy/tfjob.yaml", "jobset": "deploy/jobset.yaml",
         "vertex": "deploy/vertex_customjob.yaml"}
#: Kubernetes' default grace; the SIGTERM save (a loop of steps, then a
#: checkpoint to remote storage) needs more.
KUBERNETES_DEFAULT_GRACE_S = 30
#: The codes a restart cannot fix (exit_codes' table, below 128, not 0).
PERMANENT = sorted(code for code in exit_codes.MEANINGS
                   if code and not exit_codes.retryable(code))
SIGKILLED = 137  # a pod killed, or its node lost: not in the table, retryable


def _doc(platform):
    return yaml.safe_load((REPO / SPECS[platform]).read_text())


def _spec(platform, doc=None):
    return specs.read(doc or _doc(platform), SPECS[platform])


def _no_lookup(hosts):
    return {}


def _tensorflow_reads(monkeypatch, text):
    """TensorFlow's own reading of a TF_CONFIG value, and whether its strategies accept it."""
    monkeypatch.setenv("TF_CONFIG", text)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec()
    try:
        multi_worker_util._validate_cluster_spec(cluster, resolver.task_type, resolver.task_id)
        accepted = True
    except ValueError:
        accepted = False
    return resolver.task_type, resolver.task_id, cluster.as_dict(), accepted


def _check_every_pod(monkeypatch, spec, **platform):
    """Each pod's environment: the engine's role is the pod's, and what the
    engine hands TensorFlow, TensorFlow reads the same way and accepts."""
    seen = []
    for pod in specs.pods(spec):
        env = {**spec.env, **specs.environment(spec, pod, **platform)}
        resolution = tf_config.resolve(env, lookup=_no_lookup)
        role = resolution.role
        assert (role.task_type, role.task_index) == (pod.task_type, pod.task_index), env
        handed = resolution.tf_config
        task_type, index, cluster, accepted = _tensorflow_reads(monkeypatch, handed)
        assert (task_type, index) == (pod.task_type, pod.task_index)
        assert cluster == role.tf_cluster()
        assert accepted, handed
        seen.append((resolution.source, role))
    # Every pod sees the same training cluster, with every task of the spec.
    clusters = {json.dumps(dict(role.cluster), sort_keys=True) for _, role in seen}
    assert len(clusters) == 1
    training = sum(n for t, n in spec.replicas.items() if t != "evaluator")
    assert sum(len(tasks) for tasks in seen[0][1].cluster.values()) == training
    return seen


# -- the specs say what the platforms need ----------------------------------------------------


def test_the_tfjob_spec():
    doc, spec = _doc("tfjob"), _spec("tfjob")
    assert set(doc["spec"]["tfReplicaSpecs"]) == {"Chief", "Worker", "Evaluator"}
    assert doc["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    for rspec in doc["spec"]["tfReplicaSpecs"].values():
        assert rspec["restartPolicy"] == "ExitCode"
        pod = rspec["template"]["spec"]
        assert [c["name"] for c in pod["containers"]] == ["tensorflow"]
        assert pod["terminationGracePeriodSeconds"] > KUBERNETES_DEFAULT_GRACE_S
    assert rehearsal.spec_model_dir(spec).startswith("gs://")
    assert spec.max_restarts == doc["spec"]["runPolicy"]["backoffLimit"] > 0


def test_the_jobset_spec():
    doc, spec = _doc("jobset"), _spec("jobset")
    assert doc["spec"]["failurePolicy"]["maxRestarts"] == spec.max_restarts > 0
    for job in doc["spec"]["replicatedJobs"]:
        job_spec = job["template"]["spec"]
        assert job_spec["completionMode"] == "Indexed" and job_spec["backoffLimit"] == 0
        rules = job_spec["podFailurePolicy"]["rules"]
        assert {"action": "FailJob", "onExitCodes": {
            "containerName": "tensorflow", "operator": "In", "values": PERMANENT}} in rules
        assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
        pod = job_spec["template"]["spec"]
        assert pod["restartPolicy"] == "Never"  # what podFailurePolicy requires
        assert pod["terminationGracePeriodSeconds"] > KUBERNETES_DEFAULT_GRACE_S
        # --model_dir is on the volume every pod mounts, a PersistentVolumeClaim.
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        model_dir = rehearsal.spec_model_dir(spec)
        mount = next(path for path in mounts if model_dir.startswith(path + "/"))
        assert "persistentVolumeClaim" in volumes[mounts[mount]]


def test_the_vertex_spec():
    doc, spec = _doc("vertex"), _spec("vertex")
    assert doc["scheduling"]["restartJobOnWorkerRestart"] is True
    assert [pool["replicaCount"] for pool in doc["workerPoolSpecs"]] == [1, 3]
    base = doc["baseOutputDirectory"]["outputUriPrefix"]
    # --model_dir is the checkpoint folder Vertex names under the base (AIP_CHECKPOINT_DIR).
    assert rehearsal.spec_model_dir(spec) == f"{base}/checkpoints"
    assert base.startswith("gs://")


# -- every pod's environment, read by the engine and by TensorFlow ------------------------------


def test_every_tfjob_pod_is_read_alike(monkeypatch):
    spec = _spec("tfjob")
    seen = _check_every_pod(monkeypatch, spec)
    assert {source for source, _ in seen} == {"tf_config"}
    # The operator lists the evaluator in `cluster`; the engine keeps it apart.
    assert {role.evaluator_address for _, role in seen} == {
        "tfloop-mnist-evaluator-0.default.svc:2222"}
    assert seen[0][1].cluster["chief"] == ("tfloop-mnist-chief-0.default.svc:2222",)


def test_a_tfjob_without_its_evaluator_or_with_a_master(monkeypatch):
    doc = _doc("tfjob")
    del doc["spec"]["tfReplicaSpecs"]["Evaluator"]
    _check_every_pod(monkeypatch, _spec("tfjob", doc))
    # A legacy spec's Master: TF_CONFIG says `master`, which TensorFlow alone
    # refuses; the engine reads it as the chief.
    doc["spec"]["tfReplicaSpecs"]["Master"] = doc["spec"]["tfReplicaSpecs"].pop("Chief")
    spec = _spec("tfjob", doc)
    written = json.loads(specs.environment(spec, specs.pods(spec)[0])["TF_CONFIG"])
    assert written["task"] == {"type": "master", "index": 0} and "master" in written["cluster"]
    _check_every_pod(monkeypatch, spec)


def test_every_jobset_pod_is_read_alike(monkeypatch):
    spec = _spec("jobset")
    seen = _check_every_pod(monkeypatch, spec)
    assert {source for source, _ in seen} == {"jobset"}
    assert seen[0][1].cluster["worker"][3] == "tfloop-mnist-worker-0-3.tfloop-mnist:2222"
    pod = specs.pods(spec)[2]
    assert {k: v for k, v in specs.environment(spec, pod).items() if k != "TFLOOP_PORT"} == {
        "JOB_COMPLETION_INDEX": "2", "HOSTNAME": "tfloop-mnist-worker-0-2",
        "TFLOOP_NUM_WORKERS": "4", "JOBSET_NAME": "tfloop-mnist",
        "REPLICATED_JOB_NAME": "worker", "JOB_INDEX": "0"}


@pytest.mark.parametrize("tf_config_too", [True, False], ids=["TF_CONFIG", "CLUSTER_SPEC"])
def test_every_vertex_pod_is_read_alike(monkeypatch, tf_config_too):
    """Vertex sets both; the engine reads TF_CONFIG first, CLUSTER_SPEC without it."""
    spec = _spec("vertex")
    seen = _check_every_pod(monkeypatch, spec, vertex_tf_config=tf_config_too)
    assert {source for source, _ in seen} == {"tf_config" if tf_config_too else "vertex"}
    env = specs.environment(spec, specs.pods(spec)[0], vertex_tf_config=tf_config_too)
    assert ("TF_CONFIG" in env) == tf_config_too
    assert env["AIP_CHECKPOINT_DIR"] == "gs://YOUR_BUCKET/runs/tfloop-mnist/checkpoints/"


def test_spec_mistakes_are_one_line():
    doc = _doc("jobset")
    doc["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] = 3
    with pytest.raises(specs.SpecError, match="TFLOOP_NUM_WORKERS='4', but replicated job "
                                              "'worker' has 3 pod"):
        _spec("jobset", doc)
    doc = _doc("tfjob")
    doc["spec"]["enableDynamicWorker"] = True
    with pytest.raises(specs.SpecError, match="enableDynamicWorker: true"):
        _spec("tfjob", doc)
    doc = _doc("tfjob")
    doc["spec"]["tfReplicaSpecs"]["Worker"]["template"] = copy.deepcopy(
        doc["spec"]["tfReplicaSpecs"]["Worker"]["template"])
    doc["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "main"
    with pytest.raises(specs.SpecError, match="Worker's pod has no container named "
                                              "'tensorflow'"):
        _spec("tfjob", doc)
    with pytest.raises(specs.SpecError, match="kind 'Deployment' is none of"):
        specs.read({"kind": "Deployment"}, "x.yaml")


# -- exit statuses --------------------------------------------------------------------------


@pytest.mark.parametrize("platform", SPECS)
def test_each_exit_code_lands_in_its_class_on_each_platform(platform):
    spec = _spec(platform)
    for status in [*exit_codes.MEANINGS, SIGKILLED]:
        intended = (specs.DONE if status == exit_codes.DONE else
                    specs.RESTART if exit_codes.retryable(status) else specs.FAIL)
        if platform == "vertex" and intended == specs.FAIL:
            # Vertex restarts a replica whatever its non-zero status (docs/clusters.md).
            intended = specs.RESTART
        for task_type in spec.replicas:
            assert specs.outcome(spec, status, task_type) == intended, (status, task_type)


def test_without_the_rules_a_jobset_would_restart_a_permanent_failure():
    """The port reads the rules: without the podFailurePolicy, 1 restarts the JobSet."""
    doc = _doc("jobset")
    del doc["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]
    assert specs.outcome(_spec("jobset", doc), exit_codes.FAILED) == specs.RESTART
    doc = _doc("tfjob")
    doc["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"] = "Never"
    assert specs.outcome(_spec("tfjob", doc), exit_codes.RESTART) == specs.FAIL


# -- the rehearsal's environments ------------------------------------------------------------


@pytest.mark.parametrize("platform, replicas", [
    ("tfjob", {"worker": 1}), ("jobset", {"worker": 2}), ("vertex", {"worker": 1})])
def test_the_rehearsal_gives_each_task_its_pods_variables_on_loopback(
        tmp_path, platform, replicas):
    spec = _spec(platform)
    config, environments = rehearsal.prepare(
        spec, python="/usr/bin/python3", bin_dir=str(REPO / "bin"),
        model_dir=str(tmp_path / "run"), replicas=replicas, extra_args=["--train_steps=7"])
    assert config.command[1:3] == (str(REPO / "bin" / "train"), "--strategy=multi_worker")
    assert config.command[-2:] == (f"--model_dir={tmp_path / 'run'}", "--train_steps=7")
    assert not any(w.startswith("--model_dir=") and "run" not in w for w in config.command)
    assert config.max_restarts == spec.max_restarts and config.peer_exit_wait_s > 0
    tasks = config.tasks
    assert [t.label for t in tasks] == [p.label for p in specs.pods(spec.with_replicas(replicas))]
    cluster = {job: [f"localhost:{1000 + 10 * n + i}" for i in range(count)]
               for n, (job, count) in enumerate(
                   (t, sum(1 for x in tasks if x.task_type == t)) for t in ("chief", "worker"))
               if count}
    envs = environments(tasks, cluster)
    for task in tasks:
        # What the platform does not set is unset (None), not inherited from the shell.
        assert set(rehearsal.PLATFORM_VARIABLES) <= set(envs[task.label])
        env = {name: value for name, value in envs[task.label].items() if value is not None}
        resolution = tf_config.resolve(env, lookup=_no_lookup)
        assert resolution.role.name == task.name
        addresses = [a for found in resolution.role.cluster.values() for a in found]
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses)
        assert resolution.source == {"tfjob": "tf_config", "jobset": "tf_config",
                                     "vertex": "vertex"}[platform]
        if platform == "jobset":
            assert env["TFLOOP_NUM_WORKERS"] == "2" and env["JOB_COMPLETION_INDEX"] == str(
                task.task_index)
        if platform == "vertex":
            assert "TF_CONFIG" not in env
            assert env["AIP_CHECKPOINT_DIR"] == f"{tmp_path / 'run'}/"
            assert all(env[k].startswith(str(tmp_path)) for k in env if k.startswith("AIP_"))


def test_a_bad_spec_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: TFJob\nspec: {tfReplicaSpecs: {Worker: {replicas: 2, template: "
                   "{spec: {containers: [{name: main}]}}}}}\n")
    result = run_bin("launch", f"--spec={bad}", timeout=60)
    assert result.returncode == exit_codes.USAGE
    assert_one_line_error(result, contains="Worker's pod has no container named 'tensorflow'")
    result = run_bin("launch", f"--spec={tmp_path / 'missing.yaml'}", timeout=60)
    assert result.returncode == exit_codes.USAGE
    assert_one_line_error(result, contains="cannot read --spec=")


# -- issue 29 item 14 -------------------------------------------------------------------------

@pytest.mark.parametrize("platform, change, says", [
    ("tfjob", lambda d: d["spec"]["tfReplicaSpecs"]["Chief"].update(replicas=2),
     "Chief.replicas is 2; a cluster has at most one chief"),
    ("tfjob", lambda d: d["spec"]["tfReplicaSpecs"].update(
        Master=copy.deepcopy(d["spec"]["tfReplicaSpecs"]["Chief"])),
     "tfReplicaSpecs has both Chief and Master"),
    ("tfjob", lambda d: d["spec"]["tfReplicaSpecs"]["Evaluator"].update(replicas=2),
     "Evaluator.replicas is 2; a cluster has at most one evaluator"),
    ("tfjob", lambda d: d["metadata"].update(name="/tmp/elsewhere"),
     "metadata.name '/tmp/elsewhere' is not a TFJob name"),
    ("tfjob", lambda d: d["metadata"].update(name="../../escape"),
     "metadata.name '../../escape' is not a TFJob name"),
    ("tfjob", lambda d: d["metadata"].update(name="x" * 64), "is not a TFJob name"),
    ("tfjob", lambda d: d["metadata"].update(name=7), "metadata.name 7 is not a TFJob name"),
    ("jobset", lambda d: d["metadata"].update(name="/abs"),
     "metadata.name '/abs' is not a JobSet name"),
    ("vertex", lambda d: d.update(displayName="../../escape"),
     "displayName '../../escape' cannot name the rehearsal's folder"),
    ("vertex", lambda d: d.update(displayName=".."), "displayName '..' cannot name"),
], ids=["two_chiefs", "chief_and_master", "two_evaluators", "absolute_name", "escaping_name",
        "long_name", "number_name", "jobset_absolute", "vertex_escaping", "vertex_dotdot"])
def test_more_spec_mistakes_are_one_line(platform, change, says):
    """Two chiefs gave a traceback; an absolute or `../` metadata.name moved
    the rehearsal's folder out of runs/rehearsal/."""
    doc = _doc(platform)
    change(doc)
    with pytest.raises(specs.SpecError) as error:
        _spec(platform, doc)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_the_specs_names_still_pass():
    assert [_spec(platform).name for platform in SPECS] == [
        _doc("tfjob")["metadata"]["name"], _doc("jobset")["metadata"]["name"],
        "vertex_customjob"]  # no displayName: the file's name


def test_a_spec_that_is_not_utf8_is_one_line(tmp_path):
    """A traceback (UnicodeDecodeError) before."""
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("kind: TFJob\nmetadata: {name: caf\u00e9}\n".encode("latin-1"))
    result = run_bin("launch", f"--spec={bad}", timeout=60)
    assert result.returncode == exit_codes.USAGE
    assert_one_line_error(result, contains=f"--spec={bad} is not UTF-8 text (byte 0xe9 at offset")


@pytest.mark.parametrize("flag", ["--local_model_dir=~/rehearsal", "--local_model_dir=a\nb",
                                  "--diagnostics_dir= "])
def test_bin_launchs_own_folders_get_the_one_path_check(flag):
    """Issue 29 item 16: the check every path input gets (config.check_path_text)."""
    result = run_bin("launch", flag, f"--spec={REPO / SPECS['tfjob']}", timeout=60)
    assert result.returncode == exit_codes.USAGE
    assert_one_line_error(result, contains=flag.split("=")[0] + "=")


# -- the tf.data service pool (deploy/data_service.yaml) ---------------------------------------


def _pool():
    docs = list(yaml.safe_load_all((REPO / "deploy/data_service.yaml").read_text()))
    service = next(d for d in docs if d["kind"] == "Service")
    sets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    return service, sets


def _args(statefulset):
    container, = statefulset["spec"]["template"]["spec"]["containers"]
    flags = dict(arg[2:].split("=", 1) for arg in container["args"])
    return container, flags


def test_the_data_service_pool_and_the_trainers_address_agree():
    """The dispatcher's stable DNS name and port are what the workers and the
    trainers (the line the TFJob and JobSet carry) dial; every server's port
    is its container's and the headless Service's; the journal is a volume."""
    from tfloop.launch import data_service

    service, sets = _pool()
    assert service["spec"]["clusterIP"] == "None"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    dispatcher, workers = sets["tfloop-data-dispatcher"], sets["tfloop-data-worker"]
    for statefulset in (dispatcher, workers):
        assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
        labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
    assert dispatcher["spec"]["replicas"] == 1 and workers["spec"]["replicas"] >= 2
    container, flags = _args(dispatcher)
    assert container["command"][-1] == "tfloop-data-service"
    assert flags["role"] == "dispatcher"
    assert int(flags["port"]) == ports["dispatcher"] == container["ports"][0]["containerPort"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert flags["work_dir"] in mounts
    stable = f"tfloop-data-dispatcher-0.{service['metadata']['name']}:{ports['dispatcher']}"
    container, flags = _args(workers)
    assert flags["role"] == "worker" and flags["dispatcher"] == stable
    assert int(flags["port"]) == ports["worker"] == container["ports"][0]["containerPort"]
    assert flags["worker_address"] == \
        f"$(POD_NAME).{service['metadata']['name']}:{ports['worker']}"
    assert any(e["name"] == "POD_NAME" for e in container["env"])
    for platform in ("tfjob", "jobset"):
        text = (REPO / SPECS[platform]).read_text()
        lines = [line.split("- ", 1)[1] for line in text.splitlines()
                 if "--data_service=" in line]
        assert lines == [f"--data_service=grpc://{stable}"], platform
        assert data_service.address_error(lines[0].split("=", 1)[1]) is None
