"""The all-reduce loops `bench.collectives` times, their inputs, and the check of their sums.

Timing runs the all-reduce `n` times in a `tf.while_loop` inside one
`tf.function` call (`chained_loop`), so Python runs once per sample, not once
per all-reduce::

    loop(n):  x = inputs
              repeat n times:  x = all_reduce(x)   # each waits for the last

Correctness is checked on a separate single call (`once`) against the numpy
sum of the inputs (`check_sums`). The same loop drives a `Collective`
(`reduce_via_layer`) and TF's cross-device ops called directly
(`reduce_direct`), which is how the plug-in overhead is measured.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfloop.collectives import _values
from tfloop.collectives.base import CrossDeviceOpsCollective
from tfloop.collectives.interface import Collective

#: `reduce_fn(values, destinations) -> reduced values`: what a loop repeats.
ReduceFn = Callable[[list, list], list]


def make_inputs(
    devices: Sequence[str], specs: Sequence[tuple[Sequence[int], str]], seed: int
) -> tuple[list[Any], list[np.ndarray]]:
    """PerReplica values of the given (shape, dtype) specs, and their sums.

    Values are uniform in [0.5, 1.5): all positive, so a sum has no
    cancellation and its relative error is bounded by (replicas) x (unit
    roundoff) whatever the summation order.
    """
    rng = np.random.default_rng(seed)
    values, sums = [], []
    for shape, dtype in specs:
        np_dtype = tf.as_dtype(dtype).as_numpy_dtype
        total = np.zeros(shape, np.float64)
        parts = []
        for device in devices:
            array = rng.uniform(0.5, 1.5, size=shape).astype(np.float32).astype(np_dtype)
            total += array.astype(np.float64)
            with tf.device(device):
                parts.append(tf.identity(tf.constant(array)))
            del array
        values.append(_values.per_replica(parts))
        sums.append(total)
    return values, sums


def chained_loop(reduce_fn: ReduceFn, values: list, destinations: Optional[list]):
    """A `tf.function` running `reduce_fn` n times in sequence; see module doc.

    Each all-reduce takes the previous one's sums as its input, the loop
    counter waits for them, and the sums are returned. With the same inputs
    every time and only the counter fetched, Grappler hoisted or pruned the
    stateless reductions (TF's hierarchical copy, reduce to one device):
    measured, a 64 MiB "all-reduce" took 0.1-0.2 ms instead of 40 ms. Sums
    grow by the replica count per iteration and may overflow to inf, which
    costs the same to add; correctness is checked on a separate single call.
    What a call returns is one element per device, to be fetched: that is
    when the last all-reduce has really finished (on a GPU too).
    """
    devices = [_values.devices_of(v) for v in values]

    @tf.function(autograph=False)
    def loop(n):
        def body(i, *flat):
            current, start = [], 0
            for value_devices in devices:
                parts = []
                for device, part in zip(value_devices, flat[start:]):
                    with tf.device(device):  # loop variables forget their device
                        parts.append(tf.identity(part))
                current.append(_values.per_replica(parts))
                start += len(value_devices)
            out = reduce_fn(current, destinations if destinations is not None else current)
            out = [c for o in out for c in _values.components(o)]
            with tf.control_dependencies(out):  # the next iteration waits for these sums
                return [i + 1] + out

        flat = [c for v in values for c in _values.components(v)]
        results = tf.while_loop(lambda i, *_: i < n, body, [tf.constant(0)] + flat)
        # One element of each device's last sum. A GPU kernel is still running
        # when the call returns; fetching these (`timing.fetched`) waits for
        # every kernel queued on each device, for a few bytes of copying.
        tails = []
        for device, result in zip(flat_devices, results[1:]):
            with tf.device(device):
                tails.append(tf.reshape(result, [-1])[:1])
        return tails

    flat_devices = [device for value_devices in devices for device in value_devices]
    return loop


def once(reduce_fn: ReduceFn, values: list, destinations: Optional[list]):
    """A `tf.function` calling `reduce_fn` once; returns every device's result."""
    @tf.function(autograph=False)
    def call():
        out = reduce_fn(values, destinations if destinations is not None else values)
        return [[tf.identity(c) for c in _values.components(o)] for o in out]

    return call


def graph_ops(loop) -> int:
    """Nodes in a traced loop, its while body and every function it calls."""
    graph_def = loop.get_concrete_function(tf.TensorSpec([], tf.int32)).graph.as_graph_def()
    return len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)


def check_sums(outputs: list[list[Any]], sums: list[np.ndarray]) -> float:
    """The largest relative error of any device's result against the numpy sum."""
    worst = 0.0
    for per_device, want in zip(outputs, sums):
        for got in per_device:
            got = np.asarray(got.numpy(), np.float64)
            if got.shape != want.shape:
                return math.inf
            if want.size:
                worst = max(worst, float(np.max(np.abs(got - want) / np.abs(want))))
    return worst


def reduce_via_layer(collective: Collective) -> ReduceFn:
    """All-reduce through our `Collective` layer."""
    return lambda values, destinations: collective.batch_all_reduce(values, destinations)


def reduce_direct(ops: tf.distribute.CrossDeviceOps, options) -> ReduceFn:
    """All-reduce through TF's cross-device ops object, called directly."""
    return lambda values, destinations: ops.batch_reduce(
        tf.distribute.ReduceOp.SUM, list(zip(values, destinations)), options=options)


def tf_ops_of(collective: Collective, value: Any):
    """TF's cross-device ops object (and its call options) that reduces
    `value` through `collective`, if that is exactly one; else None."""
    target = collective.collective_for(value) if hasattr(collective, "collective_for") else collective
    if isinstance(target, CrossDeviceOpsCollective):
        return target.cross_device_ops(_values.devices_of(value)), target.communication_options
    return None
