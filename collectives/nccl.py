"""`--collective=nccl`: NVIDIA NCCL all-reduce between GPUs of one machine.

TF's `tf.distribute.NcclAllReduce`; `num_packs` is its own concat-and-split
packing. Three things NCCL cannot do are refused before anything is built,
each in one line naming what works instead:

* non-GPU devices: NCCL has no CPU kernel (the first step would fail with
  "No OpKernel was registered to support Op 'NcclAllReduce'");
* two replicas on one physical GPU (virtual GPUs): NCCL allows one rank per
  GPU; TensorFlow's collective ring runs there;
* a dtype NCCL does not reduce: `supported_dtypes()` reads them from TF's op
  registry (`NcclAllReduce`'s `T`: float16/32/64, int32/64 in TF 2.21, the
  same set as the NCCL manager's `kValidDataTypes` that multi-worker NCCL goes
  through). bfloat16 would fail at the first trace with a `TypeError`.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from tfloop.collectives import _tf_private, _values, device_names, gpus
from tfloop.collectives.base import TFPackedAllReduce
from tfloop.collectives.interface import CollectiveError
from tfloop.collectives.registry import register


def supported_dtypes() -> tuple[str, ...]:
    """The dtype names NCCL reduces in this TensorFlow, from its op registry."""
    return tuple(d.name for d in _tf_private.op_dtypes("NcclAllReduce"))


def check_dtype(dtype: str, *, given: str) -> None:
    """Refuses gradients travelling in `dtype` through NCCL; `given` names the
    flags that chose NCCL, for the message."""
    allowed = supported_dtypes()
    if allowed and dtype not in allowed:
        raise CollectiveError(
            f"{given} with --gradient_dtype={dtype}: TensorFlow's NCCL all-reduce takes "
            f"{', '.join(allowed)}, not {dtype}; use --gradient_dtype=float16, "
            "or --collective=ring (TF's collective ring, which reduces bfloat16)")


def check_not_shared(devices: Sequence[str], *, given: str) -> None:
    """Refuses NCCL where two replicas share one physical GPU."""
    shared = gpus.sharing(devices)
    if shared:
        raise CollectiveError(
            f"{given}: {device_names.short_list(shared)} are virtual GPUs on one physical GPU, "
            "and NCCL runs one rank per physical GPU; use --collective=ring (or auto, which "
            "picks it there), or one device per physical GPU")


@register("nccl")
class Nccl(TFPackedAllReduce):
    """NCCL all-reduce; one replica per physical GPU, NCCL's dtypes only."""

    def _make_ops(self, num_packs: int) -> tf.distribute.CrossDeviceOps:
        return tf.distribute.NcclAllReduce(num_packs=num_packs)

    def check_devices(self, devices: Sequence[str]) -> None:
        if not devices or any(device_names.kind(d) != "gpu" for d in devices):
            raise CollectiveError(
                f"--collective=nccl needs GPUs, but the devices are "
                f"{device_names.short_list(devices) or 'none'}; on CPU use ring, hierarchical_copy "
                "or reduce_to_one_device"
            )
        check_not_shared(devices, given="--collective=nccl")

    def check_gradient_dtype(self, dtype: str) -> None:
        check_dtype(dtype, given="--collective=nccl")

    def _sum_replicas(self, values: list[Any], destinations: list[Any]) -> list[Any]:
        # Gradients already in a dtype NCCL lacks (a model with bfloat16 weights):
        # one line at trace time instead of TF's TypeError from deep inside.
        allowed = supported_dtypes()
        for value in values:
            dtype = _values.components(value)[0].dtype
            if allowed and dtype.name not in allowed:
                raise CollectiveError(
                    f"--collective=nccl got a {dtype.name} gradient; TensorFlow's NCCL all-reduce "
                    f"takes {', '.join(allowed)}; keep the weights in float32 (mixed precision "
                    "computes in 16 bits with float32 weights), or use --collective=ring")
        return super()._sum_replicas(values, destinations)
