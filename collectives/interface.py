"""The one contract every gradient collective implements.

A collective sums a list of per-replica gradients across the replicas of a
`tf.distribute` strategy. The trainer calls it exactly once per step, from
cross-replica context (inside `ReplicaContext.merge_call`), and hands the
result to the optimizer, which must not reduce again::

    grads = tape.gradient(loss, variables)            # per replica
    grads = merge_call(collective.batch_all_reduce)   # <- the one all-reduce
    optimizer.apply_gradients(zip(grads, variables))  # no second reduction

Implementations live one per module in this package and are looked up by name
through `collectives.registry`. Wrappers (packing, compression) are collectives
themselves that delegate to an inner one, so they compose with any of them.

`Collective.batch_all_reduce` is a template: it lists the batch, turns Keras
variables into destinations `tf.distribute` understands, and returns a
single replica's values as they are (nothing to sum); only then does it call
`_sum_replicas`, the one method an implementation writes::

    batch_all_reduce(values, destinations)      # public, the same for everyone
        values, destinations = prepare(...)     # lists, destinations unwrapped
        if one replica: return values
        return self._sum_replicas(values, destinations)   # the implementation's

A user's own collective needs no change to the engine: subclass `Collective`,
implement `_sum_replicas` (or, as plug-ins written before the template do,
override `batch_all_reduce` whole and do those steps itself), and pass
`--collective=my_module:MyCollective` (see docs/collectives.md).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, Sequence

import tensorflow as tf

from tfloop.collectives import _values

#: A list of gradients in cross-replica context: each entry is a
#: `tf.distribute` PerReplica value (one tensor per replica), or a plain tensor
#: when the strategy has a single replica.
PerReplicaGradients = Sequence[Any]

#: Where each reduced value must end up: the variables the gradients belong to
#: (a MirroredVariable places one copy on every replica's device; a Keras 3
#: variable's `.value`). Only their devices count: a wrapper may pass a
#: variable as the destination of a packed value of another shape.
Destinations = Sequence[Any]


class CollectiveError(ValueError):
    """A user-facing configuration mistake: the message is one line saying what
    is wrong and how to fix it, printed by the binaries without a traceback."""

    #: Raised while a step is traced (a plug-in's results checked, `checked.py`),
    #: it must leave `tf.function` as it is: autograph otherwise re-raises it as
    #: a `StagingError` with the traced code's stack in its message. This
    #: attribute is autograph's own opt-out (`autograph/impl/api.py`); the
    #: tests in `tests/collectives/test_checked_plugins.py` fail if it stops working.
    ag_pass_through = True


class Collective(abc.ABC):
    """Sums per-replica gradients across replicas; see the module docstring."""

    #: The registry name (`--collective=<name>`).
    name: str = ""

    #: Which of the registry's options (`num_packs`, `pack_bytes`,
    #: `gradient_dtype`, `reduce_device`) the constructor takes as keyword
    #: arguments. `collectives.create` applies the packing and compression
    #: options a class does not take itself by wrapping it, and refuses
    #: `reduce_device` for a class that does not take it.
    native_options: ClassVar[frozenset[str]] = frozenset()

    #: True when the algorithm runs only if each result goes back to its own
    #: replica's device: TF's `AllReduceCrossDeviceOps` (nccl, hierarchical
    #: copy) silently reduce onto one device for any other destinations, such
    #: as central storage's one copy of the variables.
    needs_replica_destinations: ClassVar[bool] = False

    #: Whether `batch_all_reduce` returns plain tensors (one local replica)
    #: unreduced. A collective that also sums across machines sets it False.
    shortcut_single_replica: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A plug-in that overrides `batch_all_reduce` whole (the contract
        # before the template) never reaches `_sum_replicas`, so it need not
        # implement it; one that overrides neither stays abstract.
        if "batch_all_reduce" in vars(cls) and getattr(
                cls._sum_replicas, "__isabstractmethod__", False):
            cls._sum_replicas = _not_reached

    def check_devices(self, devices: Sequence[str]) -> None:
        """Raises `CollectiveError` when this collective cannot run on `devices`.

        Called before any strategy or model is built, so an impossible choice
        (NCCL on CPUs) fails in one line instead of at the first step.
        `devices` are canonical TensorFlow names such as "/gpu:0" or "/cpu:1".
        """

    def check_gradient_dtype(self, dtype: str) -> None:
        """Raises `CollectiveError` when gradients cannot travel in `dtype`
        (`--gradient_dtype`, "bfloat16" or "float16") through this collective.

        `collectives.create` calls it on the implementation itself, before
        wrapping it in `Compression`, so NCCL's missing bfloat16 is one line
        rather than a `TypeError` at the first trace.
        """

    @tf.autograph.experimental.do_not_convert  # graph-building Python, called in merge_call
    def batch_all_reduce(
        self, values: PerReplicaGradients, destinations: Destinations
    ) -> list[Any]:
        """Returns the across-replica SUM of each of `values`, mirrored onto
        the devices of the matching entry of `destinations`.

        Must be called in cross-replica context. Values are reduced in one
        batch so implementations can pack, bucket or overlap them.
        """
        values, destinations = _values.prepare_batch(values, destinations)
        if not values or (self.shortcut_single_replica and not _values.is_distributed(values[0])):
            return values  # One replica: nothing to sum.
        return self._sum_replicas(values, destinations)

    @abc.abstractmethod
    def _sum_replicas(self, values: list[Any], destinations: list[Any]) -> list[Any]:
        """`batch_all_reduce`'s work, on a prepared batch: a non-empty list of
        per-replica values (plain tensors only when `shortcut_single_replica`
        is False) and one destination each, ready for `tf.distribute`."""

    def describe(self) -> str:
        """A short human-readable description for logs (name and options)."""
        return self.name


def _not_reached(self: Collective, values: list[Any], destinations: list[Any]) -> list[Any]:
    raise NotImplementedError(
        f"{type(self).__name__} overrides batch_all_reduce, which does not call _sum_replicas"
    )
