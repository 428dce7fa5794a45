"""An Orbit-style custom-training-loop engine on `tf.distribute`: the public face.

What a user's script imports::

    from tfloop.engine import RunConfig, Task, LossOutput, run

    run(config, task=None, optimizer=None, on_loop_end=None, verbose=False) -> RunResult
                 the whole run, as bin/train does it (train, evaluate, export)
    fit(model_fn, train_data, epochs=, callbacks=, config=) -> keras History
                 a compiled Keras model and its callbacks, as model.fit (docs/keras.md)
    RunConfig    one run's typed, validated configuration (the flags of bin/train)
    Task         the user's plug-in: model(s), datasets, per-example loss
    Objective    one loss + optimizer of a task with several (a GAN's two)
    LossOutput   what a task's loss returns (per-example values and metrics)
    ClassificationTask  the built-in --model/--dataset task
    RunResult    metrics.json's record, with the trained `model` and the `task`
    export_checkpoint   a kept checkpoint as a SavedModel (bin/export)
    ConfigError, RunFailure, StopTraining   the errors a caller handles

and, for full control, the pieces `run` assembles: `Controller` (the outer
loop), `Trainer` (the replicated step in a compiled tf.while_loop),
`Evaluator`. Everything else lives in the rooms below (`runtime`, `recipe`,
`run_dir`, `loop`, `strategies`) and may change without notice.

Names resolve lazily so that importing one module (`tfloop.engine.config` in
the binaries, before TensorFlow loads) does not pull in every other module.
"""

import importlib
import sys
import types

_EXPORTS = {
    "run": "tfloop.engine.assembly.run",
    "fit": "tfloop.engine.keras_fit.fit",
    "RunResult": "tfloop.engine.assembly.run",
    "export_checkpoint": "tfloop.engine.assembly.run",
    "RunConfig": "tfloop.engine.config",
    "Task": "tfloop.engine.task",
    "Objective": "tfloop.engine.task",
    "ClassificationTask": "tfloop.engine.task",
    "LossOutput": "tfloop.engine.task.losses",
    "ConfigError": "tfloop.engine.errors",
    "RunFailure": "tfloop.engine.errors",
    "StopTraining": "tfloop.engine.loop.actions",
    "Controller": "tfloop.engine.loop.controller",
    "Trainer": "tfloop.engine.loop.trainer",
    "Evaluator": "tfloop.engine.loop.evaluator",
}

__all__ = sorted(_EXPORTS)


class _PublicFace(types.ModuleType):
    """Keeps the public names the objects above when a submodule of the same
    name is imported: `import tfloop.engine.assembly.run` would otherwise rebind
    `tfloop.engine.assembly.run` to the module, and `from tfloop.engine import run`
    would hand a user the module instead of the function."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return  # the module stays in sys.modules under its full name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _PublicFace


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tfloop.engine' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
