"""`metrics.json`: what a run did, for scripts and people, however it ended.

The chief writes it when training starts and after every checkpoint with
`"status": "running"` and `step` the step of the last checkpoint, and at the
end with how the run ended (`finished`, `stopped_early`, `interrupted`: a
signal, `failed`: an error; with `--export`, `finished` only once the export
is written, and `export` its path), atomically (`run_dir.layout.write_json`): a reader never sees half a file. So
after a kill -9 it still tells the truth: `running` (no process left to say
otherwise), `interrupted` true, and no step beyond the checkpoint a resume
starts from.
Evaluations made afterwards (`--mode=evaluate`, the evaluator task) are
appended to `evaluations.json` beside it, so they never erase the training
record: `{"evaluations": [{"step": ..., "by": ..., "eval/loss": ...}, ...]}`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Optional

from tfloop.engine.run_dir import layout
from tfloop.engine.runtime import hardware


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the loops did, as the Controller tells it (`Controller.outcome`):
    the record's only view of the loop, so this module reaches into no
    controller or trainer.

    Attributes:
      step: the global step reached.
      steps_per_second: training speed over the timed loops (0: none timed).
      stopped_early: why training stopped early, or None.
      train_metrics, eval_metrics: the last train loop's and evaluation's metrics.
      flops_per_step: FLOPs of one step as the trainer's clock counted them (None: not counted).
      peak: the devices' peak rate `mfu` is measured against (None: unknown).
      devices: this process's replicas' devices (whose GPU memory peak is reported).
    """

    step: int
    steps_per_second: float = 0.0
    stopped_early: Optional[str] = None
    train_metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    eval_metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    flops_per_step: Optional[float] = None
    peak: Optional[hardware.Peak] = None
    devices: tuple[str, ...] = ()


def running(plan: Any, *, start_step: int, restored: Optional[str], step: int,
            checkpoint: Optional[str]) -> dict:
    """The record while the run trains: `step` is that of the last
    checkpoint (`checkpoint`), what a resume would start from."""
    return {
        "status": "running",
        "step": step,
        "checkpoint": checkpoint,
        "start_step": start_step,
        "resumed_from": restored,
        "mode": plan.mode,
        "interrupted": True,  # until the run says how it ended
        "stopped_early": None,
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "config": plan.config.as_dict(),
    }


def summarize(plan: Any, outcome: Outcome, *, num_replicas: int, restored: Optional[str],
              start_step: int, status: str, saved_step: int, checkpoint: Optional[str],
              wall_seconds: float, best: Optional[dict] = None,
              export: Optional[str] = None) -> dict:
    """The run's record: how it ended (`status`), steps, throughput, final
    metrics (`train/...`, `eval/...`), the best checkpoint (`best`:
    model_dir/best/best.json's metric, mode, value, step, checkpoint, export;
    None without one), why training stopped early (`stopped_early`, None when
    it did not) and the whole config.

    `step` is the step the run's weights are saved at: the step reached when
    it finished (or stopped on a signal, which saves), else `saved_step`, the
    last checkpoint's; `unsaved_step` then says how far training got.
    `export` (a training run's record only) is the path of the export the
    run wrote at its end, or None: none was asked for (or this process is not
    the chief), or it was not written, and then `status` is not `finished`:
    a run is finished once its export is written too."""
    reached = outcome.step
    summary = {
        "status": status,
        "step": reached if status in ("finished", "stopped_early") else saved_step,
        "checkpoint": checkpoint,
        "start_step": start_step,
        "resumed_from": restored,
        "mode": plan.mode,
        "interrupted": status not in ("finished", "stopped_early"),
        "examples_per_second": round(
            outcome.steps_per_second * plan.config.global_batch_size, 1),
        "num_replicas": num_replicas,
        "collective": plan.collective.describe(),
        # Which weights the evaluations and the export hold (--ema_decay).
        "evaluated_weights": "moving_average" if plan.config.ema_decay else "trained",
        "wall_seconds": round(wall_seconds, 2),
        "best": dict(best) if best else None,
        "stopped_early": outcome.stopped_early,
        "config": plan.config.as_dict(),
    }
    if plan.mode != "evaluate":
        summary["export"] = export
    if summary["step"] != reached:
        summary["unsaved_step"] = reached
    summary.update(utilization(outcome))
    summary.update({f"train/{k}": v for k, v in outcome.train_metrics.items()})
    summary.update({f"eval/{k}": v for k, v in outcome.eval_metrics.items()})
    return summary


def utilization(outcome: Outcome) -> dict:
    """How close the run came to its hardware: `mfu` over the timed loops
    (each `train` call's first excluded, as `examples_per_second`; a run of one
    loop has none), the step's FLOPs and the peak it is measured against
    (`engine.observe.step_flops`, `engine.runtime.hardware`), when the
    trainer's clock counted them; and `peak_memory` (host RSS, GPU allocation) always."""
    record: dict = {"peak_memory": hardware.peak_memory(outcome.devices)}
    rate, flops, peak = outcome.steps_per_second, outcome.flops_per_step, outcome.peak
    if flops and rate and peak is not None:
        record.update(mfu=round(flops * rate / peak.flops_per_second, 4), flops_per_step=flops,
                      peak_flops_per_second=peak.flops_per_second, peak_source=peak.source)
    return record


def add_evaluation(path: str, *, step: int, by: str, metrics: dict) -> None:
    """Appends one evaluation's results to `evaluations.json`."""
    record = layout.read_json(path) or {"evaluations": []}
    record["evaluations"].append({
        "step": step, "by": by, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **{f"eval/{k}": v for k, v in metrics.items()}})
    layout.write_json(path, record)
