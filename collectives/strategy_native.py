"""`strategy`: the all-reduce of the strategy in scope, for multi-worker training.

`MultiWorkerMirroredStrategy` sums across machines with TensorFlow's collective
ops, configured once by its `CommunicationOptions` (the implementation ring,
NCCL or auto, `bytes_per_pack`, a timeout). The engine builds the strategy
with those options from `--collective` and `--pack_bytes` and selects this
collective, so the trainer's one explicit all-reduce goes through them. It
never shortcuts a single *local* replica: the sum is across workers.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfloop.collectives import registry
from tfloop.collectives.interface import Collective


@registry.register("strategy")
class StrategyNative(Collective):
    #: Packing is the strategy's own `bytes_per_pack`, set when it is built.
    native_options = frozenset({"pack_bytes"})
    #: One local replica still sums across the workers.
    shortcut_single_replica = False

    def __init__(self, *, pack_bytes: int = 0):
        self.pack_bytes = pack_bytes

    def _sum_replicas(self, values: list[Any], destinations: list[Any]) -> list[Any]:
        return tf.distribute.get_strategy().extended.batch_reduce_to(
            tf.distribute.ReduceOp.SUM, list(zip(values, destinations))
        )

    def describe(self) -> str:
        return "strategy" + (f"(bytes_per_pack={self.pack_bytes})" if self.pack_bytes else "")
