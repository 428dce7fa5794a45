"""The user's side of the engine: what to train and how a step's loss is said.

- `plugin`: `Task` (model, data, per-example loss), `Objective` (one loss with
  its own variables and optimizer: a GAN's two), `ClassificationTask` (the
  built-in --model/--dataset task), and `load` for `--task=module:Class`;
- `losses`: `LossOutput` and `Gradients`, what a loss function returns;
- `compiled_model`: a compiled Keras model as a kind of task (its loss and
  metrics as a `LossOutput`; `--task=module:function`);
- `failures`: a task's own mistakes in one line naming its method, and
  `exit_class`, where every failure of a run becomes its exit status;
- `settings`: `ModelAndData`, the flags that say what is trained on what.

The names below are the room's public face: `from tfloop.engine.task import Task`.
They load on first use, not on `import`: the room's settings (read by
bin/train before TensorFlow loads) import this package without TensorFlow.
"""

import importlib

_EXPORTS = {
    "Gradients": "tfloop.engine.task.losses",
    "LossFn": "tfloop.engine.task.losses",
    "LossOutput": "tfloop.engine.task.losses",
    "classification_loss": "tfloop.engine.task.losses",
    "ClassificationTask": "tfloop.engine.task.plugin",
    "Objective": "tfloop.engine.task.plugin",
    "Task": "tfloop.engine.task.plugin",
    "check_defines": "tfloop.engine.task.plugin",
    "load": "tfloop.engine.task.plugin",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
