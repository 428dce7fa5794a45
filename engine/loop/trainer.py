"""The replicated training step and the compiled loop that runs it.

One call of `Trainer.train(num_steps)` is one loop: a single `tf.function`
call whose body is a `tf.while_loop`, so Python runs once per loop, not once
per step::

    for _ in tf.range(num_steps):                  # inside one tf.function
        batch = next(iterator)                     # timed: the input wait (engine.loop.step_time)
        optimizer.learning_rate = schedule(global_step)    # engine.recipe.schedules.assign
        for objective in objectives:               # usually one; a GAN's two
            if global_step % objective.every == 0:
                strategy.run(replica_step, objective, batch)
        global_step += 1

        average.update(global_step)                # --ema_decay: the weights' moving average

    replica_step(objective, batch):                # on every replica
        out  = loss_fn(model, batch, training=True)        # these four lines are
        loss = compute_average_loss(out.per_example_loss, global_batch_size)
               + scale_regularization_loss(model.losses)
        grads = tape.gradient(optimizer.scale_loss(loss), objective's variables)  # XLA's
        grads = all-reduce(grads)                  # the one all-reduce, via the collective (timed)
        grad_norm = global_norm(grads)             # a train metric; --clip_norm clips to it
        objective's optimizer.apply_gradients(grads)  # applies; does not reduce again

A task may own the forward and backward lines (`Task.gradients(model,
batch, step)`: a gradient penalty, several backward passes); the rest of
the step, from the all-reduce on, is the same.

With `--accumulation_steps=N` the forward and backward lines run over N
slices of the replica's batch in a `tf.while_loop` and their gradients are
summed (`engine.loop.replica_step.accumulated_gradients`); the all-reduce, the
clipping and the update still happen once per step. `global_batch_size` stays
the examples of one step, one update.

Clipping happens after the all-reduce, on the gradients every replica holds
identically, so every replica clips by the same factor and the weights stay
in sync: clipping each replica's own gradients before the sum would not
equal clipping the one-device gradient.

The forward and backward lines are `engine.loop.replica_step.replica_gradients`,
which the parameter-server trainer shares.

`jit_compile=True` compiles only the per-replica forward and backward pass
(a nested `tf.function(jit_compile=True)`): the all-reduce goes through
`merge_call` into the collective's cross-device ops and the Keras update
through `distribution.extended.update`, neither of which XLA can compile
inside a replica context on TF 2.21 (and the loop's `next(iterator)` is a
host-side op). The compiled part is where the arithmetic is.

Non-finite numbers (`engine.loop.finite`): after each loop `train` checks the
loop's mean `loss` and `grad_norm` (non-finite when any step's was) and that
the weights are still finite (one pass over them per loop, for an update
that overflowed on finite gradients), and raises `NonFinite` before the
Controller saves anything. With `nan_policy="skip_step"` a step whose
all-reduced gradient norm is not finite applies no update::

        finite = is_finite(grad_norm)              # identical on every replica
        merge_call: cond(first replica's finite, apply on every replica, no-op)

(a `cond` in the cross-replica context, as Keras's `LossScaleOptimizer`
does: a branch may not `merge_call` in a replica context); the step still
advances the global step and the data, stays out of the loop's means, and
counts in the train metric `skipped_steps`; `max_skips` such steps in a row
stop the run. Under `mixed_float16` the `LossScaleOptimizer` already skips
such steps itself (and must, to halve its scale): the trainer leaves the
update to it and only keeps the step out of the means and counts it.

Under `mixed_float16` the optimizer is a `LossScaleOptimizer`:
`scale_loss` multiplies by the dynamic scale before differentiating, and its
`apply_gradients` unscales the already reduced gradients (see
`engine.recipe.precision`). For any other optimizer `scale_loss` is the identity.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Optional, Sequence

import keras
import tensorflow as tf

from tfloop.collectives import checked
from tfloop.collectives.interface import Collective
from tfloop.engine.loop import finite, iterators, step_flops, step_time
from tfloop.engine.recipe import precision, schedules
from tfloop.engine.recipe import objectives as objectives_lib
from tfloop.engine.config import INT32_MAX
from tfloop.engine.recipe.ema import WeightAverage
from tfloop.engine.errors import NonFinite, steps_text
from tfloop.engine.losses import LossFn, classification_loss
from tfloop.engine.loop.replica_step import (accumulated_gradients, hook_gradients, metric_names,
                                             replica_gradients)
from tfloop.engine.recipe.objectives import BoundObjective
from tfloop.engine.loop.replica_sums import EXAMPLES, ReplicaSums
from tfloop.engine.loop.stragglers import WorkerClock
from tfloop.engine.loop.runner import AbstractTrainer, Metrics
from tfloop.engine.runtime import hardware
from tfloop.engine.runtime.hardware import Peak

logger = logging.getLogger(__name__)

#: The train metric of the reduced gradients' global norm (before clipping).
GRAD_NORM = "grad_norm"
#: The train metric of the loop's steps whose update was skipped (non-finite
#: gradients), reported when steps can be skipped.
SKIPPED_STEPS = "skipped_steps"


def _scales_loss(optimizer) -> bool:
    """A `LossScaleOptimizer` (mixed_float16), which skips non-finite steps itself."""
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


class Trainer(AbstractTrainer):
    """Owns the replicated train step and its compiled loop of steps.

    A step takes one global batch and runs each objective on it in order
    (most tasks have one; a GAN has a discriminator's and a generator's):
    forward and backward on every replica, the one all-reduce of its
    gradients through `collective`, and its optimizer's update. An objective
    with `every=k` runs on steps where `global_step % k == 0`.

    Args:
      strategy: the `tf.distribute.Strategy` the model and optimizer were
        created under.
      model: a Keras model, or any trackable with `trainable_variables` (a
        `keras.Model` holding several models); passed to the loss as is.
      collective: how gradients are summed across replicas.
      train_dataset: a `tf.data.Dataset` of *global* batches.
      global_batch_size: examples per step across all replicas.
      global_step: the int64 step counter saved in checkpoints.
      objectives: what each step minimizes (`engine.recipe.objectives.bind`); or,
        for the one-objective case built by hand,
      optimizer: a Keras 3 optimizer created under `strategy.scope()`, and
      loss_fn: the user's per-example loss (see `engine.losses`; default
        classification).
      jit_compile: compile each replica's forward and backward pass with XLA.
      accumulation_steps: micro-batches per step (see the module docstring).
      clip_norm: clip the reduced gradients to this global norm (0: off).
      average: the weights' moving average (`engine.recipe.ema`), updated after
        every step; None: off.
      nan_policy: `stop` (a loop with a non-finite loss or gradient norm
        raises `NonFinite`) or `skip_step` (such a step applies no update; see
        the module docstring).
      max_skips: with `skip_step`, raise `NonFinite` after this many skipped
        steps in a row.
      peak: the devices' peak rate (`engine.runtime.hardware.peak`): each
        loop's metrics but the first's (it traces) then hold `mfu`
        (`engine.loop.step_flops`); None: not.

    Each loop's time breakdown (`engine.loop.step_time`) is `last_loop_time`.
    """

    def __init__(
        self,
        *,
        strategy: tf.distribute.Strategy,
        model: Any,
        collective: Collective,
        train_dataset: tf.data.Dataset,
        global_batch_size: int,
        global_step: tf.Variable,
        objectives: Optional[Sequence[BoundObjective]] = None,
        optimizer: Optional[keras.optimizers.Optimizer] = None,
        loss_fn: Optional[LossFn] = None,
        jit_compile: bool = False,
        accumulation_steps: int = 1,
        clip_norm: float = 0.0,
        average: Optional[WeightAverage] = None,
        nan_policy: str = finite.STOP,
        max_skips: int = 10,
        peak: Optional[Peak] = None,
    ):
        if global_batch_size <= 0:
            raise ValueError(f"`global_batch_size` ({global_batch_size}) must be positive")
        if not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"`accumulation_steps` ({accumulation_steps!r}) must be a "
                             "positive integer")
        per_replica = global_batch_size // strategy.num_replicas_in_sync
        if per_replica % accumulation_steps:
            raise ValueError(f"the per-replica batch ({per_replica}) does not divide into "
                             f"{accumulation_steps} micro-batches")
        if clip_norm < 0:
            raise ValueError(f"`clip_norm` ({clip_norm!r}) must be >= 0 (0: off)")
        if nan_policy not in (finite.STOP, finite.SKIP_STEP):
            raise ValueError(f"`nan_policy` ({nan_policy!r}) must be {finite.STOP!r} or "
                             f"{finite.SKIP_STEP!r}")
        if not isinstance(max_skips, int) or max_skips < 1:
            raise ValueError(f"`max_skips` ({max_skips!r}) must be a positive integer")
        self.strategy = strategy
        self.model = model
        self.collective = collective
        self.global_step = global_step
        self.global_batch_size = global_batch_size
        self.accumulation_steps = accumulation_steps
        self.clip_norm = clip_norm
        self.average = average
        if objectives is None:
            objectives = self._one_objective(strategy, model, optimizer, loss_fn)
        self.objectives = list(objectives)
        self.nan_policy = nan_policy
        self.max_skips = max_skips if nan_policy == finite.SKIP_STEP else 0
        self.peak = peak
        self.last_loop_time: Optional[step_time.LoopTime] = None
        self._element_spec = train_dataset.element_spec
        self._flops: Optional[float] = None
        self._flops_counted = False
        self._loops = 0
        # Steps are skipped by the engine (skip_step) or by a LossScaleOptimizer.
        self._skipping = nan_policy == finite.SKIP_STEP or any(
            _scales_loss(o.optimizer) for o in self.objectives)
        with strategy.scope():
            # Skipped steps in a row, across loops (not checkpointed: a resumed
            # run starts counting afresh).
            self._skip_streak = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="skip_streak",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        # What the loop checks for non-finite values at its end: the model's
        # weights (batch-norm statistics too), or the objectives' variables.
        watched = getattr(model, "variables", None) or [
            v for o in self.objectives for v in o.variables]
        self._weights = [v for v in watched if tf.as_dtype(v.dtype).is_floating]
        self._sums = [
            ReplicaSums(strategy, ["loss", GRAD_NORM]
                        + metric_names(o.loss, model, train_dataset.element_spec,
                                       step_fn=self._probe_step(o) if o.gradients else None))
            for o in self.objectives
        ]
        # This worker's input and all-reduce time, and the step's phase (engine.loop.stragglers).
        self.clock = WorkerClock()
        # Whether the loop is timed (engine.loop.step_time): not under op
        # determinism, where TensorFlow refuses tf.timestamp.
        self.timed = step_time.timestamps_allowed()
        # Destroyed without a stall when the trainer goes (engine.loop.iterators).
        self._iterator = iterators.distributed(
            strategy.experimental_distribute_dataset(train_dataset))
        compile_fn = (lambda f: tf.function(f, jit_compile=True)) if jit_compile else (lambda f: f)
        self._gradients = [compile_fn(functools.partial(self._compute_gradients, o))
                           for o in self.objectives]
        self._loop = tf.function(self._train_loop)
        for objective in self.objectives:  # a plug-in's results, checked before anything is written
            checked.probe(collective, strategy, list(objective.variables))

    @staticmethod
    def _one_objective(strategy, model, optimizer, loss_fn) -> list[BoundObjective]:
        if optimizer is None:
            raise ValueError("Trainer needs `objectives`, or an `optimizer` (and a `loss_fn`)")
        with strategy.scope():
            return objectives_lib.single(loss_fn or classification_loss,
                                         model.trainable_variables, optimizer)

    def train(self, num_steps: int) -> Metrics:
        """Runs one compiled loop of `num_steps` steps; returns its mean metrics.

        Raises:
          NonFinite: the loop's loss or gradient norm, or the weights after
            it, are not finite; or `max_skips` steps in a row were skipped.
        """
        if not 0 <= num_steps <= INT32_MAX:
            raise ValueError(f"`num_steps` ({num_steps!r}) must be between 0 and 2**31 - 1 "
                             "(a loop counts its steps in int32)")
        start = int(self.global_step.numpy())
        began = time.perf_counter()
        try:
            results, weights_finite, waited = self._loop(self._iterator,
                                                         tf.constant(num_steps, tf.int32))
        except tf.errors.InvalidArgumentError:
            mismatch = checked.mismatch(self.collective)  # --check_collective stopped the step
            if mismatch is None:
                raise
            raise mismatch from None
        metrics = {name: float(value) for name, value in results.items()}
        seconds = time.perf_counter() - began
        end = int(self.global_step.numpy())
        self.last_loop_time = step_time.LoopTime(
            start=start, steps=end - start, seconds=seconds, input=float(waited["input"]),
            all_reduce=float(waited["all_reduce"])) if self.timed else None
        self._loops += 1
        if self._loops > 1:  # the first loop traces and compiles: its mfu would mean nothing
            mfu = step_flops.mfu(self.flops_per_step(), end - start, seconds,
                                 self.peak.flops_per_second if self.peak else None)
            if mfu is not None:
                metrics[step_flops.MFU] = mfu
        if self.max_skips and int(self._skip_streak.numpy()) >= self.max_skips:
            raise NonFinite(
                f"{self.max_skips} steps in a row had non-finite gradients (steps "
                f"{end - self.max_skips + 1}..{end}, each skipped by --nan_policy=skip_step): "
                "the run is not recovering; lower --learning_rate or check the data")
        finite.check_metrics(metrics, start, end)
        if not bool(weights_finite):
            raise NonFinite(
                f"the weights became non-finite in {steps_text(start, end)} while the "
                "loss and gradient norm were finite: an update overflowed; lower "
                "--learning_rate or set --clip_norm")
        if metrics.get(SKIPPED_STEPS):
            logger.warning("skipped the update of %d of %s (non-finite gradients)",
                           int(metrics[SKIPPED_STEPS]), steps_text(start, end))
        return metrics

    def flops_per_step(self, *, count: bool = True) -> Optional[float]:
        """FLOPs of one step (`engine.loop.step_flops`), counted once (from the
        second loop on, when a peak asks for `mfu`); None without a peak, when
        they cannot be counted, or with `count=False` when not counted yet."""
        if self.peak is None or self._flops_counted or not count:
            return self._flops
        self._flops_counted = True
        # This process's replicas: the peak is its devices' (a cluster's
        # fraction is the same on every worker).
        replicas = len(hardware.local_devices(self.strategy))
        per_replica = self.global_batch_size // self.strategy.num_replicas_in_sync
        spec = step_flops.replica_spec(self._element_spec, per_replica)
        total = 0.0
        for objective in self.objectives:
            flops = step_flops.count(functools.partial(
                replica_gradients, objective.loss, self.model, variables=list(objective.variables),
                optimizer=objective.optimizer, global_batch_size=self.global_batch_size), spec)
            if flops is None:
                return None
            total += flops * replicas / objective.every
        self._flops = total
        return total

    def _train_loop(self, iterator, num_steps):
        for sums in self._sums:
            sums.reset()
        skipped = tf.constant(0, tf.int64)
        input_wait, all_reduce = step_time.zero(), step_time.zero()  # engine.loop.step_time
        stepped = step_time.now(self.timed)  # when the previous step ended (loop-carried)
        for _ in tf.range(num_steps):
            batch = self.clock.next(iterator)  # the phase, for a hang dump
            input_wait += step_time.stamp_after(
                [stepped, self.strategy.experimental_local_results(batch)], self.timed) - stepped
            schedules.assign(self.objectives, self.global_step)  # the rate of this global step
            step_skipped = tf.constant(False)
            for index, objective in enumerate(self.objectives):
                objective_skipped, reducing = self._run_objective(index, objective, batch)
                step_skipped = tf.logical_or(step_skipped, objective_skipped)
                all_reduce += reducing
            # Once the updates are applied too: read after each optimizer's step count.
            stepped = step_time.stamp_after([step_skipped, all_reduce] + [
                tf.identity(objective.optimizer.iterations) for objective in self.objectives],
                self.timed)
            if self.average is not None:
                self.average.update(self.global_step)
            # After the step's updates: ops on different variables are not
            # ordered in a tf.function, so a step whose batch or loss failed
            # could still be counted (unsaved_step 31 where 30 trained).
            with tf.control_dependencies([step_skipped] + [
                    tf.identity(objective.optimizer.iterations)
                    for objective in self.objectives]):
                self.global_step.assign_add(1)
            if self._skipping:
                skipped += tf.cast(step_skipped, tf.int64)
            if self.max_skips:
                self._skip_streak.assign(
                    tf.where(step_skipped, self._skip_streak + 1, tf.constant(0, tf.int64)))
                if self._skip_streak >= self.max_skips:
                    break
        results = {**self._means(), **objectives_lib.learning_rates(self.objectives)}
        if self._skipping:
            results[SKIPPED_STEPS] = skipped
        weights_finite = tf.reduce_all(tf.stack(
            [tf.reduce_all(tf.math.is_finite(v)) for v in self._weights] or [tf.constant(True)]))
        return results, weights_finite, {"input": input_wait, "all_reduce": all_reduce}

    def _run_objective(self, index, objective, batch):
        """One objective's replicated step, on the steps it runs at (`every`);
        whether its update was skipped, and its all-reduce's seconds
        (`engine.loop.step_time`: the last replica's arrival to the last one's result)."""
        step = functools.partial(self._replica_step, index)

        def run():
            skipped, ready, done = self.strategy.run(step, args=(batch,))
            latest = lambda t: tf.reduce_max(tf.stack(self.strategy.experimental_local_results(t)))  # noqa: E731
            return self._first_replica(skipped), latest(done) - latest(ready)

        if objective.every == 1:
            return run()
        return tf.cond(self.global_step % objective.every == 0, run,
                       lambda: (tf.constant(False), step_time.zero()))

    def _first_replica(self, value):
        """The first local replica's copy of a value every replica computed alike."""
        return self.strategy.experimental_local_results(value)[0]

    def _means(self):
        if len(self.objectives) == 1:
            return self._sums[0].means()
        means = {}
        for objective, sums in zip(self.objectives, self._sums):
            for name, value in sums.means().items():
                if name == EXAMPLES:
                    means[EXAMPLES] = tf.maximum(means.get(EXAMPLES, 0.0), value)
                else:
                    means[objectives_lib.metric_name(self.objectives, objective, name)] = value
        return means

    @staticmethod
    def _gradients_fn(objective):
        """`replica_gradients`, or the task's own step (`Task.gradients`)
        bound to the objective: the rest of the step is the same."""
        if objective.gradients is None:
            return replica_gradients
        return functools.partial(hook_gradients, objective.gradients, objective.name)

    def _probe_step(self, objective):
        """The task's own step over one batch, for `metric_names` to trace."""
        def step(batch):
            return self._gradients_fn(objective)(
                objective.loss, self.model, batch, list(objective.variables),
                optimizer=objective.optimizer, global_batch_size=self.global_batch_size,
                micro_batches=self.accumulation_steps)
        step.__qualname__ = getattr(objective.gradients, "__qualname__", "gradients")  # its errors
        return step

    def _compute_gradients(self, objective, batch):
        """Forward and backward pass of one replica (XLA-compiled with jit_compile)."""
        gradients_fn = self._gradients_fn(objective)
        if self.accumulation_steps > 1:
            return accumulated_gradients(
                objective.loss, self.model, batch, list(objective.variables),
                optimizer=objective.optimizer, global_batch_size=self.global_batch_size,
                micro_batches=self.accumulation_steps, gradients_fn=gradients_fn)
        return gradients_fn(objective.loss, self.model, batch, list(objective.variables),
                            optimizer=objective.optimizer, global_batch_size=self.global_batch_size)

    def _replica_step(self, index, batch):
        objective = self.objectives[index]
        variables = list(objective.variables)
        grads, reported_loss, metrics = self._gradients[index](batch)
        present = [i for i, g in enumerate(grads) if g is not None]
        # Timed (engine.loop.step_time): the all-reduce starts after `ready`.
        ready = step_time.stamp_after([grads[i] for i in present], self.timed)
        # The one all-reduce of this objective's gradients, through the selected collective.
        reduced = tf.distribute.get_replica_context().merge_call(
            self._all_reduce, args=(step_time.held_until([grads[i] for i in present], ready),
                                    [variables[i] for i in present])
        )
        done = step_time.stamp_after(reduced, self.timed)
        # Under mixed_float16 the reduced gradients are still multiplied by the
        # loss scale (the optimizer divides it out): norms are taken of the real ones.
        scale = precision.loss_scale(objective.optimizer)
        grad_norm = tf.linalg.global_norm(reduced) / scale
        if self.clip_norm:
            reduced, _ = tf.clip_by_global_norm(reduced, self.clip_norm * scale,
                                                use_norm=grad_norm * scale)
        updated = [variables[i] for i in present]
        # The same on every replica: the reduced gradients are.
        finite_step = tf.math.is_finite(grad_norm)
        if self.nan_policy == finite.SKIP_STEP and not _scales_loss(objective.optimizer):
            tf.distribute.get_replica_context().merge_call(
                functools.partial(self._apply_if_finite, objective.optimizer, updated),
                args=(reduced, finite_step))
        else:  # a LossScaleOptimizer skips a non-finite step by itself
            objective.optimizer.apply_gradients(zip(reduced, updated))

        count = tf.shape(reported_loss)[0]
        # One norm per step, weighed by the examples so the loop's mean is the steps' mean.
        values = {"loss": reported_loss, **metrics,
                  GRAD_NORM: grad_norm * tf.cast(count, tf.float32)}
        if self._skipping:  # a skipped step stays out of the loop's means
            values = {name: tf.where(finite_step, value, tf.zeros_like(value))
                      for name, value in values.items()}
            count = tf.where(finite_step, count, tf.zeros_like(count))
        self._sums[index].add(count, values)
        return tf.logical_not(finite_step), ready, done

    @tf.autograph.experimental.do_not_convert  # graph-building Python, not a loop body
    def _apply_if_finite(self, optimizer, variables, strategy, grads, finite_step):
        """Cross-replica context: every replica applies `grads`, or none does,
        as the first replica's `finite_step` says."""
        def apply():
            strategy.extended.call_for_each_replica(
                lambda g: optimizer.apply_gradients(zip(g, variables)), args=(grads,))

        tf.cond(self._first_replica(finite_step), apply, lambda: None)

    @tf.autograph.experimental.do_not_convert  # graph-building Python, not a loop body
    def _all_reduce(self, strategy, grads, destinations):
        if strategy.num_replicas_in_sync == 1:
            return grads
        return self.clock.all_reduce(
            strategy, lambda: self.collective.batch_all_reduce(grads, destinations), grads)
