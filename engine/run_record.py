"""`metrics.json`: what a run did, for scripts and people, however it ended.

The chief writes it once, at the end of `engine.run.run` (finished,
interrupted, or failed), atomically: a reader never sees half a file.
Evaluations made afterwards (`--mode=evaluate`, the evaluator task) are
appended to `evaluations.json` beside it, so they never erase the training
record: `{"evaluations": [{"step": ..., "by": ..., "eval/loss": ...}, ...]}`.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import tensorflow as tf

from tfloop.engine.errors import ConfigError


def summarize(plan: Any, controller: Any, *, num_replicas: int, restored: Optional[str],
              start_step: int, interrupted: bool, wall_seconds: float,
              best: Optional[dict] = None) -> dict:
    """The run's record: steps, throughput, final metrics (`train/...`,
    `eval/...`), the best checkpoint (`best`: model_dir/best/best.json's
    metric, mode, value, step, checkpoint, export; None without one), why
    training stopped early (`stopped_early`, None when it did not) and the
    whole config."""
    summary = {
        "step": controller.step,
        "start_step": start_step,
        "resumed_from": restored,
        "mode": plan.mode,
        "interrupted": interrupted,
        "examples_per_second": round(
            controller.steps_per_second * plan.config.global_batch_size, 1),
        "num_replicas": num_replicas,
        "collective": plan.collective.describe(),
        # Which weights the evaluations and the export hold (--ema_decay).
        "evaluated_weights": "moving_average" if plan.config.ema_decay else "trained",
        "wall_seconds": round(wall_seconds, 2),
        "best": dict(best) if best else None,
        "stopped_early": getattr(controller, "stopped_early", None),
        "config": plan.config.as_dict(),
    }
    summary.update({f"train/{k}": v for k, v in controller.last_train_metrics.items()})
    summary.update({f"eval/{k}": v for k, v in controller.last_eval_metrics.items()})
    return summary


def write(path: str, payload: dict) -> None:
    """Through `tf.io.gfile`, so `model_dir` may be on any TF filesystem (gs://, ...)."""
    temporary = path + ".tmp"
    with tf.io.gfile.GFile(temporary, "w") as f:
        f.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    tf.io.gfile.rename(temporary, path, overwrite=True)


def read(path: str) -> Optional[dict]:
    """A JSON file `write` wrote (through `tf.io.gfile`), or None when there is none.

    Raises:
      ConfigError: the file is there but is not a JSON object (damaged, or
        edited by hand): one line naming it, rather than a decoder traceback.
    """
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:
        content = f.read()
    try:
        record = json.loads(content)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        record = error
    if not isinstance(record, dict):
        reason = str(record) if isinstance(record, ValueError) else "not a JSON object"
        raise ConfigError(f"{path} cannot be read ({reason[:120]}); restore it, or move it "
                          "away to start that record afresh")
    return record


def add_evaluation(path: str, *, step: int, by: str, metrics: dict) -> None:
    """Appends one evaluation's results to `evaluations.json`."""
    record = read(path) or {"evaluations": []}
    record["evaluations"].append({
        "step": step, "by": by, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **{f"eval/{k}": v for k, v in metrics.items()}})
    write(path, record)
