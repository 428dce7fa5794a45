"""The contracts of what the Controller drives: a train runner and an eval runner.

As in Orbit (`orbit/runner.py`), the outer loop knows two methods and
nothing else about how steps are run::

    trainer.train(num_steps)   -> metrics   # one loop: the global step advances by num_steps
    evaluator.evaluate(num_steps) -> metrics   # one evaluation; -1: the whole dataset

`engine.loop.trainer.Trainer` (a compiled `tf.while_loop` under any synchronous
strategy), `engine.loop.ps_trainer.ParameterServerTrainer` (closures scheduled on
the workers) and `engine.loop.evaluator.Evaluator` declare that they implement
these by subclassing, so the Controller can refuse anything else at
construction instead of failing at the first loop.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

if TYPE_CHECKING:  # annotations only: this contract module imports no TensorFlow
    from tfloop.engine.loop.step_phase import StepPhase

#: Mean metrics of one loop or evaluation by name (`loss`, the loss
#: function's metrics, and `examples`, the number of examples seen).
Metrics = dict[str, float]


class AbstractTrainer(abc.ABC):
    """Runs training steps in loops; the Controller calls `train` once per loop.

    What the rooms above may read of a trainer, declared here so they read
    it as typed attributes (None where a trainer has none: the
    parameter-server trainer's steps run on other machines):

      strategy       the `tf.distribute.Strategy` it runs under
      clock          its `LoopClock` (`engine.observe.clock.SampledClock`: timed)
      step_phase     the phase inside the compiled step, for a hang dump
      train_dataset  the `tf.data` pipeline it trains on
      input_probe    `() -> tf.data.Dataset or None`: the same data built
                     afresh, for a probe of the input's own rate (never the
                     pipeline above: a second iterator of a reshuffling
                     dataset takes the seeds of the run's later epochs)
    """

    strategy: Any = None
    clock: Optional[LoopClock] = None
    step_phase: Optional[StepPhase] = None
    train_dataset: Any = None
    input_probe: Optional[Callable[[], Any]] = None

    def request_stop(self) -> None:
        """Asks the running loop to end after its current step (from any
        thread: a signal's relay); the next loops then make one step each. A
        trainer that cannot stop between steps does nothing: its loop ends
        as planned, and the stop comes at its end."""

    @abc.abstractmethod
    def train(self, num_steps: int) -> Metrics:
        """Runs `num_steps` training steps and returns their mean metrics.

        Advances the global step by `num_steps`, or by fewer (at least one)
        after `request_stop` (the Controller reads the step from its
        variable, so a runner that may count a step twice, like the
        parameter-server trainer, stays truthful).
        """


class AbstractEvaluator(abc.ABC):
    """Evaluates the model as it stands; the Controller calls `evaluate` once per evaluation.

    The engine's evaluators (`engine.loop.evaluator`) also say what they
    report, which the best checkpoint's request is checked against:

      metric_names   what `evaluate` reports besides `examples` (`loss` first)
    """

    metric_names: Sequence[str]

    @abc.abstractmethod
    def evaluate(self, num_steps: int = -1) -> Metrics:
        """Evaluates `num_steps` batches (all of a finite dataset when -1);
        returns mean metrics and `examples`, the number of examples seen."""


class StepStamps:
    """Inside the compiled loop: the points where a *sampled* loop takes its
    per-step stamps (`engine.observe.step_time.Stamps`). This base takes none
    and adds no op to the graph: an unsampled loop holds no `Timestamp`, and
    nothing in it waits for the host. The trainer's loop reads::

        state = stamps.start()                          # loop-carried ({} here)
        for each step:
            batch = next(iterator)
            state = stamps.input(state, batch)          # the input wait
            on each replica:  grads, ready = stamps.ready(grads)   # all-reduce after `ready`
                              reduced = all-reduce(grads); done = stamps.done(reduced)
            state = stamps.all_reduce(state, stamps.span(readies, dones))
            state = stamps.step_end(state, the update's tensors)
        return stamps.totals(state)                     # seconds by part ({} here)
    """

    def start(self) -> dict:
        return {}

    def input(self, state: dict, batch) -> dict:
        return state

    def ready(self, grads: list) -> tuple[list, Any]:
        return grads, None

    def done(self, reduced) -> Any:
        return None

    def span(self, readies, dones) -> Any:
        return None

    def all_reduce(self, state: dict, span) -> dict:
        return state

    def step_end(self, state: dict, tensors) -> dict:
        return state

    def totals(self, state: dict) -> dict:
        return {}


class LoopClock:
    """How a trainer lets timing in, at its three points; this base times
    nothing (the do-nothing default). `engine.observe.clock.SampledClock` is
    the engine's: wall time for every loop, per-step stamps in sampled loops.

        with_stamps = clock.begin(start_step)        # host, before the loop: stamp this one?
        loop(..., stamps=clock.stamps(with_stamps))  # traced once per value
        metrics |= clock.end(trainer, start=, steps=, stamped=)   # host, once the loop's
                                                 # results are fetched: its wall time ends

    The trainer knows nothing else about timing: `end` returns the metrics
    the clock adds (`mfu`) and runs its one-time probes where it likes.
    """

    #: The devices' peak rate (`engine.runtime.hardware.Peak`), when known.
    peak: Any = None
    #: FLOPs of one step, once counted.
    flops: Optional[float] = None
    #: The last loop's time (`engine.observe.step_time.LoopTime`), when timed.
    last: Any = None

    def begin(self, start_step: int) -> bool:
        return False

    def stamps(self, with_stamps: bool) -> StepStamps:
        return StepStamps()

    def end(self, trainer: AbstractTrainer, *, start: int, steps: int, stamped: dict) -> Metrics:
        return {}
