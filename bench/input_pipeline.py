"""The input pipeline alone, beside the step alone: which one bounds the run.

`bin/bench_train --variants=input,step,engine` times, in one process:

  input    the run's own training pipeline, built exactly as `bin/train`
           builds it (the task's `train_dataset` through the engine's
           `task_inputs.train_dataset`: uint8 batches, the run's seed, shard
           policy and `--deterministic`), pulled on the host with no step and
           no device copy: the images per second this machine's cores decode,
           crop and batch;
  step     the engine with its input kept on the devices
           (`--synthetic_on_device`): the step alone, no tf.data at all;
  engine   the two together, as a run trains.

The pipeline is a new one built for the benchmark, never a run's: it reads
the same files in the same order a run with that seed would.

`verdict` compares the first two: when the pipeline alone delivers less
than the step alone consumes, the input bounds the run, and the line says
how many of this machine's cores (at the measured rate per core) the step
would need, and what to do (`--data_service` when one host's cores cannot
be enough). tf.data's own thread pool spans every core the process may
use (`os.sched_getaffinity`), so "per core" is the measured rate over
those cores: a pipeline that scales with cores (parallel decode) gets about
that much more from each added one, one that does not (a serial
`py_function`) does not.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Optional

#: The pipeline bounds the run below this share of the step's own rate;
#: between it and 1.0 the two are close enough that either may show.
CLOSE = 1.1


def cores() -> int:
    """The cores this process may run on (tf.data's thread pool spans them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_pipeline(run_config):
    """The training pipeline `bin/train` would build for `run_config`, new
    (its own seed generators and iterator), for this process alone (one
    input pipeline, start step 0)."""
    from tfloop.engine.loop import task_inputs
    from tfloop.engine.task.plugin import ClassificationTask

    task = ClassificationTask.from_config(run_config)
    task.prepare()
    placement = task_inputs.InputPlacement(
        global_batch_size=run_config.global_batch_size, replicas=len(run_config.devices.split(",")),
        input_workers=1, pipeline_index=0,
        shard_policy=_shard_policy(task, run_config), seed=run_config.seed,
        deterministic=run_config.deterministic)
    return task_inputs.train_dataset(task, task_inputs.context_for(placement))


def _shard_policy(task, run_config) -> str:
    from tfloop import inputs

    return inputs.resolve_shard_policy(task.splits.train, run_config.auto_shard_policy)


def time_batches(dataset, *, steps: int, repetitions: int, warmup: int) -> list[float]:
    """Seconds per repetition of `steps` batches pulled from `dataset`, after
    `warmup` untimed repetitions (the first fills tf.data's buffers and lets
    autotune find its parallelism)."""
    iterator = iter(dataset)
    seconds = []
    for repetition in range(warmup + repetitions):
        began = time.perf_counter()
        for _ in range(steps):
            next(iterator)
        if repetition >= warmup:
            seconds.append(time.perf_counter() - began)
    return seconds


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What bounds the run: the pipeline's rate against the step's."""

    input_rate: float  # examples/s, the pipeline alone
    step_rate: float  # examples/s, the step alone
    cores: int
    together: Optional[float] = None  # examples/s, the engine with its input (the `engine` row)

    @property
    def per_core(self) -> float:
        return self.input_rate / self.cores

    @property
    def ratio(self) -> float:
        """The pipeline's rate over the step's: under 1, the input bounds the run."""
        return self.input_rate / self.step_rate

    @property
    def bound(self) -> str:
        """"input", "step", or "neither" (within `CLOSE` of each other)."""
        if self.ratio < 1.0:
            return "input"
        return "step" if self.ratio >= CLOSE else "neither"

    @property
    def cores_needed(self) -> int:
        """Cores the pipeline would need to feed the step at the measured rate per core."""
        return max(1, -int(-self.step_rate // self.per_core))

    def line(self) -> str:
        return self._bound_line() + self._together_line()

    def _together_line(self) -> str:
        """When the two together fall well under the slower alone: they share the cores."""
        if self.together is None or self.together * CLOSE >= min(self.input_rate, self.step_rate):
            return ""
        return (f"; together {self.together:,.0f} examples/s, under either alone: the pipeline "
                "and the step share this host's cores (a CPU step; on a GPU the step's cores "
                "are the device's)")

    def _bound_line(self) -> str:
        head = (f"input pipeline alone {self.input_rate:,.0f} examples/s on {self.cores} "
                f"core(s) ({self.per_core:,.0f} per core); the step alone "
                f"{self.step_rate:,.0f} examples/s: ")
        if self.bound == "input":
            return head + (
                f"the INPUT bounds this run ({self.ratio:.2f}x the step). Feeding the step "
                f"takes about {self.cores_needed} cores at this rate per core (this machine "
                f"gives {self.cores}): a cheaper pipeline (smaller images on disk, decode "
                "once and cache), or more cores through the tf.data service (--data_service, "
                "docs/performance.md)")
        if self.bound == "neither":
            return head + (f"the two are within {CLOSE - 1:.0%} ({self.ratio:.2f}x): either "
                           "may bound a run; watch the progress line's input share")
        return head + (f"the STEP bounds this run (the pipeline keeps up {self.ratio:.1f}x "
                       "over): speed the step (--mixed_precision, --jit_compile, a larger "
                       "batch), not the input")


def verdict(rows, cores_used: int) -> Optional[Verdict]:
    """From a benchmark's rows (`VariantRow`s or their dicts): the `input` row
    against the `step` row (the `engine` row, when there is one, beside them);
    None without both."""
    rates = {_get(row, "variant"): _get(row, "median") for row in rows}
    if not rates.get("input") or not rates.get("step"):
        return None
    return Verdict(input_rate=rates["input"], step_rate=rates["step"], cores=cores_used,
                   together=rates.get("engine"))


def _get(row, key):
    return row[key] if isinstance(row, dict) else getattr(row, key)
