"""A run's servable model: `model_dir/export/<step>/`, at the end of training or on demand.

`engine.run_dir.export` writes a model; this module decides *what* a task exports:
its `serve(model, features)` on its `serving_spec` (by default the features
of a train batch, any batch size). `run()` exports when training finishes;
`bin/export` exports any checkpoint of a finished or running run::

    bin/export --model_dir=runs/mlp [--step=400]

The task, model and data flags come from `model_dir/run.json`, so the model is
rebuilt as it was trained; the checkpoint's optimizer state is not read.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import tensorflow as tf

from tfloop.engine.run_dir import checkpoint_files, export, layout
from tfloop.engine.loop import task_inputs
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.plan import Plan

logger = logging.getLogger(__name__)


def export_trained(plan: Plan, strategy: tf.distribute.Strategy, model: Any,
                   step: int, *, directory: Optional[str] = None) -> Optional[str]:
    """Exports `model` at `step` for `plan.task` into `<directory>/export/<step>/`
    (`directory`: `model_dir`, or `model_dir/best` for the best checkpoint's
    export); returns the path (None off the chief; the evaluator task writes
    the exports it keeps)."""
    task = plan.task
    context = task_inputs.context_for(plan.inputs)
    element_spec = task_inputs.train_dataset(task, context).element_spec
    with strategy.scope():
        return export.export_model(
            model, serving_fn=task.serve, input_signature=task.serving_spec(element_spec),
            directory=directory or plan.config.model_dir, step=step,
            is_chief=plan.role.is_chief or plan.role.is_evaluator, worker_name=plan.role.name)


def checkpoint_at(model_dir: str, step: Optional[int]) -> str:
    """The checkpoint of `step` in `model_dir` (the newest that reads when
    None, `engine.run_dir.checkpoint_files.survey`); only reads.

    Raises:
      ConfigError: `model_dir` has no checkpoint, none that reads, or none of
        that step, or that one is damaged.
    """
    found = checkpoint_files.survey(model_dir)
    if found.newest is None:
        raise ConfigError(f"--model_dir={model_dir} has no checkpoint to export; train first "
                          "or point --model_dir at a trained run")
    if step is None:
        skipped = found.skip_line("exporting")
        if skipped:
            logger.info(skipped)
        return found.newest
    steps = sorted(checkpoint_files.on_disk(model_dir))  # found.kept is a part of them
    if step not in steps:
        kept = ", ".join(str(s) for s in steps)
        raise ConfigError(f"--step={step}: --model_dir={model_dir} keeps checkpoints of steps "
                          f"{kept}; export one of those")
    path = layout.RunDir(model_dir).checkpoint(step)
    reason = checkpoint_files.damage(path)
    if reason:
        raise ConfigError(f"--step={step}: ckpt-{step} in --model_dir={model_dir} is damaged "
                          f"({reason}); export another step")
    return path
