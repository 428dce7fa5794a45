"""Running sums kept per replica and reduced only when read.

A step adds each replica's sums to its own copy of a `SyncOnRead` variable,
so accumulating costs no communication; one cross-replica reduction happens
when a loop reads the result. Means are sum / example count, so partial and
empty per-replica batches weigh exactly by the examples they hold.

The train loop keeps its sums cheaper still (issue 30: the engine's per-step
cost): each replica carries one vector of them through the loop's
`tf.while_loop` (`zeros`, `step_totals`, added by the loop) and `assign`s it to
its copies once, after the loop; no variable is written per step.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import tensorflow as tf

EXAMPLES = "examples"


class ReplicaSums:
    def __init__(self, strategy: tf.distribute.Strategy, names: Iterable[str]):
        self._names = [EXAMPLES] + [n for n in names if n != EXAMPLES]
        with strategy.scope():
            self._sums = {
                name: tf.Variable(
                    0.0,
                    trainable=False,
                    name=f"sum_{name}",
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.SUM,
                )
                for name in self._names
            }

    def add(self, num_examples: tf.Tensor, values: Mapping[str, tf.Tensor]) -> None:
        """Replica context: adds this replica's per-example `values` (summed)."""
        self._sums[EXAMPLES].assign_add(tf.cast(num_examples, tf.float32))
        for name, value in values.items():
            self._sums[name].assign_add(tf.reduce_sum(tf.cast(value, tf.float32)))

    def zeros(self) -> tf.Tensor:
        """Replica context: a loop's first totals (`step_totals`'s layout)."""
        return tf.zeros([len(self._names)], tf.float32)

    def step_totals(self, num_examples: tf.Tensor, values: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """Replica context: this replica's per-example `values`, summed, and the
        example count, as one vector (the loop adds it to its totals)."""
        by_name = {EXAMPLES: tf.cast(num_examples, tf.float32), **{
            name: _summed(tf.cast(value, tf.float32)) for name, value in values.items()}}
        return tf.stack([by_name[name] if name in by_name else 0.0 for name in self._names])

    def assign(self, totals: tf.Tensor) -> None:
        """Replica context: this replica's copies set to a loop's `totals`."""
        for index, name in enumerate(self._names):
            self._sums[name].assign(totals[index])

    def reset(self) -> None:
        """Cross-replica context: zeroes every replica's copy."""
        for variable in self._sums.values():
            variable.assign(0.0)

    def means(self) -> dict[str, tf.Tensor]:
        """Cross-replica context: {name: sum over replicas / examples}, plus the count."""
        totals = {name: tf.convert_to_tensor(v) for name, v in self._sums.items()}
        count = totals[EXAMPLES]
        means = {
            name: tf.math.divide_no_nan(total, count)
            for name, total in totals.items()
            if name != EXAMPLES
        }
        means[EXAMPLES] = count
        return means


def _summed(value: tf.Tensor) -> tf.Tensor:
    """`value`'s sum; a scalar as it is (no reduction op for it)."""
    return value if value.shape.rank == 0 else tf.reduce_sum(value)
