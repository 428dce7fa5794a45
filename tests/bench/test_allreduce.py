"""tfloop.bench.allreduce: the timed all-reduce loop really chains its all-reduces."""

import numpy as np
import tensorflow as tf

from tfloop import collectives
from tfloop.bench import allreduce


def test_timed_loop_chains_one_all_reduce_per_iteration(cpu_devices):
    """The while loop really all-reduces `n` times, each on the last one's sums
    (so Grappler can neither hoist nor prune it), and is traced once."""
    traced = []
    values, sums = allreduce.make_inputs(cpu_devices, [((8,), "float32")], seed=0)
    collective = collectives.create("reduce_to_one_device", devices=cpu_devices)

    def reduce(vals, dests):
        traced.append(1)
        return collective.batch_all_reduce(vals, dests)

    loop = allreduce.chained_loop(reduce, values, None)
    parts = loop(tf.constant(3))
    assert len(traced) == 1
    n = len(cpu_devices)
    assert len(parts) == n  # one element of each device's last sum, to fetch
    for part in parts:  # x -> S -> nS -> n^2 S
        np.testing.assert_allclose(part.numpy(), sums[0][:1] * n * n, rtol=1e-6)
