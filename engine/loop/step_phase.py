"""Where in its step the compiled loop is, for the hang dump (`engine.runtime.hang`).

`StepPhase` marks the phase inside every step (input, step, all-reduce) in a
variable the hang dump's thread reads from outside. The marks are variable
writes on the first replica's device, ordered after the step's tensors on
the devices: nothing in them waits for the host, so every loop keeps them
(a hang can come in any loop), unlike the per-step stamps of sampled loops
(`engine.observe.step_time`).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

#: The phases of the compiled step, as `StepPhase.phase` holds them.
PHASES = {0: "not in a step", 1: "input (waiting on next(iterator), the tf.data pipeline)",
          2: "step (forward, backward, update)", 3: "all-reduce (the gradients' collective)"}


class StepPhase:
    """The phase of this worker's compiled step, set inside the loop and read
    from outside by the hang dump.

    A plain variable on this worker (created outside any strategy scope, on
    `device`: the first replica's): never reduced, each worker keeps its own.
    """

    def __init__(self, device: Optional[str] = None):
        self.device = device
        with tf.device(device):
            self.phase = tf.Variable(0, dtype=tf.int32, trainable=False, name="clock_phase")

    def _mark(self, value: int, after: Sequence = ()):
        with tf.device(self.device), tf.control_dependencies(list(after)):
            self.phase.assign(value)

    def next(self, iterator):
        """`next(iterator)`, its phase marked (inside the compiled loop)."""
        self._mark(1)
        batch = next(iterator)
        self._mark(2, _tensors(batch))
        return batch

    def all_reduce(self, strategy, reduce: Callable[[], Sequence], grads: Sequence):
        """`reduce()`, the all-reduce of `grads`, its phase marked (in the
        cross-replica context of the step's merge_call). The collective is not
        made to wait for the mark: it may start on the first gradients while
        the backward pass computes the others."""
        self._mark(3, [t for g in grads for t in strategy.experimental_local_results(g)])
        reduced = reduce()
        self._mark(2, [t for r in reduced for t in strategy.experimental_local_results(r)])
        return reduced

    def describe_phase(self) -> str:
        """The phase, read from outside the loop (the hang dump's thread)."""
        return PHASES.get(int(self.phase.numpy()), "unknown")


def _tensors(structure) -> list:
    return [t for t in tf.nest.flatten(structure, expand_composites=True)
            if isinstance(t, tf.Tensor)]
