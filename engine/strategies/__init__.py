"""`tf.distribute` strategies by name: one `StrategySpec` per `--strategy`.

Every check a spec makes runs before the strategy exists, so a wrong name or
layout costs one line on stderr and no TensorFlow state.
"""

from tfloop.engine.strategies.registry import available, get, register
from tfloop.engine.strategies.spec import NO_CLUSTER, ReducesItself, StrategySpec, TrainerPlan

# Importing the implementations registers them.
from tfloop.engine.strategies import local as _local  # noqa: F401,E402
from tfloop.engine.strategies import multi_worker as _multi_worker  # noqa: F401,E402
from tfloop.engine.strategies import parameter_server as _parameter_server  # noqa: F401,E402
from tfloop.engine.strategies import tpu as _tpu  # noqa: F401,E402

__all__ = ["NO_CLUSTER", "ReducesItself", "StrategySpec", "TrainerPlan", "available", "get",
           "register"]
