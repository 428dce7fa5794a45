"""Small helpers over `tf.distribute` values shared by the collectives.

In cross-replica context a gradient is a `DistributedValues` (one tensor per
replica, `.values`), or a plain tensor when the strategy has one replica. The
wrappers take values apart per device, transform each component on its own
device, and put them back together; these helpers keep that in one place.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from tfloop.collectives import _tf_private

ReduceOp = tf.distribute.ReduceOp


def is_distributed(value: Any) -> bool:
    return isinstance(value, tf.distribute.DistributedValues)


def components(value: Any) -> tuple[Any, ...]:
    """The per-replica tensors of `value` (a 1-tuple for a plain tensor)."""
    return tuple(value.values) if is_distributed(value) else (value,)


def devices_of(value: Any) -> tuple[str, ...]:
    """The devices `value` lives on: one per component, or the device string."""
    if isinstance(value, str):
        return (value,)
    return tuple(getattr(c, "device", "") for c in components(value))


def as_destination(destination: Any) -> Any:
    """A destination `tf.distribute` understands.

    A Keras 3 variable wraps the `tf.Variable` (a MirroredVariable under a
    strategy) in `.value`; TF's cross-device ops need the wrapped one.
    """
    if isinstance(destination, (str, tf.Variable, tf.distribute.DistributedValues, tf.Tensor)):
        return destination
    inner = getattr(destination, "value", None)
    if isinstance(inner, (tf.Variable, tf.distribute.DistributedValues)):
        return inner
    return destination


def replica_devices(value: Any) -> tuple[str, ...]:
    """The device of each replica of a distributed `value`.

    Read from the components; a traced function's inputs carry no device, so
    then from the strategy in scope (cross-replica context, as in
    `merge_call`), whose worker devices are the replicas' devices in order.
    """
    devices = devices_of(value)
    if all(devices) and len(set(devices)) == len(devices):
        return devices
    workers = (
        tuple(tf.distribute.get_strategy().extended.worker_devices)
        if tf.distribute.has_strategy() else ()
    )
    if len(workers) == len(devices):
        return workers
    raise ValueError(
        f"cannot tell which device each of the {len(devices)} replicas' values is on "
        f"(their devices: {list(devices)}); create them under tf.device, or call "
        "batch_all_reduce inside the strategy's scope"
    )


def prepare_batch(
    values: Sequence[Any], destinations: Sequence[Any]
) -> tuple[list[Any], list[Any]]:
    """Lists `values` and `destinations`, checking they pair up one to one."""
    values, destinations = list(values), list(destinations)
    if len(values) != len(destinations):
        raise ValueError(
            f"batch_all_reduce got {len(values)} values but {len(destinations)} "
            "destinations; pass one destination (the variable) per gradient"
        )
    return values, [as_destination(d) for d in destinations]


def is_packable(value: Any) -> bool:
    """A dense tensor per replica whose size is known while tracing."""
    return all(
        isinstance(c, tf.Tensor) and c.shape.is_fully_defined() for c in components(value)
    )


def is_empty(value: Any) -> bool:
    """True when every component is known, while tracing, to hold no element."""
    return is_packable(value) and components(value)[0].shape.num_elements() == 0


def map_components(fn: Callable[[Any], Any], value: Any, *, mirrored: bool) -> Any:
    """Applies `fn` to every component on that component's device.

    Returns a Mirrored value when `mirrored` (results of an all-reduce), a
    PerReplica value otherwise (inputs to one).
    """
    out = []
    for c in components(value):
        with tf.device(c.device):
            out.append(fn(c))
    return _tf_private.mirrored(out) if mirrored else _tf_private.per_replica(out)


def per_replica(tensors: Sequence[tf.Tensor]) -> Any:
    return _tf_private.per_replica(tensors)


def mirrored(tensors: Sequence[tf.Tensor]) -> Any:
    return _tf_private.mirrored(tensors)


def is_mirrored(value: Any) -> bool:
    """A distributed value holding one copy per device (a reduced result),
    not one different value per replica (PerReplica: still to be reduced)."""
    return _tf_private.is_mirrored(value)


def nbytes(value: Any) -> int:
    """Bytes of one replica's component (0 when unknown while tracing)."""
    c = components(value)[0]
    if not isinstance(c, tf.Tensor) or not c.shape.is_fully_defined():
        return 0
    return c.shape.num_elements() * c.dtype.size
