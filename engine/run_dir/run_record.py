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

import time
from typing import Any, Optional

from tfloop.engine.run_dir import layout
from tfloop.engine.runtime import hardware



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


def summarize(plan: Any, controller: Any, *, num_replicas: int, restored: Optional[str],
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
    reached = controller.step
    summary = {
        "status": status,
        "step": reached if status in ("finished", "stopped_early") else saved_step,
        "checkpoint": checkpoint,
        "start_step": start_step,
        "resumed_from": restored,
        "mode": plan.mode,
        "interrupted": status not in ("finished", "stopped_early"),
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
    if plan.mode != "evaluate":
        summary["export"] = export
    if summary["step"] != reached:
        summary["unsaved_step"] = reached
    summary.update(utilization(controller))
    summary.update({f"train/{k}": v for k, v in controller.last_train_metrics.items()})
    summary.update({f"eval/{k}": v for k, v in controller.last_eval_metrics.items()})
    return summary


def utilization(controller: Any) -> dict:
    """How close the run came to its hardware: `mfu` over the timed loops
    (each `train` call's first excluded, as `examples_per_second`; a run of one
    loop has none), the step's
    FLOPs and the peak it is measured against (`engine.observe.step_flops`,
    `engine.runtime.hardware`), when the trainer counts them; and
    `peak_memory` (host RSS, GPU allocation) always."""
    trainer = getattr(controller, "trainer", None)
    strategy = getattr(trainer, "strategy", None)
    record: dict = {"peak_memory": hardware.peak_memory(
        hardware.local_devices(strategy) if strategy is not None else ())}
    peak = getattr(trainer, "peak", None)
    rate = controller.steps_per_second
    # Counted by the trainer from its second loop on (a run of one loop has no mfu).
    flops = trainer.flops_per_step(count=False) if peak is not None and rate else None
    if flops:
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
