"""Where in its step the compiled loop is, for the hang dump (`engine.runtime.hang`).

A hang dump's thread reads, from outside the running loop, three counters
of this worker, and the phase follows from how they compare::

    batches    += 1  once a step's batch has arrived       (one op per step)
    reductions += 1  once a step's gradients are computed,
                     as its all-reduce starts              (one op per step, 2+ replicas)
    global_step += 1 once the step's updates are applied   (the trainer's own count)

    batches == global_step       input: waiting on next(iterator)
    reductions < batches         step: forward and backward
    otherwise                    all-reduce, or the update after it

`begin` sets both counters to the global step once per loop, outside the
steps. Each mark is one `assign_add` on the first replica's device, ordered
after the step's tensors on the devices: nothing in it waits for the host,
so every loop keeps the marks (a hang can come in any loop), unlike the
per-step stamps of sampled loops (`engine.observe.step_time`). Two counters
and the global step cost a step half the variable writes of a phase number
assigned at each of four points (issue 30: the engine's per-step cost).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

#: The phases of the compiled step, as `StepPhase.describe_phase` names them.
INPUT = "input (waiting on next(iterator), the tf.data pipeline)"
STEP = "step (forward, backward, update)"
FORWARD_BACKWARD = "step (forward and backward)"
ALL_REDUCE = "all-reduce (the gradients' collective), or the update after it"


class StepPhase:
    """The phase of this worker's compiled step, marked inside the loop and
    read from outside by the hang dump.

    Plain variables on this worker (created outside any strategy scope, on
    `device`: the first replica's): never reduced, each worker keeps its own.

    Args:
      global_step: the run's step counter (the loop adds 1 after each step's updates).
      device: the first replica's device.
      takes_input: False when every step trains on one batch kept on the
        devices (`--synthetic_on_device`): no step waits on input.
    """

    def __init__(self, global_step: tf.Variable, device: Optional[str] = None, *,
                 takes_input: bool = True):
        self.device = device
        self.global_step = global_step
        self.takes_input = takes_input
        self._reduces = False  # whether any step marked an all-reduce (2+ replicas)
        with tf.device(device):
            self.batches = tf.Variable(0, dtype=tf.int64, trainable=False, name="phase_batches")
            self.reductions = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name="phase_reductions")

    def begin(self) -> None:
        """At the start of a loop, before its steps: both counters at the global step."""
        with tf.device(self.device):
            step = tf.convert_to_tensor(self.global_step)
            self.batches.assign(step)
            self.reductions.assign(step)

    def next(self, iterator):
        """`next(iterator)`, marked once the batch has arrived (inside the compiled loop)."""
        batch = next(iterator)
        with tf.device(self.device), tf.control_dependencies(_tensors(batch)):
            self.batches.assign_add(1)
        return batch

    def all_reduce(self, strategy, reduce: Callable[[], Sequence], grads: Sequence):
        """`reduce()`, the all-reduce of `grads`, marked once every replica's
        gradients are computed (in the cross-replica context of the step's
        merge_call). The collective is not made to wait for the mark: it may
        start on the first gradients while the backward pass computes the others."""
        self._reduces = True
        after = [t for g in grads for t in strategy.experimental_local_results(g)]
        with tf.device(self.device), tf.control_dependencies(after):
            self.reductions.assign_add(1)
        return reduce()

    def describe_phase(self) -> str:
        """The phase, read from outside the loop (the hang dump's thread).
        The global step first: the counters only grow, so one that moves
        between the reads is read at or past it."""
        step = int(tf.convert_to_tensor(self.global_step).numpy())
        reductions = int(self.reductions.numpy())
        batches = int(self.batches.numpy())
        if self.takes_input and batches <= step:
            return INPUT
        if not self._reduces:
            return STEP
        return FORWARD_BACKWARD if reductions < max(batches, step + 1) else ALL_REDUCE


def _tensors(structure) -> list:
    return [t for t in tf.nest.flatten(structure, expand_composites=True)
            if isinstance(t, tf.Tensor)]
