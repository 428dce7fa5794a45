"""Every private `tensorflow.python` symbol the collectives package uses.

They live here, and only here, because TensorFlow exports no public equivalent:

* `CollectiveAllReduce` is TF's all-reduce over collective ops, the one whose
  `CommunicationOptions(implementation=RING)` gives the ring all-reduce.
  `tf.distribute.MirroredStrategy` builds one internally as its default, but
  never exports the class, and reaching it through the strategy would also be
  private (`strategy.extended._collective_ops`).
* `CollectiveKeys` allocates the group and instance keys it needs. Every
  `MirroredStrategy` starts its keys at 1, and TensorFlow refuses a second
  device set under a group key it has seen ("joining a group with size 2, but
  that group has size 4"), so each ring gets its own key range from here.
* `PerReplica` and `Mirrored` are the distributed values the wrappers (packing,
  compression) rebuild from per-device tensors. The only public constructor,
  `Strategy.experimental_distribute_values_from_function`, needs the strategy
  in scope, numbers replicas globally (wrong for the local values of one
  worker) and makes only `PerReplica` values; results must be `Mirrored`.
* `op_def_registry` answers which dtypes a registered op accepts
  (`op_dtypes`): NCCL's are read from it rather than written down, so a
  TensorFlow that adds bfloat16 to `NcclAllReduce` is followed without a
  change here. `tf.raw_ops` exposes the ops, not their definitions.

`tests/collectives/test_collectives_tf_private.py` imports and exercises
each of them, so a TensorFlow release that moves one fails that test by name
instead of failing a training run.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as _cross_device_ops
from tensorflow.python.distribute import cross_device_utils as _cross_device_utils
from tensorflow.python.distribute import values as _values
from tensorflow.python.framework import op_def_registry as _op_def_registry

CollectiveAllReduce = _cross_device_ops.CollectiveAllReduce
CollectiveKeys = _cross_device_utils.CollectiveKeys


def per_replica(tensors: Sequence[tf.Tensor]) -> tf.distribute.DistributedValues:
    """A PerReplica value holding `tensors`, one per replica, in replica order."""
    return _values.PerReplica(tuple(tensors))


def mirrored(tensors: Sequence[tf.Tensor]) -> tf.distribute.DistributedValues:
    """A Mirrored value holding `tensors`: equal values, one copy per device."""
    return _values.Mirrored(tuple(tensors))


def is_mirrored(value) -> bool:
    """True for a Mirrored value (a MirroredVariable too), False for PerReplica."""
    return isinstance(value, _values.Mirrored)


def op_dtypes(op_name: str, attr: str = "T") -> tuple[tf.DType, ...]:
    """The dtypes TensorFlow registered for `attr` of the op `op_name`
    (empty when the op or the attribute is unknown, or takes any dtype)."""
    op_def = _op_def_registry.get(op_name)
    for op_attr in op_def.attr if op_def is not None else ():
        if op_attr.name == attr:
            return tuple(tf.dtypes.as_dtype(t) for t in op_attr.allowed_values.list.type)
    return ()
