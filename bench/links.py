"""The wires an all-reduce runs over, as the scaling model sees them: a
bandwidth and a per-step latency, each preset with where its number comes from.

`bandwidth` is bytes per second in one direction: per device for a link
inside a host (what one GPU can send while it receives as much), per network
card for a link between hosts. `latency` is the cost of one step of a ring or
tree over that link (NCCL's own tuning model charges it per step), seconds.

Where the numbers come from (docs/collectives.md, "Predicting a run's speed",
lists them too):

* Bandwidths are the vendors' line rates, one direction: PCIe per the PCI-SIG
  generations (x16: 8/16/32 GT/s per lane, 128b/130b encoding: 15.75 / 31.5 /
  63 GB/s), with the achievable figure the model uses beside it (about 80% of
  the line rate, "vendor spec sheet" order; nccl-tests' PERFORMANCE.md says
  to expect busbw below the hardware peak); NVLink per GPU from NVIDIA's
  datasheets (P100 160 GB/s, V100 300 GB/s, A100 600 GB/s, H100 900 GB/s, all
  bidirectional totals: half each way); InfiniBand per port from NVIDIA's
  DGX SuperPOD design guide, "NDR Overview" (HDR four lanes of 50 Gb/s,
  NDR four of 100 Gb/s); Ethernet at its IEEE line rate.
* Latencies are NCCL's per-step hardware latencies for its Simple protocol,
  `hwLat` in NVIDIA/nccl `src/graph/tuning.cc`: NVLink 3.4 us per ring step
  (4.0 per tree step), PCIe 5.7 (4.0), network 14 (14). TF's own collective
  ring and TF's copies pay their kernel launches on top; fit them from a
  `bin/bench_collectives` sweep (`bench.cost_fit`) where that matters.
"""

from __future__ import annotations

import dataclasses

GB = 1e9
GBIT = 1e9 / 8


class ScalingError(ValueError):
    """A request the scaling model cannot answer, in one line (the binary
    reports it as a usage error, exit 2)."""


@dataclasses.dataclass(frozen=True)
class Link:
    """One kind of wire: `bandwidth` bytes/s one way, `latency` s per step."""

    name: str
    bandwidth: float
    latency: float
    source: str
    #: Latency per step of a tree (NCCL charges trees and rings differently).
    tree_latency: float = 0.0

    def __post_init__(self):
        if not self.bandwidth > 0 or not self.latency >= 0:
            raise ScalingError(f"link {self.name}: bandwidth must be > 0 and latency >= 0, "
                             f"got {self.bandwidth} B/s and {self.latency} s")

    @property
    def step_latency_tree(self) -> float:
        return self.tree_latency or self.latency

    def describe(self) -> str:
        return (f"{self.name} ({self.bandwidth / GB:g} GB/s one way, "
                f"{self.latency * 1e6:g} us/step)")


_NCCL = "NVIDIA/nccl src/graph/tuning.cc hwLat, Simple protocol"
_PCIE = "PCI-SIG line rate, x16, 128b/130b; achievable ~80% (vendor spec sheet order)"

#: Links inside a host, per device, one direction.
INTRA: dict[str, Link] = {link.name: link for link in (
    Link("pcie3", 12 * GB, 5.7e-6, f"PCIe 3.0 x16: 15.75 GB/s line rate; {_PCIE}; {_NCCL} "
         "(PCI ring step)", tree_latency=4.0e-6),
    Link("pcie4", 25 * GB, 5.7e-6, f"PCIe 4.0 x16: 31.5 GB/s line rate; {_PCIE}; {_NCCL} "
         "(PCI ring step)", tree_latency=4.0e-6),
    Link("pcie5", 50 * GB, 5.7e-6, f"PCIe 5.0 x16: 63 GB/s line rate; {_PCIE}; {_NCCL} "
         "(PCI ring step)", tree_latency=4.0e-6),
    Link("nvlink1", 80 * GB, 3.4e-6, "NVLink 1 (P100 SXM2): 4 links, 160 GB/s bidirectional "
         f"per GPU (vendor spec sheet); {_NCCL} (NVLink ring step)", tree_latency=4.0e-6),
    Link("nvlink2", 150 * GB, 3.4e-6, "NVLink 2 (V100 SXM2): 6 links, 300 GB/s bidirectional "
         f"per GPU (vendor spec sheet); {_NCCL} (NVLink ring step)", tree_latency=4.0e-6),
    Link("nvlink3", 300 * GB, 3.4e-6, "NVLink 3 (A100): 12 links, 600 GB/s bidirectional "
         f"per GPU (vendor spec sheet); {_NCCL} (NVLink ring step)", tree_latency=4.0e-6),
    Link("nvlink4", 450 * GB, 3.4e-6, "NVLink 4 (H100/H200): 18 links, 900 GB/s bidirectional "
         f"per GPU (vendor spec sheet); {_NCCL} (NVLink ring step)", tree_latency=4.0e-6),
)}

_IB = ("NVIDIA DGX SuperPOD design guide, 'NDR Overview' (HDR: 4 lanes x 50 Gb/s, NDR: "
       "4 x 100 Gb/s)")
_ETH = "IEEE 802.3 line rate (vendor spec sheet)"

#: Links between hosts, per network card, one direction.
INTER: dict[str, Link] = {link.name: link for link in (
    Link("eth25", 25 * GBIT, 14e-6, f"25 GbE: {_ETH}; {_NCCL} (network step)"),
    Link("eth100", 100 * GBIT, 14e-6, f"100 GbE: {_ETH}; {_NCCL} (network step)"),
    Link("ib_edr", 100 * GBIT, 14e-6, f"InfiniBand EDR 100 Gb/s (vendor spec sheet); {_NCCL} "
         "(network step)"),
    Link("ib_hdr", 200 * GBIT, 14e-6, f"InfiniBand HDR 200 Gb/s: {_IB}; {_NCCL} (network step)"),
    Link("ib_ndr", 400 * GBIT, 14e-6, f"InfiniBand NDR 400 Gb/s: {_IB}; {_NCCL} (network step)"),
)}


def intra(name: str) -> Link:
    """The preset link inside a host called `name`; ValueError naming the choices."""
    return _pick(INTRA, name, "--intra_link")


def inter(name: str) -> Link:
    """The preset link between hosts called `name`; ValueError naming the choices."""
    return _pick(INTER, name, "--inter_link")


def _pick(presets: dict[str, Link], name: str, flag: str) -> Link:
    if name not in presets:
        raise ScalingError(f"{flag}={name!r} is not a link preset; choose one of "
                         f"{', '.join(presets)}")
    return presets[name]
