"""What one all-reduce costs, in the latency-bandwidth (alpha-beta) model.

Every collective here costs `latency + per_byte * S` for a message of `S`
bytes per device, with `latency` the sum of the per-step latencies (alpha) of
the steps it takes one after another, and `per_byte` the bytes its busiest
link carries per byte of message, over that link's bandwidth (1/beta). For
`p` devices, `g` per host, `m` hosts, `k` network cards per host::

    ring (TF's collective ring, one ring over every device)
        2(p-1) steps: 2(m-1) of them cross hosts, the rest inside one;
        each device sends 2(p-1)/p * S, over the slowest link the ring uses
        (one ring, one network card)
    nccl ring (NCCL's, as its tuner models it: src/graph/tuning.cc)
        8.4 us base + the ring's steps (a step leaving a host >= 3 us of
        network overhead); NCCL spreads its channels over every card of a
        host, so the bandwidth is min(intra, k * inter)
    nccl tree (NCCL's double binary tree)
        8.4 us base + 2 * ((g-1) intra steps + log2(m) network steps);
        algorithm bandwidth 0.5 * 0.92 of the link's (tuning.cc: tree busBw
        x 0.92, bus-to-algorithm ratio 0.5): log-latency, a little less
        bandwidth than the ring, so trees win small messages on many hosts
        and rings the large ones
    two_level (intra reduce-scatter, inter ring all-reduce of each device's
        1/g shard over all k cards, intra all-gather; Horovod's hierarchical
        all-reduce): 2(g-1) intra + 2(m-1) network steps;
        per_byte = 2(g-1)/g / intra + 2(m-1)/m / (k * inter)
    hierarchical_copy (TF's HierarchicalCopyAllReduce; one host, even p)
        two halves each sum on their first device, the two sums are
        exchanged, each copies back: 3 steps, and the summing device's link
        carries (p/2-1) S in, S each way, (p/2-1) S out: (p-1) S in sequence
    reduce_to_one_device (TF's ReductionToOneDevice; one host)
        every device copies to one, which copies back: 2 steps, its link
        carries 2(p-1) S

The bus bandwidth `bin/bench_collectives` reports (nccl-tests' definition,
doc/PERFORMANCE.md: busbw = algbw x 2(p-1)/p for an all-reduce) is what a ring
reaches on its links, so `ring_bytes_fraction(p) = 2(p-1)/p` is shared with it.

What this leaves out, on purpose (docs/collectives.md says more): NCCL's LL
and LL128 protocols and channel counts (Simple protocol only), contention
with other jobs, stragglers, and the bandwidth a ring loses below the sizes
where its pipeline fills. Pure Python: no TensorFlow at import.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

from tfloop.bench.links import Link, ScalingError

#: NCCL's base latency of a ring or tree all-reduce, Simple protocol
#: (`baseLat` in NVIDIA/nccl src/graph/tuning.cc).
NCCL_BASE_LATENCY = 8.4e-6
#: The network overhead NCCL charges each step of a ring leaving a host:
#: 1 us on x86, x3 for the Simple protocol (tuning.cc, `getNetOverhead`).
NCCL_NET_STEP_OVERHEAD = 3e-6
#: NCCL's tree all-reduce: bus bandwidth x 0.92, algorithm bandwidth = bus x 0.5.
NCCL_TREE_ALGBW = 0.5 * 0.92


class Unavailable(ScalingError):
    """A collective that cannot run on a topology (why, in one line)."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """`devices` devices, `per_host` on each host, linked by `intra` inside a
    host and by `nics_per_host` cards of `inter` between hosts."""

    devices: int
    per_host: int
    intra: Link
    inter: Optional[Link] = None
    nics_per_host: int = 1

    def __post_init__(self):
        if self.devices < 1 or self.per_host < 1 or self.nics_per_host < 1:
            raise ScalingError(f"a topology needs devices, per_host and nics_per_host >= 1, "
                             f"got {self.devices}, {self.per_host}, {self.nics_per_host}")
        if self.hosts > 1 and self.inter is None:
            raise ScalingError(f"{self.devices} devices at {self.per_host} per host span "
                             f"{self.hosts} hosts: name the link between hosts")

    @property
    def hosts(self) -> int:
        return math.ceil(self.devices / self.per_host)

    @property
    def local(self) -> int:
        """Devices on one host (all of them, on one host)."""
        return min(self.devices, self.per_host)

    def with_links(self, intra: Link, inter: Optional[Link] = None) -> "Topology":
        return dataclasses.replace(self, intra=intra, inter=inter or self.inter)


@dataclasses.dataclass(frozen=True)
class AllReduceCost:
    """`latency + per_byte * S` seconds for `S` bytes per device."""

    latency: float
    per_byte: float
    algorithm: str

    def seconds(self, nbytes: float) -> float:
        return self.latency + self.per_byte * nbytes


def ring_bytes_fraction(p: int) -> float:
    """What each device of a ring sends per byte of message: 2(p-1)/p
    (nccl-tests' busbw factor for an all-reduce)."""
    return 2.0 * (p - 1) / p if p > 1 else 0.0


def _ring_steps(topo: Topology) -> tuple[int, int]:
    """(steps inside a host, steps crossing hosts) of a ring all-reduce."""
    total = 2 * (topo.devices - 1)
    crossing = 2 * (topo.hosts - 1)
    return total - crossing, crossing


def ring(topo: Topology) -> AllReduceCost:
    """TF's collective ring: one ring through every device."""
    inside, crossing = _ring_steps(topo)
    latency = inside * topo.intra.latency + (crossing * topo.inter.latency if crossing else 0)
    bandwidth = topo.intra.bandwidth if topo.hosts == 1 else min(
        topo.intra.bandwidth, topo.inter.bandwidth)
    return AllReduceCost(latency, ring_bytes_fraction(topo.devices) / bandwidth, "ring")


def nccl_ring(topo: Topology) -> AllReduceCost:
    """NCCL's ring, as NCCL's tuner models it (Simple protocol)."""
    inside, crossing = _ring_steps(topo)
    intra_step = topo.intra.latency
    latency = NCCL_BASE_LATENCY
    if crossing:
        intra_step = max(intra_step, NCCL_NET_STEP_OVERHEAD)
        latency += crossing * topo.inter.latency
    latency += inside * intra_step
    return AllReduceCost(latency, ring_bytes_fraction(topo.devices) / _nccl_bandwidth(topo),
                         "nccl ring")


def nccl_tree(topo: Topology) -> AllReduceCost:
    """NCCL's double binary tree (Simple protocol)."""
    latency = NCCL_BASE_LATENCY + 2 * (
        (topo.local - 1) * topo.intra.step_latency_tree
        + (math.ceil(math.log2(topo.hosts)) * topo.inter.step_latency_tree
           if topo.hosts > 1 else 0.0))
    return AllReduceCost(latency, 1.0 / (NCCL_TREE_ALGBW * _nccl_bandwidth(topo)), "nccl tree")


def _nccl_bandwidth(topo: Topology) -> float:
    if topo.hosts == 1:
        return topo.intra.bandwidth
    return min(topo.intra.bandwidth, topo.nics_per_host * topo.inter.bandwidth)


def two_level(topo: Topology) -> AllReduceCost:
    """Reduce-scatter inside each host, a ring between hosts per shard, all-gather inside."""
    g, m = topo.local, topo.hosts
    latency = 2 * (g - 1) * topo.intra.latency
    per_byte = ring_bytes_fraction(g) / topo.intra.bandwidth
    if m > 1:
        latency += 2 * (m - 1) * topo.inter.latency
        per_byte += ring_bytes_fraction(m) / (topo.nics_per_host * topo.inter.bandwidth)
    return AllReduceCost(latency, per_byte, "two-level")


def hierarchical_copy(topo: Topology) -> AllReduceCost:
    """TF's two-halves tree of copies; one host, an even device count."""
    _one_host(topo, "hierarchical_copy")
    p = topo.devices
    if p % 2:
        raise Unavailable(f"hierarchical_copy needs an even device count, not {p}")
    return AllReduceCost(3 * topo.intra.latency, (p - 1) / topo.intra.bandwidth,
                         "hierarchical copy")


def reduce_to_one_device(topo: Topology) -> AllReduceCost:
    """Every device copies to one, which sums and copies back; one host."""
    _one_host(topo, "reduce_to_one_device")
    p = topo.devices
    return AllReduceCost(2 * topo.intra.latency, 2 * (p - 1) / topo.intra.bandwidth,
                         "reduce to one device")


def _one_host(topo: Topology, name: str) -> None:
    if topo.hosts > 1:
        raise Unavailable(f"{name} reduces among the devices of one process (one host); "
                          f"{topo.devices} devices at {topo.per_host} per host span "
                          f"{topo.hosts} hosts")


#: The formulas by name: the engine's `--collective` names, plus NCCL's two
#: algorithms and the two-level what-if.
FORMULAS: dict[str, Callable[[Topology], AllReduceCost]] = {
    "ring": ring,
    "nccl_ring": nccl_ring,
    "nccl_tree": nccl_tree,
    "two_level": two_level,
    "hierarchical_copy": hierarchical_copy,
    "reduce_to_one_device": reduce_to_one_device,
}

#: What `nccl` means: NCCL's tuner takes the faster of its algorithms per size.
NCCL_ALGORITHMS = ("nccl_ring", "nccl_tree")


def choose(name: str, topo: Topology, nbytes: float) -> AllReduceCost:
    """The cost of one all-reduce of `nbytes` per device through `name` on
    `topo` (for `nccl`, the faster of its ring and tree at that size, as
    NCCL's tuner picks). Raises `Unavailable`."""
    if name == "nccl":
        costs = [FORMULAS[a](topo) for a in NCCL_ALGORITHMS]
        return min(costs, key=lambda c: c.seconds(nbytes))
    if name not in FORMULAS:
        raise Unavailable(f"no cost formula for the collective {name!r}; choose from "
                          f"nccl, {', '.join(FORMULAS)}")
    return FORMULAS[name](topo)


def seconds(name: str, topo: Topology, nbytes: float) -> tuple[float, str]:
    """(seconds, algorithm) of one all-reduce of `nbytes` per device (`choose`);
    zero on one device."""
    if topo.devices == 1:
        return 0.0, "none (one device)"
    cost = choose(name, topo, nbytes)
    return cost.seconds(nbytes), cost.algorithm


def crossover_bytes(a: AllReduceCost, b: AllReduceCost) -> Optional[float]:
    """The message size where `a` and `b` cost the same (None: one is always
    at least as fast)."""
    if a.per_byte == b.per_byte:
        return None
    size = (b.latency - a.latency) / (a.per_byte - b.per_byte)
    return size if size > 0 else None
