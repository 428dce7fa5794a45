"""A `--collective=module:Class` plug-in is checked, not trusted: its results'
structure while the step is traced, its constructor and check_devices, and
with `--check_collective=N` its sums against the plain sum of the replicas."""

import os

import numpy as np
import pytest
import tensorflow as tf

from helpers import replica_values, run_bin
from tfloop import collectives
from tfloop.collectives import checked
from tfloop.engine.config import RunConfig
from tfloop.engine.assembly.run import run

HERE = os.path.dirname(os.path.abspath(__file__))
FAULTY = "faulty_collective_plugins"


@pytest.fixture
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(HERE)


@pytest.fixture
def two_replicas(cpu_devices):
    """A strategy over two logical CPUs, per-replica values (replica r holds
    r + 1 and 10 (r + 1)) and mirrored variables named kernel and bias."""
    devices = cpu_devices[:2]
    strategy = tf.distribute.MirroredStrategy(devices)

    values = replica_values(strategy)
    with strategy.scope():
        variables = [tf.Variable(tf.zeros([3, 2]), name="kernel"),
                     tf.Variable(tf.zeros([5]), name="bias")]
    return devices, strategy, values, variables


def traced_all_reduce(collective, strategy, values, variables):
    """The all-reduce as the trainer calls it: traced inside a tf.function."""
    with strategy.scope():
        return tf.function(lambda: collective.batch_all_reduce(values, variables))()


@pytest.mark.parametrize("cls, says", [
    ("DropsLast", "returned 1 result(s) for 2 value(s); batch_all_reduce must return, in "
                  "order, each value's sum mirrored onto its replicas"),
    ("Transposes", "result 0 (the gradient of kernel:0, shape (3, 2) float32) comes back "
                   "with shape (2, 3)"),
    ("LeavesPerReplica", "result 0 (the gradient of kernel:0, shape (3, 2) float32) is "
                         "PerReplica, values left unreduced per replica"),
    ("ReturnsNone", "result 1 (the gradient of bias:0, shape (5) float32) is None"),
    ("OneTensor", "is one tensor, not one copy per replica (2); build it with "
                  "collectives.mirrored(...)"),
    ("Float16", "result 0 (the gradient of kernel:0, shape (3, 2) float32) comes back as "
                "float16"),
    ("BrokenSum", "its batch_all_reduce raised AttributeError: 'PerReplica' object has no "
                  "attribute 'no_such_attribute'"),
])
def test_a_result_of_the_wrong_structure_is_one_line_naming_the_first_wrong_tensor(
        plugin_path, two_replicas, cls, says):
    devices, strategy, values, variables = two_replicas
    collective = collectives.create(f"{FAULTY}:{cls}", devices=devices)
    with pytest.raises(collectives.CollectiveError) as raised:
        traced_all_reduce(collective, strategy, values, variables)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"--collective={FAULTY}:{cls}")
    assert says in message


@pytest.mark.parametrize("cls, says", [
    ("BrokenConstructor", f"--collective='{FAULTY}:BrokenConstructor' cannot be constructed: "
                          "its constructor raised RuntimeError: cannot reach the interconnect"),
    ("BrokenCheckDevices", f"--collective={FAULTY}:BrokenCheckDevices: its check_devices"
                           "(['/cpu:0', '/cpu:1']) raised KeyError: 'rdma0'"),
    ("RefusesDevices", f"--collective={FAULTY}:RefusesDevices: needs GPUs"),
])
def test_a_plugin_that_raises_while_built_is_one_line_naming_it(plugin_path, cls, says):
    with pytest.raises(collectives.CollectiveError) as raised:
        collectives.create(f"{FAULTY}:{cls}", devices=["/cpu:0", "/cpu:1"])
    assert "\n" not in str(raised.value)
    assert says in str(raised.value)


def test_a_plugin_whose_dtype_check_raises_is_one_line_naming_it(plugin_path):
    with pytest.raises(collectives.CollectiveError) as raised:
        collectives.create(f"{FAULTY}:BrokenDtypeCheck", devices=["/cpu:0", "/cpu:1"],
                           gradient_dtype="bfloat16")
    assert "\n" not in str(raised.value)
    assert (f"--collective={FAULTY}:BrokenDtypeCheck: its check_gradient_dtype('bfloat16') "
            "raised AttributeError: no 'supported_dtypes' here") in str(raised.value)


def test_a_checked_plugin_describes_itself_as_the_plugin(plugin_path):
    collective = collectives.create("my_collective_plugin:AllToAllSum",
                                    devices=["/cpu:0", "/cpu:1"])
    assert isinstance(collective, collectives.Checked)
    assert type(collective.inner).__name__ == "AllToAllSum"
    assert collective.describe() == collective.name == "my_collective_plugin:AllToAllSum"


@pytest.mark.parametrize("cls", ["Averages", "OwnReplicaOnly"])
def test_check_steps_catches_a_wrong_sum_of_the_right_shape(plugin_path, two_replicas, cls):
    devices, strategy, values, variables = two_replicas
    silent = collectives.create(f"{FAULTY}:{cls}", devices=devices)
    traced_all_reduce(silent, strategy, values, variables)  # passes the structural check

    collective = collectives.create(f"{FAULTY}:{cls}", devices=devices, check_steps=3)
    with pytest.raises(tf.errors.InvalidArgumentError):
        traced_all_reduce(collective, strategy, values, variables)
    mismatch = checked.mismatch(collective)
    assert isinstance(mismatch, collectives.CollectiveError)
    message = str(mismatch)
    assert "\n" not in message
    # kernel: replicas hold 1 and 2; the mean (1.5) or replica 0's own (1) is off by 1.5 / 2.
    difference = "1.5" if cls == "Averages" else "2"
    assert message.startswith(
        f"--collective={FAULTY}:{cls}: its sum of the gradient of kernel:0, shape (3, 2) "
        f"float32 differs from the plain sum of the replicas by up to {difference} (max abs) "
        "at all-reduce 1 of the 3 --check_collective compares")


@pytest.mark.parametrize("name", ["my_collective_plugin:TemplateAllToAllSum", "ring"])
def test_check_steps_passes_a_right_sum_and_stops_comparing_after_n(
        plugin_path, two_replicas, name):
    devices, strategy, values, variables = two_replicas
    collective = collectives.create(name, devices=devices, check_steps=2)
    assert isinstance(checked.find(collective), collectives.Checked)
    with strategy.scope():
        loop = tf.function(lambda: collective.batch_all_reduce(values, variables))
        for _ in range(4):
            reduced = loop()
    for result, want in zip(reduced, (3.0, 30.0)):
        for part in collectives.components(result):
            np.testing.assert_allclose(part.numpy(), want)
    assert checked.mismatch(collective) is None
    assert int(checked.find(collective)._calls.numpy()) == 4
    # Past the first 2 all-reduces nothing is compared: a wrong sum now goes through.
    import faulty_collective_plugins
    checked.find(collective).inner = faulty_collective_plugins.Averages()
    with strategy.scope():
        reduced = tf.function(lambda: collective.batch_all_reduce(values, variables))()
    for result, want in zip(reduced, (1.5, 15.0)):  # the mean, unnoticed
        for part in collectives.components(result):
            np.testing.assert_allclose(part.numpy(), want)
    assert checked.mismatch(collective) is None


def test_check_steps_refuses_a_strategys_own_all_reduce():
    with pytest.raises(collectives.CollectiveError,
                       match="sums across machines too; drop --check_collective"):
        collectives.create("strategy", devices=["/cpu:0"], check_steps=3)


def _config(tmp_path, collective, **options):
    return RunConfig(strategy="mirrored", devices="cpu:0,cpu:1", global_batch_size=32,
                     train_steps=4, steps_per_loop=2, collective=collective, export=False,
                     model_dir=str(tmp_path / "run"), mode="train", **options)


def test_a_run_refuses_a_plugin_of_the_wrong_shape_before_writing(plugin_path, tmp_path):
    with pytest.raises(collectives.CollectiveError) as raised:
        run(_config(tmp_path, f"{FAULTY}:Transposes"))
    assert "\n" not in str(raised.value)
    assert "comes back with shape (" in str(raised.value)
    assert not (tmp_path / "run").exists()


def test_check_collective_stops_a_run_whose_plugin_averages(plugin_path, tmp_path):
    with pytest.raises(collectives.CollectiveError) as raised:
        run(_config(tmp_path, f"{FAULTY}:Averages", check_collective=3))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"--collective={FAULTY}:Averages: its sum of the gradient of ")
    assert "at all-reduce 1 of the 3 --check_collective compares" in message
    assert tf.train.latest_checkpoint(str(tmp_path / "run")) is None


def test_bin_train_check_collective_is_one_line_and_exit_2(tmp_path):
    model_dir = tmp_path / "run"
    env = {"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    result = run_bin("train", "--devices=cpu:0,cpu:1", "--global_batch_size=32",
                     "--train_steps=4", "--steps_per_loop=2", "--mode=train", "--noexport",
                     f"--collective={FAULTY}:Averages", "--check_collective=3",
                     f"--model_dir={model_dir}", env=env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"train: error: --collective={FAULTY}:Averages: its sum of ")
    assert not list(model_dir.glob("ckpt-*"))
