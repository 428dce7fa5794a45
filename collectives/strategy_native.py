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

from collectives import _values, registry
from collectives.interface import Collective, Destinations, PerReplicaGradients


@registry.register("strategy")
class StrategyNative(Collective):
    #: Packing is the strategy's own `bytes_per_pack`, set when it is built.
    native_options = frozenset({"pack_bytes"})

    def __init__(self, *, pack_bytes: int = 0):
        self.pack_bytes = pack_bytes

    @tf.autograph.experimental.do_not_convert
    def batch_all_reduce(self, values: PerReplicaGradients, destinations: Destinations) -> list[Any]:
        values, destinations = _values.prepare_batch(values, destinations)
        return tf.distribute.get_strategy().extended.batch_reduce_to(
            tf.distribute.ReduceOp.SUM, list(zip(values, destinations))
        )

    def describe(self) -> str:
        return "strategy" + (f"(bytes_per_pack={self.pack_bytes})" if self.pack_bytes else "")
