"""Which GPU devices share one physical GPU (virtual GPUs).

A physical GPU split with `tf.config.set_logical_device_configuration` (or
`--virtual_gpus=N`) shows up as several logical GPUs, numbered in order:
physical GPU 0's logical devices first, then GPU 1's, and so on. NCCL cannot
run two ranks on one physical GPU, so the collectives must know when two
replicas are two halves of the same card. The split is read from TF's
configuration, which does not start the runtime::

    split = [2, 2]                       # two physical GPUs, each split in two
    physical_gpu_of(split)               -> [0, 0, 1, 1]
    sharing(["/gpu:0", "/gpu:1"], split) -> ["/gpu:0", "/gpu:1"]
    sharing(["/gpu:0", "/gpu:2"], split) -> []
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

from tfloop.collectives import device_names


def logical_split(physical: Optional[Sequence[Any]] = None) -> list[int]:
    """For each of `physical` (default: the visible GPUs), how many logical
    GPUs it is split into (1: not split, or a device TensorFlow does not know)."""
    split = []
    for gpu in tf.config.get_visible_devices("GPU") if physical is None else physical:
        try:
            split.append(len(tf.config.get_logical_device_configuration(gpu) or [None]))
        except ValueError:  # not one of TensorFlow's physical devices
            split.append(1)
    return split


def logical_gpu_count(split: Optional[Sequence[int]] = None) -> int:
    """The number of logical GPUs, `gpu:0` .. `gpu:N-1`."""
    return sum(logical_split() if split is None else split)


def physical_gpu_of(split: Sequence[int]) -> list[int]:
    """The physical GPU (position among the visible ones) of each logical GPU index."""
    return [physical for physical, count in enumerate(split) for _ in range(count)]


def sharing(devices: Sequence[str], split: Optional[Sequence[int]] = None) -> list[str]:
    """The GPU devices of `devices` that share a physical GPU with another of them."""
    owner = physical_gpu_of(logical_split() if split is None else split)
    gpus = [d for d in devices if device_names.kind(d) == "gpu"]
    physical = [owner[device_names.index(d)] if device_names.index(d) < len(owner) else None
                for d in gpus]
    return [d for d, p in zip(gpus, physical) if p is not None and physical.count(p) > 1]
