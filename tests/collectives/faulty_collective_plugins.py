"""Plug-ins that are wrong in the ways a user's collective goes wrong, loaded as
`--collective=faulty_collective_plugins:<Class>` (a module on sys.path).

Each would train silently wrong, or end in a traceback, if the engine trusted it."""

import tensorflow as tf

from my_collective_plugin import sum_on_every_device  # the right sum (same folder)
from tfloop import collectives


def _sum(value):
    """The right sum of `value`, one tensor per replica's device, for each plug-in to spoil."""
    return list(collectives.components(sum_on_every_device(value)))


class DropsLast(collectives.Collective):
    """Loses the last gradient."""

    def _sum_replicas(self, values, destinations):
        return [collectives.mirrored(_sum(v)) for v in values[:-1]]


class Transposes(collectives.Collective):
    """Sums, then hands matrices back transposed."""

    def _sum_replicas(self, values, destinations):
        return [collectives.mirrored([tf.transpose(s) if s.shape.rank == 2 else s for s in _sum(v)])
                for v in values]


class LeavesPerReplica(collectives.Collective):
    """Returns its inputs: per-replica values, never summed."""

    def _sum_replicas(self, values, destinations):
        return list(values)


class ReturnsNone(collectives.Collective):
    def _sum_replicas(self, values, destinations):
        return [collectives.mirrored(_sum(v)) for v in values[:-1]] + [None]


class OneTensor(collectives.Collective):
    """The sum as a single tensor on the first device, not one copy per replica."""

    def _sum_replicas(self, values, destinations):
        return [_sum(v)[0] for v in values]


class Float16(collectives.Collective):
    def _sum_replicas(self, values, destinations):
        return [collectives.mirrored([tf.cast(s, tf.float16) for s in _sum(v)]) for v in values]


class Averages(collectives.Collective):
    """The mean, not the sum: right shapes and dtypes, off by the replica count."""

    def _sum_replicas(self, values, destinations):
        n = len(collectives.components(values[0]))
        return [collectives.mirrored([s / n for s in _sum(v)]) for v in values]


class OwnReplicaOnly(collectives.Collective):
    """Each replica keeps its own gradient, mirrored: the shape of a sum, unsummed."""

    def _sum_replicas(self, values, destinations):
        return [collectives.mirrored(list(collectives.components(v))) for v in values]


class BrokenConstructor(collectives.Collective):
    def __init__(self):
        raise RuntimeError("cannot reach the interconnect")

    def _sum_replicas(self, values, destinations):
        return values


class BrokenCheckDevices(collectives.Collective):
    def check_devices(self, devices):
        return {}["rdma0"]

    def _sum_replicas(self, values, destinations):
        return values


class BrokenDtypeCheck(collectives.Collective):
    def check_gradient_dtype(self, dtype):
        raise AttributeError("no 'supported_dtypes' here")

    def _sum_replicas(self, values, destinations):
        return sum_on_every_device(values, destinations)


class RefusesDevices(collectives.Collective):
    def check_devices(self, devices):
        raise collectives.CollectiveError("needs GPUs")

    def _sum_replicas(self, values, destinations):
        return values


class BrokenSum(collectives.Collective):
    def _sum_replicas(self, values, destinations):
        return [v.no_such_attribute for v in values]
