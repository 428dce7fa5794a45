"""Gradient all-reduce implementations behind one interface and one registry.

    from tfloop import collectives

    collective = collectives.create("ring", devices=["/cpu:0", "/cpu:1"])
    reduced = collective.batch_all_reduce(per_replica_grads, variables)

Names: see `available()`; `module:Class` loads a user's own `Collective`,
which can take values apart with `components(value)` (one tensor per replica)
and build its results with `mirrored(tensors)` (one per device).
Importing this package registers every built-in implementation.
"""

from tfloop.collectives.interface import Collective, CollectiveError, Destinations, PerReplicaGradients
from tfloop.collectives._values import components, is_distributed, mirrored
from tfloop.collectives.options import GRADIENT_DTYPES, check_options
from tfloop.collectives.registry import available, create, register, resolve
from tfloop.collectives.base import CrossDeviceOpsCollective, TFPackedAllReduce, Wrapper
from tfloop.collectives.packing import Packing
from tfloop.collectives.compression import Compression
from tfloop.collectives.checked import Checked

# Importing an implementation registers it.
from tfloop.collectives import auto as _auto  # noqa: F401,E402
from tfloop.collectives import hierarchical_copy as _hierarchical_copy  # noqa: F401,E402
from tfloop.collectives import nccl as _nccl  # noqa: F401,E402
from tfloop.collectives import reduce_to_one_device as _reduce_to_one_device  # noqa: F401,E402
from tfloop.collectives import ring as _ring  # noqa: F401,E402
from tfloop.collectives import strategy_native as _strategy_native  # noqa: F401,E402

__all__ = [
    "Checked",
    "Collective",
    "CollectiveError",
    "Compression",
    "CrossDeviceOpsCollective",
    "Destinations",
    "GRADIENT_DTYPES",
    "Packing",
    "PerReplicaGradients",
    "TFPackedAllReduce",
    "Wrapper",
    "available",
    "check_options",
    "components",
    "create",
    "is_distributed",
    "mirrored",
    "register",
    "resolve",
]
