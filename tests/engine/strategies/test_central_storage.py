"""central_storage: variables on one device, compute on four, same weights as one device.

Reuses the N-replicas-equal-one-device harness of tests/equivalence.py
with `CentralStorageStrategy` in place of `MirroredStrategy`.
"""

import json

import pytest
import tensorflow as tf

from tfloop import models
from tfloop.engine import strategies
from tfloop.launch import tf_config
from tfloop.engine.errors import ConfigError
from equivalence import train_weights
from tfloop.engine.runtime.devices import max_relative_difference


def _central_storage(devices):
    return strategies.get("central_storage").build(devices)


def test_variables_live_once_on_the_cpu(cpu_devices):
    strategy = _central_storage(cpu_devices)
    assert strategy.num_replicas_in_sync == 4
    with strategy.scope():
        net = models.build("mlp")
    for variable in net.trainable_variables:
        assert not isinstance(variable.value, tf.distribute.DistributedValues)
        assert variable.value.device.endswith("CPU:0")


@pytest.fixture(scope="module")
def one_device(cpu_devices):
    """(weights after training on one device, initial weights)."""
    return train_weights(cpu_devices[:1]), train_weights(cpu_devices[:1], steps=0)


# `strategy` is what --collective=auto means here (the strategy's own
# reduction onto the variables' device); ring stands for the explicit ones.
@pytest.mark.xdist_group("test_central_storage_one_device")  # one_device, trained once
@pytest.mark.compares  # four replicas trained against one device (tests/tiers.py)
@pytest.mark.parametrize("collective", ["strategy", "ring"])
def test_central_storage_matches_one_device(cpu_devices, one_device, collective):
    one, initial = one_device
    four = train_weights(cpu_devices, collective=collective, make_strategy=_central_storage)
    assert max_relative_difference(one, initial) > 1e-2  # training moved the weights
    assert max_relative_difference(one, four) < 1e-5


def test_collective_choice_for_strategies_that_reduce_themselves(cpu_devices):
    def name(strategy, collective, devices):
        return strategies.get(strategy).collective_name(collective, devices)

    assert name("central_storage", "auto", cpu_devices) == "strategy"
    assert name("central_storage", "ring", cpu_devices) == "ring"
    assert name("parameter_server", "auto", ["/cpu:0"]) == "strategy"
    assert name("tpu", "auto", ["/cpu:0"]) == "strategy"
    assert strategies.get("central_storage").num_replicas(cpu_devices) == 4
    workers = tf_config.parse(json.dumps({
        "cluster": {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]},
        "task": {"type": "chief", "index": 0}}))
    assert strategies.get("parameter_server").num_replicas(["/cpu:0"], role=workers) == 1
    assert strategies.get("tpu").num_replicas(["/cpu:0"], connection=(None, 8)) == 8


@pytest.mark.parametrize("strategy, kwargs, message", [
    ("central_storage", {"num_packs": 2}, "--num_packs=2 does not apply to --strategy=central"),
    ("central_storage", {"num_packs": 0, "gradient_dtype": "bfloat16"},
     "--gradient_dtype=bfloat16 does not apply"),
    ("parameter_server", {"num_packs": 0, "collective": "ring"},
     "--collective=ring does not apply to --strategy=parameter_server, whose workers"),
    ("parameter_server", {"num_packs": 0, "pack_bytes": 1024}, "--pack_bytes=1024 does not"),
    ("tpu", {"num_packs": 0, "collective": "nccl"}, "TPU interconnect"),
])
def test_collective_flags_that_do_not_apply_are_refused(cpu_devices, strategy, kwargs, message):
    collective = kwargs.pop("collective", "auto")
    with pytest.raises(ConfigError) as error:
        strategies.get(strategy).collective_name(collective, cpu_devices, **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_tf_reduces_nccl_and_hierarchical_copy_onto_one_device_for_one_destination():
    """Why central_storage refuses them: traced with GPU names, a sum whose
    destination is one variable on the CPU (central storage's layout) has no
    NcclAllReduce: TF swapped in a reduction onto that device (AddN)."""
    from tfloop import collectives
    from tfloop.collectives import _tf_private

    graph = tf.Graph()
    with graph.as_default():
        parts = []
        for i in range(2):
            with tf.device(f"/gpu:{i}"):
                parts.append(tf.ones([4]))
        value = _tf_private.per_replica(parts)
        with tf.device("/cpu:0"):
            variable = tf.Variable(tf.zeros([4]))
        for name in ("nccl", "hierarchical_copy"):
            collective = collectives.create(name, devices=["/gpu:0", "/gpu:1"])
            assert collective.needs_replica_destinations
            (summed,) = collective.batch_all_reduce([value], [variable])
            assert summed.device.endswith("CPU:0")
        ops = {op.type for op in graph.get_operations()}
    assert "NcclAllReduce" not in ops and "AddN" in ops


@pytest.mark.parametrize("collective", ["nccl", "hierarchical_copy"])
@pytest.mark.parametrize("devices", [["/gpu:0", "/gpu:1"], ["/cpu:0", "/cpu:1"]])
def test_central_storage_refuses_collectives_it_would_silently_replace(collective, devices):
    with pytest.raises(ConfigError) as error:
        strategies.get("central_storage").collective_name(collective, devices)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"--collective={collective} does not apply to "
                              "--strategy=central_storage")
    assert "silently reduce onto it" in message and "--collective=auto" in message
    assert strategies.get("central_storage").collective_name(
        "reduce_to_one_device", devices) == "reduce_to_one_device"


def test_bin_train_central_storage_trains_on_a_dataset(cpu_devices, tmp_path):
    """The README tour's line: the default task's `tf.data.Dataset` through
    `experimental_distribute_dataset` (TF's CentralStorageStrategy fails on any
    input options it is given: engine.loop.trainer gives it none)."""
    from tfloop.engine import RunConfig, run

    result = run(RunConfig(strategy="central_storage", devices=",".join(cpu_devices[:2]),
                           train_steps=2, steps_per_loop=1, model_dir=str(tmp_path)))
    assert result.model is not None and tf.train.latest_checkpoint(str(tmp_path))
