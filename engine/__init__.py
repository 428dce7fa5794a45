"""An Orbit-style custom-training-loop engine on `tf.distribute`.

    Controller   the outer loop: loops of steps, checkpoints, evaluations, actions
    Trainer      the replicated train step and its compiled tf.while_loop
    Evaluator    distributed evaluation, every example counted once
    LossOutput   what a user's loss function returns (per-example values)
    RunConfig    one run's typed, validated configuration
    engine.run.run(config, loss_fn=..., model_fn=...)   the whole run, as bin/train does it

Names resolve lazily so that importing one module (`engine.cli`, `engine.errors`
in the binaries) does not pull in every other module of the package.
"""

import importlib

_EXPORTS = {
    "Controller": "engine.controller",
    "Trainer": "engine.trainer",
    "Evaluator": "engine.evaluator",
    "LossOutput": "engine.losses",
    "RunConfig": "engine.config",
    "ConfigError": "engine.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
