"""Which worker is slow: each worker's own time per loop, gathered by the chief.

In synchronous training every worker's loop takes the same wall time: the
gradients' all-reduce waits for the slowest worker at every step. So a slow
worker does not show in anyone's steps/s; it shows as time the *others* spend
waiting inside the all-reduce. Each worker's trainer already times, inside
the compiled loop, two things of its own (`engine.observe.step_time`, its
clock's `last`):

    input       the wait for its next batch: its tf.data pipeline
    all_reduce  from the gradients being all computed to their all-reduce
                being done: waiting for the slowest worker, and the transfer

and its *own time* per loop is the loop's wall time minus `all_reduce`:
input, forward, backward and the update, everything it did not spend
waiting for the others. Once per sampled loop (`Stragglers`, an action on every
worker) the workers sum a tiny table through the strategy, one row per
worker (job, index, own seconds, input seconds): one collective of a few
floats. The chief compares each worker's own time with the median of the
others'; a worker over `threshold` times that median (and 10 ms more per
step, so noise on tiny steps is not a straggler) for `PERSISTENT` loops in
a row is named in one log line, its task and host, and whether its input
pipeline is the cause. The chief also writes each worker's times to
TensorBoard (`workers/<task>/own_seconds_per_step`, `.../input_seconds_per_step`).

The times come from the trainer's sampled loops (`engine.observe.clock`),
and where this table is kept (`--straggler_threshold` > 0, 2+ workers) every
loop is sampled: its per-step stamps are the price of naming a straggler
(`--straggler_threshold=0` drops both). The table is exchanged on sampled
loops only (a SIGUSR1 sample is one worker's, and is not exchanged). Under `--deterministic` TensorFlow refuses
`tf.timestamp`: the loop is not timed and stragglers are not measured (one
log line says so).
"""

from __future__ import annotations

import logging
import statistics
from typing import Any, Callable, Mapping

import tensorflow as tf

from tfloop.engine.loop.actions import Action, LoopEnd

logger = logging.getLogger(__name__)

#: Loops in a row a worker must be slow before it is named.
PERSISTENT = 3
#: Seconds per step a straggler must lose, besides the ratio: below it, noise.
MIN_SECONDS_PER_STEP = 0.01
#: A row of the table the workers sum: job code, task index, own and input seconds.
_ROW = 4
_JOBS = {"chief": 0.0, "worker": 1.0}


class Stragglers(Action):
    """Once per loop on every worker: the table of own times, summed through
    the strategy; on the chief, the straggler line and the scalars.

    Args:
      strategy: the multi-worker strategy (the table's collective).
      times: `() -> LoopTime or None`: this worker's last loop, as its
        trainer's clock timed it (`SampledClock.last`, `engine.observe.step_time`).
      role: this task's `launch.tf_config.Role` (the hosts, by task).
      threshold: a worker slower than this many times the others' median is
        a straggler; 0: no exchange at all.
      writer: the chief's train `SummaryWriter`, or None.
    """

    def __init__(self, *, strategy, times: Callable[[], Any], role, threshold: float,
                 writer=None):
        self.strategy = strategy
        self.times = times
        self.role = role
        self.threshold = threshold
        self.writer = writer
        self.streaks: dict[str, int] = {}
        self.named: set[str] = set()
        self.last_table: dict[str, tuple[float, float]] = {}
        n = strategy.num_replicas_in_sync
        self._workers = max(role.num_workers, 1)
        self._local = max(n // self._workers, 1)

    def __call__(self, loop: LoopEnd) -> None:
        timed = self.times()
        # Only the loops every worker samples alike (a SIGUSR1 sample is one
        # worker's): the table is a collective, every worker must join it.
        if (not self.threshold or loop.num_steps <= 0 or timed is None
                or not timed.sampled or not timed.scheduled):
            return
        own = max(timed.seconds - timed.all_reduce, 0.0)
        table = self._exchange(own, timed.input)
        if not self.role.is_chief:
            return
        steps = loop.num_steps
        self.last_table = {task: (own / steps, wait / steps)
                           for task, (own, wait) in table.items()}
        if self.writer is not None:
            self.writer.write(loop.step, {
                f"workers/{task}/{name}": value for task, (own, wait) in self.last_table.items()
                for name, value in (("own_seconds_per_step", own),
                                    ("input_seconds_per_step", wait))})
        for task, (slow, why) in self.slow_workers(self.last_table).items():
            self.streaks[task] = self.streaks.get(task, 0) + 1
            if self.streaks[task] >= PERSISTENT and task not in self.named:
                self.named.add(task)
                logger.warning("straggler: %s (%s) %s for %d loops in a row (steps to %d)%s",
                               task, self._host(task), slow, self.streaks[task], loop.step, why)
        for task in list(self.streaks):
            if task not in self.slow_workers(self.last_table):
                self.streaks.pop(task)
                self.named.discard(task)

    def slow_workers(self, table: Mapping[str, tuple[float, float]]) -> dict[str, tuple[str, str]]:
        """task -> (how much slower, the likely cause) for each worker over the threshold."""
        slow = {}
        for task, (own, wait) in table.items():
            others = [o for t, (o, _) in table.items() if t != task]
            if not others:
                continue
            median = statistics.median(others)
            if own > self.threshold * median and own - median > MIN_SECONDS_PER_STEP:
                ratio = own / median if median > 0 else float("inf")
                cause = (f"; its input pipeline waits {wait * 1000:.0f} ms per step: make its "
                         "tf.data input faster (prefetch, parallel map, cache) or check its "
                         "data's storage" if wait > (own - median) / 2 else
                         "; not its input: check its devices, its load, its host")
                slow[task] = (f"takes {own * 1000:.0f} ms per step of its own, {ratio:.1f}x "
                              f"the other workers' median {median * 1000:.0f} ms "
                              f"(threshold {self.threshold:g}x)", cause)
        return slow

    def _exchange(self, own: float, wait: float) -> dict[str, tuple[float, float]]:
        """Every worker's (own, input) seconds: one sum of a small table
        through the strategy, every worker contributing its own row."""
        job = _JOBS.get(self.role.task_type or "worker", 1.0)
        index = float(self.role.task_index)
        local, workers = self._local, self._workers

        def row(context):
            replica = context.replica_id_in_sync_group
            slot = replica // local
            table = [0.0] * (_ROW * workers)
            if replica % local == 0 and slot < workers:  # one replica per worker writes
                table[slot * _ROW:(slot + 1) * _ROW] = [job, index, own, wait]
            return tf.constant(table, tf.float64)

        values = self.strategy.experimental_distribute_values_from_function(row)
        summed = self.strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None).numpy()
        table = {}
        names = {v: k for k, v in _JOBS.items()}
        for slot in range(workers):
            job_code, task_index, own_s, wait_s = summed[slot * _ROW:(slot + 1) * _ROW]
            table[f"{names.get(job_code, 'worker')}:{int(task_index)}"] = (own_s, wait_s)
        return table

    def _host(self, task: str) -> str:
        job, _, index = task.partition(":")
        tasks = self.role.cluster.get(job, ())
        try:
            address = tasks[int(index)]
        except (KeyError, IndexError, ValueError):
            return "host unknown"
        return f"host {address.rpartition(':')[0] or address}"
