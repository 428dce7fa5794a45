"""`metrics.json`: what a run did, for scripts and people, however it ended.

The chief writes it once, at the end of `engine.run.run` (finished,
interrupted, or failed), atomically: a reader never sees half a file.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import tensorflow as tf


def summarize(plan: Any, controller: Any, *, num_replicas: int, restored: Optional[str],
              start_step: int, interrupted: bool, wall_seconds: float) -> dict:
    """The run's record: steps, throughput, final metrics (`train/...`,
    `eval/...`) and the whole config."""
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
        "wall_seconds": round(wall_seconds, 2),
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
