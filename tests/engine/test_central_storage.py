"""central_storage: variables on one device, compute on four, same weights as one device.

Reuses the N-replicas-equal-one-device harness of test_distributed_equivalence
with `CentralStorageStrategy` in place of `MirroredStrategy`.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

from tfloop import models
from tfloop.engine import strategies
from tfloop.launch import tf_config
from tfloop.engine.errors import ConfigError
from test_distributed_equivalence import max_relative_difference, train_weights


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
    workers = tf_config.parse(json.dumps({"cluster": {"chief": ["h:1"], "worker": ["h:2", "h:3"],
                                                    "ps": ["h:4"]}, "task": {"type": "chief"}}))
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
