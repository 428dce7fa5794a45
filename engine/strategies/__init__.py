"""`tf.distribute` strategies by name: one `StrategySpec` per `--strategy`.

Every check a spec makes runs before the strategy exists, so a wrong name or
layout costs one line on stderr and no TensorFlow state.

The names below load on first use (`strategies.get`), with every strategy
registered, not on `import`: the room's settings (`strategies.settings`, read
by bin/train before TensorFlow loads) import this package without TensorFlow.
"""

import importlib

_EXPORTS = {
    "available": "tfloop.engine.strategies.registry",
    "get": "tfloop.engine.strategies.registry",
    "register": "tfloop.engine.strategies.registry",
    "NO_CLUSTER": "tfloop.engine.strategies.spec",
    "ReducesItself": "tfloop.engine.strategies.spec",
    "StrategySpec": "tfloop.engine.strategies.spec",
    "TrainerPlan": "tfloop.engine.strategies.spec",
    "SpecSections": "tfloop.engine.strategies.spec",
}
#: Importing the implementations registers them.
_IMPLEMENTATIONS = ("local", "multi_worker", "parameter_server", "tpu")

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for implementation in _IMPLEMENTATIONS:
        importlib.import_module(f"{__name__}.{implementation}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
