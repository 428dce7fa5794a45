"""`metrics.json`: what a run did, for scripts and people, however it ended.

The chief writes it once, at the end of `engine.run.run` (finished,
interrupted, or failed), atomically: a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional


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
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(temporary, path)
