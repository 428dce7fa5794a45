"""A user's own collectives, as `--collective=my_collective_plugin:AllToAllSum`
loads them: a module on sys.path, no change to the engine or the registry.

Both ways of writing one work: `TemplateAllToAllSum` implements
`_sum_replicas` and gets the batch prepared and the single-replica shortcut
from `Collective.batch_all_reduce`; `AllToAllSum` overrides `batch_all_reduce`
whole, as plug-ins written before that template do."""

import tensorflow as tf

from tfloop import collectives


def sum_on_every_device(value):
    """A PerReplica value's sum, computed on (and mirrored onto) every replica's device."""
    parts = collectives.components(value)
    sums = []
    for part in parts:
        with tf.device(part.device):
            sums.append(tf.add_n(list(parts)))
    return collectives.mirrored(sums)


class AllToAllSum(collectives.Collective):
    """Every device adds up all replicas' copies itself (no tree, no ring)."""

    def batch_all_reduce(self, values, destinations):
        values = list(values)
        if not values or not collectives.is_distributed(values[0]):
            return values  # one replica: nothing to sum
        return [sum_on_every_device(value) for value in values]


class TemplateAllToAllSum(collectives.Collective):
    """`AllToAllSum` on the template: only the sum of distributed values."""

    def _sum_replicas(self, values, destinations):
        return [sum_on_every_device(value) for value in values]


class WithNativePacking(AllToAllSum):
    """Takes `num_packs` itself, so the registry must not wrap it in Packing."""

    native_options = frozenset({"num_packs"})

    def __init__(self, *, num_packs=0):
        self.num_packs = num_packs


class Unfinished(collectives.Collective):
    """Forgot to implement _sum_replicas (or batch_all_reduce)."""


class NeedsArguments(AllToAllSum):
    def __init__(self, endpoint):
        self.endpoint = endpoint


def not_a_class():
    return None
