"""The NaN guard: a loop whose numbers are not finite ends the run before anything is saved.

A non-finite loss or gradient norm in one step spreads into the weights at
once, and from there into every later checkpoint; rotation would then delete
the last good ones. So after each loop, on values the steps computed anyway
(a loop's mean of `loss` and `grad_norm` is non-finite when any step's was),
the trainer and the Controller look, once::

    metrics = trainer.train(n)            # means over the loop's steps
    check_metrics(metrics, start, step)   # NaN/Inf in loss or grad_norm: NonFinite
    ... only then actions, evaluation, checkpoint, export

`NonFinite` leaves the loop before the actions (the stop request's save),
the evaluation, the checkpoint and the export, so none of them writes the
bad weights, and the newest checkpoint stays the last good one. There is
no extra synchronization per step.

`--nan_policy=skip_step` (`engine.loop.trainer`) instead skips the update of a
step whose all-reduced gradients are not finite and counts it; those steps
stay out of the loop's means, so the check above passes, and the trainer
stops the run after `--nan_max_skips` such steps in a row.
"""

from __future__ import annotations

import math
from typing import Mapping

from tfloop.engine.loop.settings import NAN_POLICIES
from tfloop.engine.errors import NonFinite, steps_text

STOP, SKIP_STEP = NAN_POLICIES

#: The train metrics (or `<objective>/<metric>`) that must stay finite.
WATCHED = ("loss", "grad_norm")


def non_finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """The watched metrics of `metrics` that are NaN or infinite."""
    return {name: value for name, value in metrics.items()
            if name.rpartition("/")[2] in WATCHED and not math.isfinite(value)}


def check_metrics(metrics: Mapping[str, float], start: int, end: int) -> None:
    """Raises `NonFinite` naming the loop's steps when a watched metric of the
    loop from global step `start` to `end` is not finite."""
    bad = non_finite(metrics)
    if bad:
        values = ", ".join(f"{name} {value}" for name, value in bad.items())
        error = NonFinite(
            f"{values} in {steps_text(start, end)}: the numbers diverged (lower "
            "--learning_rate or set --clip_norm, check the data for NaN or huge values, or "
            "skip such steps with --nan_policy=skip_step)")
        error.loop = (start, end, dict(metrics))  # what Keras's TerminateOnNaN sees (fit)
        raise error
