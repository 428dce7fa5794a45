"""The engine: an Orbit-style custom-training-loop engine on `tf.distribute`.

The public face is `tfloop` (tfloop/__init__.py): a script imports from
there. `from tfloop.engine import run, RunConfig, ...` keeps working: those
names resolve through the same one table (`tfloop._EXPORTS`), so the two can
never list different things.

The rooms, each a package with one job (docs/engine.md: who may import whom;
tests/test_layers.py holds it):

    config.py, errors.py   the run's settings record, the errors a caller handles
    assembly/    the floor on top: the plan, the Runner, run() and export
    keras_fit/   Keras's front door: fit() over run(), Keras's callbacks
    loop/        the Controller, the trainers, the evaluator, actions
    observe/     the clock, summaries to TensorBoard, watchers
    recipe/      objectives, optimizers, schedules, precision, moving averages
    run_dir/     everything under --model_dir: checkpoints, run.json, export
    runtime/     the process: devices, threads, signals, hangs
    strategies/  tf.distribute strategies by name
    task/        the user's side: Task, losses, the built-in classification task

Everything in the rooms may change without notice; what a user may rely on
is the face.
"""

import tfloop as _face  # already imported: this package is tfloop's

__all__ = sorted(_face._EXPORTS)


def __getattr__(name):
    if name in _face._EXPORTS:
        return getattr(_face, name)
    raise AttributeError(f"module 'tfloop.engine' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_face._EXPORTS))
