"""`--collective=auto`: picks an implementation for the devices at hand, and
on CPUs one for small tensors and one for the rest, the way NCCL's tuner
picks its algorithm by message size.

The rule, and the measurements behind it (docs/collectives.md has the
commands and full tables)::

    one device                  -> reduce_to_one_device  (nothing to sum; no group keys)
    every device a GPU, two     -> ring                  (virtual GPUs: NCCL runs one rank per
      sharing a physical one                               physical GPU; TF switches to ring too)
    every device a GPU          -> nccl                  (NVIDIA's all-reduce; the fastest
                                                           on GPUs everywhere it is published)
    CPUs and GPUs mixed         -> reduce_to_one_device  (the only one spanning both kinds)
    CPUs, an even count >= 4    -> hierarchical_copy for dense tensors below 256 KiB,
                                   reduce_to_one_device for the rest
    other CPU counts            -> reduce_to_one_device

On CPU devices (TF 2.21, 4 logical CPUs on 2 cores, one intra-op thread per
replica, best of 15 interleaved samples from 3 fresh traces,
bin/bench_collectives) the ring was 4-10x slower than the fastest at every
size from 4 KiB to 64 MiB: logical devices share host memory, so the copies
that hierarchical copy and reduce-to-one-device "send" are free while the
ring still moves every chunk through the collective executor.
Reduce-to-one-device led from 1 MiB up (1.2-2x over hierarchical copy up
to 16 MiB); hierarchical copy led below 256 KiB, by 2-10% (48.6 against
54.3 us at 4 KiB: its two half-sums run side by side). On 2 devices the two
tie (same graph, in effect), so one collective is used there. The GPU
branch is not measured here (no GPU).

On GPUs, unless `--num_packs` or `--pack_bytes` is given, the gradients are
packed into one all-reduce per dtype (`num_packs=1`, what TF's own
`MirroredStrategy` default, `NcclAllReduce(num_packs=1)`, does): unpacked
NCCL launches one all-reduce per gradient, about 160 for a ResNet-50 step,
each paying a kernel launch and NCCL's latency. The start-up line says so
(`auto->nccl(num_packs=1), packed by default on GPUs`). `--collective=nccl`
keeps exactly the packing asked for (none by default).

bfloat16 gradients (`--gradient_dtype=bfloat16`) on GPUs where auto would
pick NCCL are refused in one line: TF's NCCL reduces no bfloat16.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional, Sequence

from tfloop.collectives import _values, device_names, gpus, nccl, registry
from tfloop.collectives.interface import Collective

logger = logging.getLogger(__name__)

#: On 4+ CPU devices, dense tensors smaller than this go to hierarchical copy.
CPU_SMALL_TENSOR_BYTES = 256 << 10

#: On GPUs, without packing flags: one pack per dtype (TF's MirroredStrategy default).
GPU_DEFAULT_NUM_PACKS = 1


@dataclasses.dataclass(frozen=True)
class Choice:
    """What `auto` uses: `large` for every tensor, except dense ones below
    `small_below` bytes, which go to `small` when it is set."""

    large: str
    why: str
    small: Optional[str] = None
    small_below: int = 0
    #: `num_packs` used when the user gave no packing flag (0: none).
    default_num_packs: int = 0


def choose(devices: Sequence[str], *, split: Optional[Sequence[int]] = None) -> Choice:
    """The collective(s) `auto` uses on `devices`, and why (for the log).

    `split`: logical GPUs per physical GPU (`gpus.logical_split()`, read from
    TensorFlow when None).
    """
    kinds = {device_names.kind(d) for d in devices}
    if len(devices) <= 1:
        return Choice("reduce_to_one_device", "one device, nothing to all-reduce")
    if kinds == {"gpu"}:
        shared = gpus.sharing(devices, split)
        if shared:
            return Choice(
                "ring", f"{device_names.short_list(shared)} are virtual GPUs sharing a physical "
                "GPU, where NCCL cannot run (one rank per GPU)",
                default_num_packs=GPU_DEFAULT_NUM_PACKS)
        return Choice("nccl", "every device is a GPU", default_num_packs=GPU_DEFAULT_NUM_PACKS)
    if len(kinds) > 1:
        return Choice("reduce_to_one_device", "CPUs and GPUs mixed; only it spans both kinds")
    if len(devices) >= 4 and len(devices) % 2 == 0:
        return Choice(
            "reduce_to_one_device",
            "CPU devices: hierarchical copy measured fastest below 256 KiB on 4 devices, "
            "reduce to one device from there up (docs/collectives.md)",
            small="hierarchical_copy", small_below=CPU_SMALL_TENSOR_BYTES,
        )
    return Choice(
        "reduce_to_one_device",
        "CPU devices: measured fastest or tied at every size, and valid at any device count "
        "(docs/collectives.md)",
    )


@registry.register("auto")
class Auto(Collective):
    """Delegates each gradient to the collective `choose` picks for the
    devices (and, on CPUs, for its size)."""

    native_options = frozenset({"num_packs", "pack_bytes", "gradient_dtype"})

    def __init__(
        self, *, num_packs: int = 0, pack_bytes: int = 0, gradient_dtype: str = "float32"
    ):
        self._options = dict(
            num_packs=num_packs, pack_bytes=pack_bytes, gradient_dtype=gradient_dtype
        )
        #: The collective for every tensor not routed to `small`, once the devices are known.
        self.chosen: Optional[Collective] = None
        #: The collective for dense tensors below `small_below` bytes, if any.
        self.small: Optional[Collective] = None
        self.small_below = 0
        #: True when auto packs because no packing flag was given (GPUs).
        self.packed_by_default = False

    def check_devices(self, devices: Sequence[str]) -> None:
        choice = choose(devices)
        options = dict(self._options)
        if choice.large == "nccl":
            if options["gradient_dtype"] != "float32":
                nccl.check_dtype(options["gradient_dtype"],
                                 given="--collective=auto (NCCL on GPUs)")
        why = choice.why
        if choice.default_num_packs and not (options["num_packs"] or options["pack_bytes"]):
            options["num_packs"] = choice.default_num_packs
            self.packed_by_default = True
            why += ("; gradients packed into one all-reduce per dtype, as TF's MirroredStrategy "
                    "does (--num_packs or --pack_bytes to choose)")
        self.chosen = registry.create(choice.large, devices=list(devices), **options)
        if choice.small:
            self.small = registry.create(choice.small, devices=list(devices), **options)
            self.small_below = choice.small_below
        logger.info(
            "collective auto picked %s for %s: %s",
            self.describe().removeprefix("auto->"), device_names.short_list(devices), why,
        )

    def collective_for(self, value: Any) -> Collective:
        """The collective that reduces `value` (a gradient)."""
        if (self.small is not None and _values.is_packable(value)
                and _values.nbytes(value) < self.small_below):
            return self.small
        return self.chosen

    def _sum_replicas(self, values: list[Any], destinations: list[Any]) -> list[Any]:
        if self.chosen is None:
            self.check_devices(list(_values.replica_devices(values[0])))
        small = [i for i, v in enumerate(values) if self.collective_for(v) is self.small]
        if not small or len(small) == len(values):
            return self.collective_for(values[0]).batch_all_reduce(values, destinations)
        large = sorted(set(range(len(values))) - set(small))
        results: list[Any] = [None] * len(values)
        for collective, indices in ((self.small, small), (self.chosen, large)):
            reduced = collective.batch_all_reduce(
                [values[i] for i in indices], [destinations[i] for i in indices])
            for i, summed in zip(indices, reduced):
                results[i] = summed
        return results

    def describe(self) -> str:
        if self.chosen is None:
            return "auto"
        if self.small is None:
            default = ", packed by default on GPUs" if self.packed_by_default else ""
            return f"auto->{self.chosen.describe()}{default}"
        below = f"{self.small_below >> 10}K"
        return f"auto->{self.small.describe()}[<{below}]+{self.chosen.describe()}"
