"""A run's speed on N devices and M hosts, predicted: the step model over the
collective cost model.

One data-parallel step of this engine, per device (`engine.loop.trainer`)::

    forward + backward on the device's share of the batch     compute(N)
    one all-reduce of every gradient, bucket after bucket      comm(N)
    the update                                                  (in compute)

and the engine does not overlap the two today: `Trainer._replica_step` asks
for the all-reduce through one `merge_call` after `tape.gradient` has
returned every gradient, and the optimizer applies after it returns. Inside
the compiled graph a gradient's collective depends only on that gradient, so
TensorFlow's executor may start one before the backward pass ends (nothing
schedules it so, as Horovod's and PyTorch DDP's bucket hooks do), and with
packing a bucket waits for all of its members. The model therefore charges
the step `compute + comm` (`overlap="none"`, what the engine does), and
offers `overlap="backward"` as the what-if of a bucketed overlap: all but
the last bucket hidden behind the backward pass (`backward_fraction` of the
compute, 2/3 by the usual rule that backward costs twice forward).

`comm(N)` sums, over the step's buckets, one all-reduce each
(`bench.cost_model`, or constants fitted on this machine: `bench.cost_fit`):
the buckets are the engine's own plan (`collectives.bucketing`, the rule
`Packing` runs), and the bytes are the gradients' as they travel (halved by
`--gradient_dtype` compression, which adds two casts of the gradient
through device memory). `compute(N)` is measured or given (`Compute`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Optional, Sequence

from tfloop.bench import cost_fit, cost_model
from tfloop.bench.cost_model import Topology, Unavailable
from tfloop.bench.links import ScalingError
from tfloop.bench.sizes import format_size

#: Bytes per element of the dtypes gradients may travel in.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: Share of a step's compute that is the backward pass (backward ~ 2x forward).
BACKWARD_FRACTION = 2.0 / 3.0
OVERLAPS = ("none", "backward")
#: Where a tool's progress lines go (`print`; `bench.timing.Progress` without its TensorFlow).
Progress = Callable[[str], None]


# -- compute ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Compute:
    """Seconds of one step's compute (forward, backward, update) on `N`
    devices, with the assumption behind it in words."""

    seconds: Callable[[int], float]
    assumption: str

    @staticmethod
    def weak(step_seconds: float, what: str = "given") -> "Compute":
        """A fixed per-device batch: every device computes what one does alone."""
        return Compute(lambda n: step_seconds,
                       f"compute {step_seconds * 1e3:.4g} ms/step per device at a fixed "
                       f"per-device batch ({what})")

    @staticmethod
    def strong(step_seconds: float, what: str = "given") -> "Compute":
        """A fixed global batch split N ways, compute linear in the batch (an
        optimistic bound: small per-device batches use an accelerator less well)."""
        return Compute(lambda n: step_seconds / n,
                       f"compute {step_seconds * 1e3:.4g} ms/step on one device / N "
                       f"(global batch split N ways, linear in the batch; {what})")

    @staticmethod
    def shared_host(per_replica: Mapping[int, float], parallelism: Mapping[int, float],
                    what: str) -> "Compute":
        """Logical devices of one host: N replicas share its cores, so the step
        is one replica's step at its batch (`per_replica[N]`, timed alone with
        the threads a replica of N gets) times N / `parallelism[N]`, the
        speedup N busy processes get on the host (min(N, cores) when the host
        is otherwise idle; less when other work shares it)."""
        def seconds(n: int) -> float:
            if n not in per_replica or n not in parallelism:
                raise Unavailable(f"no one-replica measurement for {n} replicas")
            return per_replica[n] * n / parallelism[n]

        shown = ", ".join(f"{n}: {p:.2f}" for n, p in sorted(parallelism.items()))
        return Compute(seconds, f"compute: one replica's step timed alone at batch B/N, "
                                f"x N / the host's measured parallelism ({shown}) ({what})")


# -- what is all-reduced ----------------------------------------------------------------------


def travelling_sizes(variable_sizes: Sequence[tuple[int, int]], gradient_dtype: str
                     ) -> tuple[int, ...]:
    """Bytes per gradient as they travel: `(elements, bytes per element)` per
    trainable variable, float gradients wider than `gradient_dtype` narrowed
    to it (`collectives.compression`)."""
    narrow = DTYPE_BYTES[gradient_dtype]
    return tuple(count * (min(width, narrow) if width > 2 else width)
                 for count, width in variable_sizes)


def model_variable_sizes(model: str, *, input_shape=(28, 28, 1), num_classes: int = 10
                         ) -> list[tuple[int, int]]:
    """`(elements, bytes per element)` of each trainable variable of a
    `models` registry model, built once (TensorFlow is imported here)."""
    from tfloop import models

    models.check(model, input_shape)

    built = models.build(model, input_shape=tuple(input_shape), num_classes=num_classes)
    return [(int(math.prod(v.shape)), _dtype_size(v.dtype)) for v in built.trainable_variables]


def _dtype_size(dtype) -> int:
    import tensorflow as tf

    return tf.as_dtype(dtype).size


# -- the collectives' costs ----------------------------------------------------------------------


class CostSource:
    """Seconds per all-reduce: fitted on this machine where a sweep measured
    that collective, from link presets elsewhere."""

    def __init__(self, fits: Sequence[cost_fit.Fit] = ()):
        self.fits = {(f.collective, f.devices): f for f in fits}

    def cost(self, name: str, topo: Topology, nbytes: float) -> "Part":
        """One all-reduce of `nbytes` per device through `name` on `topo`."""
        if topo.devices == 1:
            return Part(0.0, 0.0, "none", "one device: nothing to all-reduce")
        fit = self.fits.get((name, topo.devices))
        if fit is not None and topo.hosts == 1:
            return Part(fit.latency, fit.per_byte * nbytes, name,
                        f"fitted on {fit.devices} devices")
        measured = sorted(d for (n, d) in self.fits if n == name)
        if measured and (name in cost_model.FORMULAS or name == "nccl"):
            link = cost_fit.link_for(self.fits[(name, measured[-1])])
            cost = cost_model.choose(name, topo.with_links(link), nbytes)
            return Part(cost.latency, cost.per_byte * nbytes, cost.algorithm,
                        f"links fitted on {measured[-1]} devices")
        cost = cost_model.choose(name, topo, nbytes)
        links = topo.intra.name + (f"+{topo.nics_per_host}x{topo.inter.name}"
                                   if topo.hosts > 1 else "")
        return Part(cost.latency, cost.per_byte * nbytes, cost.algorithm,
                    f"link presets {links}")


@dataclasses.dataclass(frozen=True)
class Part:
    """One all-reduce: its latency and its transfer time, seconds."""

    latency: float
    transfer: float
    algorithm: str
    basis: str

    @property
    def seconds(self) -> float:
        return self.latency + self.transfer


def comm_seconds(parts: Sequence[Part], in_flight: int) -> float:
    """One step's all-reduces: every transfer, and the latencies in waves of
    `in_flight` (each wave as long as its slowest). NCCL runs a
    communicator's operations in order (1); TensorFlow's copy-based
    collectives on CPU run side by side as far as the cores go."""
    latencies = sorted((p.latency for p in parts), reverse=True)
    return sum(p.transfer for p in parts) + sum(latencies[::max(1, in_flight)])


@dataclasses.dataclass(frozen=True)
class Choice:
    """A collective and its packing (at most one of the two options set)."""

    collective: str
    num_packs: int = 0
    pack_bytes: int = 0

    def describe(self) -> str:
        if self.num_packs:
            return f"{self.collective}+num_packs={self.num_packs}"
        if self.pack_bytes:
            return f"{self.collective}+pack_bytes={format_size(self.pack_bytes)}"
        return self.collective

    def buckets(self, sizes: Sequence[int]) -> list[int]:
        """Bytes per all-reduce of one step: the engine's packing plan."""
        if not (self.num_packs or self.pack_bytes):
            return list(sizes)
        from tfloop.collectives import bucketing  # the engine's own rule

        plan = bucketing.plan_buckets(sizes, num_packs=self.num_packs,
                                      pack_bytes=self.pack_bytes)
        return [sum(sizes[i] for i in bucket) for bucket in plan]


def auto_routes(sizes: Sequence[int], devices: int, kind: str) -> list[tuple[str, int]]:
    """What `--collective=auto` does with each gradient (`collectives.auto.choose`):
    on GPUs NCCL with one pack; on CPUs reduce_to_one_device, and hierarchical
    copy for tensors below 256 KiB on an even count of 4 or more."""
    if kind == "gpu":
        return [("nccl", b) for b in Choice("nccl", num_packs=1).buckets(sizes)]
    from tfloop.collectives import auto

    small = devices >= 4 and devices % 2 == 0
    return [("hierarchical_copy" if small and s < auto.CPU_SMALL_TENSOR_BYTES
             else "reduce_to_one_device", s) for s in sizes]


# -- one step ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Workload:
    """One training step: its gradients as they travel, its compute, its examples."""

    name: str
    sizes: tuple[int, ...]
    compute: Compute
    #: Examples one step trains on N devices.
    examples: Callable[[int], float]
    batch: str
    device_kind: str = "gpu"
    overlap: str = "none"
    backward_fraction: float = BACKWARD_FRACTION
    #: Seconds of compression's two casts per step (0: no compression).
    cast_seconds: float = 0.0
    #: All-reduces of one step whose latencies overlap (`comm_seconds`).
    in_flight: int = 1

    def __post_init__(self):
        if self.overlap not in OVERLAPS:
            raise ScalingError(f"--overlap={self.overlap!r}: choose one of {', '.join(OVERLAPS)}")

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """One choice's step on one topology, and what each number rests on."""

    choice: str
    compute: float
    comm: float
    exposed: float
    step: float
    all_reduces: int
    algorithms: str
    basis: str


def estimate(workload: Workload, choice: Choice, topo: Topology,
             costs: CostSource) -> StepEstimate:
    """The step time of `workload` on `topo` with `choice`; raises `Unavailable`."""
    if choice.collective == "auto":
        routes = auto_routes(workload.sizes, topo.devices, workload.device_kind)
    else:
        routes = [(choice.collective, b) for b in choice.buckets(workload.sizes)]
    parts = [costs.cost(name, topo, nbytes) for name, nbytes in routes]
    comm = comm_seconds(parts, workload.in_flight)
    compute = workload.compute.seconds(topo.devices)
    exposed = comm
    if workload.overlap == "backward" and parts:
        # The first variables' gradients come last out of the backward pass:
        # their bucket cannot hide behind it.
        exposed = max(parts[0].seconds, comm - workload.backward_fraction * compute)
    casts = workload.cast_seconds if topo.devices > 1 else 0.0
    return StepEstimate(
        choice=choice.describe(), compute=compute, comm=comm, exposed=exposed,
        step=compute + exposed + casts, all_reduces=len(routes),
        algorithms=", ".join(sorted({p.algorithm for p in parts})) or "none",
        basis="; ".join(sorted({p.basis for p in parts})) or "one device")


@dataclasses.dataclass
class Prediction:
    """Every choice on `devices` devices: the fastest, and each collective's best."""

    devices: int
    hosts: int
    best: StepEstimate
    by_collective: dict[str, StepEstimate]
    unavailable: dict[str, str]
    examples_per_second: float
    efficiency: float


def predict(workload: Workload, counts: Sequence[int], *, per_host: int, intra, inter=None,
            nics_per_host: int = 1, choices: Sequence[Choice],
            costs: Optional[CostSource] = None) -> list[Prediction]:
    """A `Prediction` per device count, efficiency against one device."""
    costs = costs or CostSource()
    single = workload.compute.seconds(1)
    rate_one = workload.examples(1) / single
    out = []
    for n in counts:
        topo = Topology(n, per_host, intra, inter if n > per_host else inter, nics_per_host)
        by_collective: dict[str, StepEstimate] = {}
        unavailable: dict[str, str] = {}
        for choice in choices:
            try:
                step = estimate(workload, choice, topo, costs)
            except Unavailable as why:
                unavailable.setdefault(choice.collective, str(why))
                continue
            known = by_collective.get(choice.collective)
            if known is None or step.step < known.step:
                by_collective[choice.collective] = step
        if not by_collective:
            raise Unavailable(f"no collective can run on {n} devices: "
                              + "; ".join(unavailable.values()))
        best = min(by_collective.values(), key=lambda s: s.step)
        rate = workload.examples(n) / best.step
        out.append(Prediction(n, topo.hosts, best, by_collective, unavailable, rate,
                              rate / (n * rate_one)))
    return out
