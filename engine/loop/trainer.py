"""The replicated training step and the compiled loop that runs it.

One call of `Trainer.train(num_steps)` is one loop: a single `tf.function`
call whose body is a `tf.while_loop`, so Python runs once per loop, not once
per step. The loop is written out (`tf.while_loop`, `tf.cond`) and traced
without autograph; only the task's code it calls is converted, where
`engine.loop.replica_step` calls it (`engine.task.user_code`)::

    optimizer.learning_rate = schedule(global_step)    # a constant rate: once per loop
    totals = zeros on every replica                    # the loop's running sums
    for _ in tf.range(num_steps):                  # inside one tf.function; also ends
                                                   # after a step when a signal asks
        batch = next(iterator)                     # sampled loops: the input wait (engine.observe)
        optimizer.learning_rate = schedule(global_step)    # a rate that varies: every step
        for objective in objectives:               # usually one; a GAN's two
            if global_step % objective.every == 0:
                totals += strategy.run(replica_step, objective, batch)
        global_step += 1

        average.update(global_step)                # --ema_decay: the weights' moving average
    running sums (variables) = totals              # once; the loop's means are read from them

    replica_step(objective, batch):                # on every replica
        out  = loss_fn(model, batch, training=True)        # these four lines are
        loss = compute_average_loss(out.per_example_loss, global_batch_size)
               + scale_regularization_loss(model.losses)
        grads = tape.gradient(optimizer.scale_loss(loss), objective's variables)  # XLA's
        grads = all-reduce(grads)                  # the one all-reduce, via the collective
        grad_norm = global_norm(grads)             # a train metric; --clip_norm clips to it
        objective's optimizer.apply_gradients(grads)  # applies; does not reduce again
        return [examples, sum(loss), sum(metrics)..., grad_norm * examples]

What a step does beyond the gradient step is kept to what its features
need (issue 30: the engine's per-step cost): the running sums are tensors
the `tf.while_loop` carries (no variable written per step), a constant
learning rate is set once per loop, the finiteness check exists only where a
step can be skipped, and the hang dump's marks are one counter per step (two
with an all-reduce: `engine.loop.step_phase`). A step writes the optimizer's
variables, the global step and those marks, nothing else
(`tests/engine/observe/test_sampled_loops.py`). The loop's condition is a
hand loop's, `i < num_steps` on the host, and a host-side stop flag that a
signal sets while the loop runs (`request_stop`, `engine.loop.preemption`:
SIGTERM ends the loop after the step in flight, not at its end): nothing a
step computes on the device decides whether the next one starts (only
`max_skips` does, where set), so the host queues each step's kernels while
the previous ones run.

A task may own the forward and backward lines (`Task.gradients(model,
batch, step)`: a gradient penalty, several backward passes); the rest of
the step, from the all-reduce on, is the same. A task may also own the whole
step, its update included (`Task.train_step`: a Keras model's own
`train_step`): the engine then hands it the all-reduce (`_whole_step`), and
keeps the loop, the running sums and the step count.

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
from typing import Any, Callable, Optional, Sequence

import keras
import tensorflow as tf

from tfloop.collectives import checked
from tfloop.collectives.interface import Collective
from tfloop.engine.loop import finite, iterators
from tfloop.engine.recipe import precision, schedules
from tfloop.engine.recipe import objectives as objectives_lib
from tfloop.engine.option import INT32_MAX
from tfloop.engine.recipe.ema import WeightAverage
from tfloop.engine.errors import NonFinite, steps_text
from tfloop.engine.task.losses import LossFn, classification_loss
from tfloop.engine.loop.replica_step import (WholeStep, accumulated_gradients, hook_gradients,
                                             metric_names, replica_gradients,
                                             whole_step_output)
from tfloop.engine.recipe.objectives import BoundObjective
from tfloop.engine.loop.replica_sums import EXAMPLES, ReplicaSums
from tfloop.engine.loop.step_phase import StepPhase
from tfloop.engine.loop.settings import Step
from tfloop.engine.loop.contracts import AbstractTrainer, LoopClock, Metrics, StepStamps
from tfloop.engine.runtime import hardware

logger = logging.getLogger(__name__)

#: How the trainer distributes its input: each replica's batches fetched to
#: its device ahead of the step that takes them (TensorFlow's
#: `MultiDeviceIterator` prefetch; two batches, so the copy of the next overlaps
#: the step). Strategies without per-device input (the default one) ignore it.
INPUT_OPTIONS = tf.distribute.InputOptions(experimental_fetch_to_device=True,
                                           experimental_per_replica_buffer_size=2)



def _input_options(strategy: tf.distribute.Strategy):
    """`INPUT_OPTIONS`, or None for `CentralStorageStrategy`, whose
    `experimental_distribute_dataset` reads a misspelt attribute of any
    options it is given (TF 2.21: `options.experimental_replication_moden`,
    an AttributeError): it trains on TF's default input options."""
    if isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy):
        return None
    return INPUT_OPTIONS


#: The train metric of the reduced gradients' global norm (before clipping).
GRAD_NORM = "grad_norm"
#: Ops that stop a step by failing (`tf.debugging.assert_*`, `check_numerics`).
_CHECKS = ("Assert", "CheckNumerics", "CheckNumericsV2")
#: The name scope of the global step's increment in a step (its graph tests find it by it).
COUNT_SCOPE = "count_the_step"
#: The train metric of the loop's steps whose update was skipped (non-finite
#: gradients), reported when steps can be skipped.
SKIPPED_STEPS = "skipped_steps"


def _check_batch(global_batch_size: int, num_replicas: int, accumulation_steps: int) -> None:
    """Refuses a global batch that is not positive or does not split into
    the replicas' micro-batches."""
    if global_batch_size <= 0:
        raise ValueError(f"`global_batch_size` ({global_batch_size}) must be positive")
    per_replica = global_batch_size // num_replicas
    if per_replica % accumulation_steps:
        raise ValueError(f"the per-replica batch ({per_replica}) does not divide into "
                         f"{accumulation_steps} micro-batches")


def _examples(per_example: tf.Tensor):
    """A replica's examples in a step, as a float: the static batch size
    where the shape has it (no op per step), else read from the tensor."""
    static = per_example.shape[0]
    if static is not None:
        return float(static)
    return tf.cast(tf.shape(per_example)[0], tf.float32)


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
      loss_fn: the user's per-example loss (see `engine.task.losses`; default
        classification).
      average: the weights' moving average (`engine.recipe.ema`), updated after
        every step; None: off.
      clock: times the loops (`engine.loop.contracts.LoopClock`; the engine's
        is `engine.observe.clock.SampledClock`: wall time per loop, per-step
        stamps in sampled loops, `mfu`); None: nothing is timed.
      options: how each step runs: the run's step section (`Step`,
        `RunConfig.step`: XLA, accumulation, clipping, the non-finite
        policy, input kept on the devices), under its flags' names.
      stops_at_any_step: the loop's condition also reads a host-side stop
        flag (`request_stop`: a signal's), so a loop can end after any step;
        False in a multi-worker cluster, whose workers must all run the same
        steps (they stop at a loop's end, agreed: `engine.loop.preemption`).
        Not a flag: the strategy decides it (`StrategySpec.agrees_to_stop`).
      input_probe: `() -> tf.data.Dataset or None`, the train data built
        afresh for the step-time report's probe of the input's own rate
        (`AbstractTrainer.input_probe`); None: no probe.

    The trainer calls its clock at three points (`LoopClock`) and knows
    nothing else about timing.
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
        average: Optional[WeightAverage] = None,
        clock: Optional[LoopClock] = None,
        options: Step = Step(),
        stops_at_any_step: bool = True,
        input_probe: Optional[Callable[[], Optional[tf.data.Dataset]]] = None,
    ):
        _check_batch(global_batch_size, strategy.num_replicas_in_sync,
                     options.accumulation_steps)
        self.strategy = strategy
        self.model = model
        self.collective = collective
        self.global_step = global_step
        self.global_batch_size = global_batch_size
        self.options = options
        self.stops_at_any_step = stops_at_any_step
        self.average = average
        if objectives is None:
            objectives = self._one_objective(strategy, model, optimizer, loss_fn)
        self.objectives = list(objectives)
        self.max_skips = options.nan_max_skips if options.skips_steps else 0
        self.clock = clock or LoopClock()
        self.train_dataset = train_dataset
        self.input_probe = input_probe
        self.element_spec = train_dataset.element_spec
        # Steps are skipped by the engine (skip_step) or by a LossScaleOptimizer.
        self._skipping = options.skips_steps or any(
            _scales_loss(o.optimizer) for o in self.objectives)
        self._build_state()
        self._build_input(options.synthetic_on_device)
        compile_fn = ((lambda f: tf.function(f, jit_compile=True, autograph=False))
                      if options.jit_compile
                      else (lambda f: f))
        self._gradients = [compile_fn(functools.partial(self._compute_gradients, o))
                           for o in self.objectives]
        # Traced once per value of `with_stamps` (engine.observe.clock): two at most.
        # The loop is the engine's: no autograph (engine.task.user_code says why).
        self._loop = tf.function(self._train_loop, autograph=False)
        for objective in self.objectives:  # a plug-in's results, checked before anything is written
            checked.probe(collective, self.strategy, list(objective.variables))

    @property
    def accumulation_steps(self) -> int:
        return self.options.accumulation_steps

    @property
    def clip_norm(self) -> float:
        return self.options.clip_norm

    def _build_state(self) -> None:
        """The variables the loop keeps beside the model's: the skip streak,
        each objective's running sums, and the step's phase marks."""
        with self.strategy.scope():
            # Skipped steps in a row, across loops (not checkpointed: a resumed
            # run starts counting afresh).
            self._skip_streak = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="skip_streak",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        # What the loop checks for non-finite values at its end: the model's
        # weights (batch-norm statistics too), or the objectives' variables.
        watched = getattr(self.model, "variables", None) or [
            v for o in self.objectives for v in o.variables]
        self._weights = [v for v in watched if tf.as_dtype(v.dtype).is_floating]
        self._sums = [
            ReplicaSums(self.strategy, ["loss", GRAD_NORM]
                        + metric_names(o.loss, self.model, self.element_spec,
                                       step_fn=self._probe_step(o) if o.gradients else None))
            for o in self.objectives
        ]
        # Set by `request_stop` (a signal, while a loop runs), read by the loop's
        # condition before each step: a plain variable in host memory, outside
        # any strategy's scope, so reading it waits for no device.
        self._stop_flag = None
        if self.stops_at_any_step:
            with tf.device("/cpu:0"):
                self._stop_flag = tf.Variable(False, trainable=False, name="stop_requested")
        # The step's phase, for a hang dump (engine.loop.step_phase).
        self.step_phase = StepPhase(self.global_step,
                                    hardware.local_devices(self.strategy)[0],
                                    takes_input=not self.options.synthetic_on_device)

    def _build_input(self, input_on_device: bool) -> None:
        # Each replica's batches prefetched onto its device; destroyed without
        # a stall when the trainer goes (engine.loop.iterators).
        self._iterator = iterators.distributed(
            self.strategy.experimental_distribute_dataset(
                self.train_dataset, options=_input_options(self.strategy)))
        # --synthetic_on_device: one batch, taken now, on the replicas' devices.
        self._device_batch = next(self._iterator) if input_on_device else None

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
        with_stamps = self.clock.begin(start)
        try:
            results, weights_finite, stamped = self._loop(
                self._iterator, tf.constant(num_steps, tf.int32), with_stamps)
        except tf.errors.InvalidArgumentError:
            mismatch = checked.mismatch(self.collective)  # --check_collective stopped the step
            if mismatch is None:
                raise
            raise mismatch from None
        metrics = {name: float(value) for name, value in results.items()}
        end = int(self.global_step.numpy())
        metrics.update(self.clock.end(self, start=start, steps=end - start,
                                      stamped={k: float(v) for k, v in stamped.items()}))
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

    @property
    def peak(self):
        """The devices' peak rate the clock measures `mfu` against (None: none,
        or not measured yet: the clock measures it when the first `mfu` is due)."""
        return self.clock.peak

    def flops_per_step(self, *, count: bool = False) -> Optional[float]:
        """FLOPs of one step as the clock counted them for the first `mfu`
        (`engine.observe.step_flops`); None before, or when not counted."""
        del count  # counted by the clock, once, outside any timed loop
        return self.clock.flops

    def warm(self, with_stamps: bool) -> None:
        """Traces the loop function with or without the stamps and runs it for
        0 steps (no batch taken, no step counted): the clock's one-time work
        after the first loop, so that no timed loop traces or instantiates a
        function."""
        self._loop(self._iterator, tf.constant(0, tf.int32), with_stamps)

    def _train_loop(self, iterator, num_steps, with_stamps):
        stamps = self.clock.stamps(with_stamps)  # no ops at all without
        self.step_phase.begin()  # once per loop: the hang dump's counters
        schedules.assign_per_loop(self.objectives, self.global_step)  # a rate that never varies
        # Each replica's running sums, carried by the loop and written once after it.
        totals = [self.strategy.run(sums.zeros) for sums in self._sums]
        state = stamps.start()
        skipped = None
        if self._skipping:
            totals, skipped, state = self._skipping_steps(iterator, num_steps, totals, stamps,
                                                          state)
        else:
            # The loop a hand-written one is: its condition reads the step
            # counter alone, on the host. (A condition on anything a step
            # computes, as `max_skips` needs, is read on the device: on a GPU
            # the host then waits for every step: `_skipping_steps`.)
            def step(done, totals, state):
                _, totals, state = self._next_step(iterator, totals, stamps, state)
                return done + 1, totals, state

            _, totals, state = tf.while_loop(
                lambda done, *_: self._goes_on(done, num_steps), step,
                (tf.constant(0), totals, state))
        for sums, total in zip(self._sums, totals):
            self.strategy.run(sums.assign, args=(total,))
        results = {**self._means(), **objectives_lib.learning_rates(self.objectives)}
        if skipped is not None:
            results[SKIPPED_STEPS] = skipped
        weights_finite = tf.reduce_all(tf.stack(
            [tf.reduce_all(tf.math.is_finite(v)) for v in self._weights] or [tf.constant(True)]))
        return results, weights_finite, stamps.totals(state)

    def _skipping_steps(self, iterator, num_steps, totals, stamps: StepStamps, state):
        """The loop where a step can be skipped: it also counts the skipped
        steps and, with `max_skips`, the streak of them, and stops at
        `max_skips` in a row. That stop is a condition on a value the device
        computes, so each step ends with the host reading it: the price of
        `max_skips`, paid only where it is set."""
        def step(done, skipped, streak, stop, totals, state):
            step_skipped, totals, state = self._next_step(iterator, totals, stamps, state)
            skipped += tf.cast(step_skipped, tf.int64)
            if self.max_skips:  # skipped steps in a row: `max_skips` of them end the loop
                streak = tf.where(step_skipped, streak + 1, tf.constant(0, tf.int64))
                stop = streak >= self.max_skips
            return done + 1, skipped, streak, stop, totals, state

        # The streak is loop-carried; its variable is written once, after the loop.
        streak = (tf.convert_to_tensor(self._skip_streak) if self.max_skips
                  else tf.constant(0, tf.int64))

        def goes_on(done, skipped, streak, stop, *_):
            more = self._goes_on(done, num_steps)
            return tf.logical_and(tf.logical_not(stop), more) if self.max_skips else more

        _, skipped, streak, _, totals, state = tf.while_loop(
            goes_on, step, (tf.constant(0), tf.constant(0, tf.int64), streak,
                            tf.constant(False), totals, state))
        if self.max_skips:
            self._skip_streak.assign(streak)
        return totals, skipped, state

    def request_stop(self) -> None:
        """Ends the running loop after its current step (any thread: a
        signal's relay, while the main thread waits in the loop); every
        later loop then makes one step. Where the trainer cannot stop
        between steps (a cluster), nothing: the stop comes at the loop's end."""
        if self._stop_flag is not None:
            self._stop_flag.assign(True)

    def _goes_on(self, done, num_steps):
        """The loop's condition: `done < num_steps`, and, after the loop's
        first step, no stop requested. Host values only (the counters, the
        flag in host memory): nothing a step computes on a device decides
        whether the next one starts, so the host queues each step's kernels
        while the previous ones run. The first step always runs, so a loop
        always advances the global step (the Controller's contract)."""
        more = done < num_steps
        if self._stop_flag is None:
            return more
        with tf.device(self._stop_flag.device):
            return tf.logical_and(more, tf.logical_or(
                tf.equal(done, 0), tf.logical_not(self._stop_flag.read_value())))

    def _next_step(self, iterator, totals, stamps: StepStamps, state):
        """One step of the loop on the next batch (or the batch kept on the devices)."""
        if self._device_batch is not None:
            batch = self._device_batch
        else:
            batch = self.step_phase.next(iterator)  # marked, for a hang dump
        state = stamps.input(state, self.strategy.experimental_local_results(batch))
        return self._step(batch, totals, stamps, state)

    def _step(self, batch, totals, stamps: StepStamps, state):
        """One step of the loop: every objective on `batch`, then the global
        step counted. Returns whether an update was skipped (None when no
        step can be), the running sums with this step's added, and the stamps' state."""
        graph = tf.compat.v1.get_default_graph()  # the loop body's: its checks, below
        first_op = len(graph.get_operations())
        schedules.assign(self.objectives, self.global_step)  # a rate that varies by step
        step_skipped, totals = None, list(totals)
        for index, objective in enumerate(self.objectives):
            objective_skipped, span, totals[index] = self._run_objective(
                index, objective, batch, totals[index], stamps)
            if objective_skipped is not None:
                step_skipped = (objective_skipped if step_skipped is None
                                else tf.logical_or(step_skipped, objective_skipped))
            state = stamps.all_reduce(state, span)
        # Once the updates are applied: read after each optimizer's step count.
        applied = ([step_skipped] if step_skipped is not None else []) + [
            tf.identity(objective.optimizer.iterations) for objective in self.objectives]
        state = stamps.step_end(state, applied)
        if self.average is not None:
            self.average.update(self.global_step)
        # After the step's updates: ops on different variables are not
        # ordered in a tf.function, so a step whose batch or loss failed
        # could still be counted (unsaved_step 31 where 30 trained).
        # The step's own checks too (a task's tf.debugging.assert_*: nothing
        # the update reads depends on them, so a failing one raced the count).
        checks = [op for op in graph.get_operations()[first_op:] if op.type in _CHECKS]
        # And after this step's losses (its sums): they need the batch, so a
        # batch that failed is never counted, even where no finiteness check
        # ties the count to the gradients (the optimizer's count alone raced it).
        losses = [value for total in totals
                  for value in self.strategy.experimental_local_results(total)]
        with tf.control_dependencies(applied + checks + losses), tf.name_scope(COUNT_SCOPE):
            self.global_step.assign_add(1)
        return step_skipped, totals, state

    def _run_objective(self, index, objective, batch, totals, stamps: StepStamps):
        """One objective's replicated step, on the steps it runs at (`every`):
        whether its update was skipped (None when it cannot be), in a sampled
        loop its all-reduce's seconds (`engine.observe.step_time`: the last
        replica's arrival to the last one's result), and its running sums."""
        step = functools.partial(self._replica_step, index, stamps)

        def run():
            skipped, ready, done, summed = self.strategy.run(step, args=(batch, totals))
            local = self.strategy.experimental_local_results
            span = stamps.span(local(ready), local(done)) if ready is not None else None
            return (self._first_replica(skipped) if skipped is not None else None), span, summed

        if objective.every == 1:
            return run()

        def ran():  # tf.cond's branches return alike: a zero span where none is taken
            skipped, span, summed = run()
            return (skipped if skipped is not None else tf.constant(False),
                    span if span is not None else tf.constant(0.0, tf.float64), summed)

        return tf.cond(self.global_step % objective.every == 0, ran,
                       lambda: (tf.constant(False), tf.constant(0.0, tf.float64), totals))

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

    def _replica_step(self, index, stamps, batch, totals):
        objective = self.objectives[index]
        if objective.train_step is not None:
            return self._whole_step(index, stamps, batch, totals)
        variables = list(objective.variables)
        grads, reported_loss, metrics = self._gradients[index](batch)
        present = [i for i, g in enumerate(grads) if g is not None]
        # Sampled loops (engine.observe.step_time): the all-reduce starts after `ready`.
        held, ready = stamps.ready([grads[i] for i in present])
        # The one all-reduce of this objective's gradients, through the selected collective.
        reduced = tf.distribute.get_replica_context().merge_call(
            self._all_reduce, args=(held, [variables[i] for i in present])
        )
        done = stamps.done(reduced)
        grad_norm, reduced = self._norm_and_clip(objective.optimizer, reduced)
        updated = [variables[i] for i in present]
        # The same on every replica: the reduced gradients are. Only where a
        # step can be skipped: otherwise the loop checks its means afterwards.
        finite_step = tf.math.is_finite(grad_norm) if self._skipping else None
        if self.options.skips_steps and not _scales_loss(objective.optimizer):
            tf.distribute.get_replica_context().merge_call(
                functools.partial(self._apply_if_finite, objective.optimizer, updated),
                args=(reduced, finite_step))
        else:  # a LossScaleOptimizer skips a non-finite step by itself
            objective.optimizer.apply_gradients(zip(reduced, updated))

        count = _examples(reported_loss)
        # One norm per step, weighed by the examples so the loop's mean is the steps' mean.
        step_totals = self._sums[index].step_totals(count, {
            "loss": reported_loss, **metrics, GRAD_NORM: grad_norm * count})
        if finite_step is None:
            return None, ready, done, totals + step_totals
        # A skipped step stays out of the loop's means, its example count too.
        step_totals = tf.where(finite_step, step_totals, tf.zeros_like(step_totals))
        return tf.logical_not(finite_step), ready, done, totals + step_totals

    def _whole_step(self, index, stamps, batch, totals):
        """The task's whole step (`Task.train_step`: a Keras model's own
        `train_step`) on one replica: it applies its own update, and its
        gradients reach the one all-reduce through `WholeStep.all_reduce`,
        which also gives the step's `grad_norm` and the sampled loops'
        marks. A step that never all-reduces reports a norm of 0."""
        objective = self.objectives[index]
        marks = {}

        def all_reduce(grads, variables):
            held, ready = stamps.ready(list(grads))
            reduced = tf.distribute.get_replica_context().merge_call(
                self._all_reduce, args=(held, list(variables)))
            marks.update(ready=ready, done=stamps.done(reduced),
                         norm=tf.linalg.global_norm(reduced))
            return reduced

        step = WholeStep(all_reduce=all_reduce, optimizer=objective.optimizer,
                         global_batch_size=self.global_batch_size)
        reported_loss, metrics = whole_step_output(objective.train_step, self.model, batch, step)
        count = _examples(reported_loss)
        grad_norm = marks.get("norm", tf.constant(0.0))
        step_totals = self._sums[index].step_totals(count, {
            "loss": reported_loss, **metrics, GRAD_NORM: grad_norm * count})
        # Its optimizer skips a step itself, if at all (a LossScaleOptimizer).
        skipped = tf.constant(False) if self._skipping else None
        return skipped, marks.get("ready"), marks.get("done"), totals + step_totals

    def _norm_and_clip(self, optimizer, reduced):
        """The reduced gradients' global norm (the train metric) and the
        gradients clipped to `clip_norm`. Under mixed_float16 the reduced
        gradients are still multiplied by the loss scale (the optimizer divides
        it out): the norm is taken of the real ones, and clipped alike."""
        norm = tf.linalg.global_norm(reduced)
        scale = precision.loss_scale(optimizer) if _scales_loss(optimizer) else None
        grad_norm = norm / scale if scale is not None else norm
        if self.clip_norm:
            limit = self.clip_norm * scale if scale is not None else self.clip_norm
            reduced, _ = tf.clip_by_global_norm(reduced, limit, use_norm=norm)
        return grad_norm, reduced

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
        return self.step_phase.all_reduce(
            strategy, lambda: self.collective.batch_all_reduce(grads, destinations), grads)
