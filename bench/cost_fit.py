"""The alpha-beta constants of the machine at hand, fitted from a
`bin/bench_collectives` sweep.

A sweep times one all-reduce per size for each collective on `p` devices
(`bench_collectives.json`, rows of `size`, `collective`, `devices`,
`time_us` = the best sample and `median_us`). Per (collective, p) this fits
`t(S) = latency + per_byte * S` by least squares on the relative error (each
size weighs the same, so the 4 KiB points set the latency and the largest
the bandwidth, instead of the largest setting both). The median samples are
fitted by default, because `bin/bench_train` reports median rates; `best`
fits the fastest.

A fit holds at the device count it was measured on. `link_for` turns it
into the link (`bench.links.Link`) that gives the same two numbers through
the collective's own formula (`bench.cost_model`), which is how the model
goes to device counts the machine does not have. Pure Python + numpy.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable, Sequence

import numpy as np

from tfloop.bench import cost_model
from tfloop.bench.links import Link, ScalingError


class SweepError(ScalingError):
    """A sweep file that cannot be fitted (one line: which file, what is wrong)."""


@dataclasses.dataclass(frozen=True)
class Fit:
    """`seconds(S) = latency + per_byte * S`, from `points` measured sizes."""

    collective: str
    devices: int
    latency: float
    per_byte: float
    points: int
    #: Largest relative error of the fit over the measured points.
    worst_error: float
    source: str = ""

    def seconds(self, nbytes: float) -> float:
        return self.latency + self.per_byte * nbytes

    @property
    def busbw(self) -> float:
        """The bus bandwidth (bytes/s) the fitted slope means, nccl-tests' way."""
        return cost_model.ring_bytes_fraction(self.devices) / self.per_byte


def fit_alpha_beta(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float, float]:
    """(latency, per_byte, worst relative error) of `t = latency + per_byte * S`,
    least squares on relative residuals; latency and slope kept >= 0."""
    s = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if s.size < 2 or np.unique(s).size < 2:
        raise SweepError("a fit needs at least two different sizes")
    if np.any(t <= 0):
        raise SweepError("a fit needs positive times")
    design = np.stack([np.ones_like(s), s], axis=1) / t[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if latency < 0:  # pure bandwidth: refit the slope alone
        latency, per_byte = 0.0, float(np.sum(s / t) / np.sum((s / t) ** 2))
    elif per_byte < 0:  # pure latency
        latency, per_byte = float(len(t) / np.sum(1 / t)), 0.0
    predicted = latency + per_byte * s
    return float(latency), float(per_byte), float(np.max(np.abs(predicted - t) / t))


def read_sweep(path: str) -> list[dict]:
    """The sweep rows of a `bench_collectives.json`."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as error:
        raise SweepError(f"cannot read the sweep {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise SweepError(f"{path} is not JSON ({error.msg}, line {error.lineno}); give the "
                         "bench_collectives.json that bin/bench_collectives writes") from None
    rows = data.get("sweep") if isinstance(data, dict) else None
    if not rows:
        raise SweepError(f"{path} has no sweep rows; run bin/bench_collectives with --sizes "
                         "(e.g. --sizes=4K:16M) and give its bench_collectives.json")
    return rows


def fit_rows(rows: Iterable[dict], *, statistic: str = "median", source: str = "") -> list[Fit]:
    """One `Fit` per (collective, device count) in sweep rows; `statistic`
    is "median" (median_us) or "best" (time_us). Collectives whose sum was
    wrong are left out: their times mean nothing."""
    key = {"median": "median_us", "best": "time_us"}[statistic]
    groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for row in rows:
        if not row.get("correct", True):
            continue
        groups.setdefault((row["collective"], int(row["devices"])), []).append(
            (float(row["size"]), float(row[key]) * 1e-6))
    fits = []
    for (collective, devices), points in sorted(groups.items()):
        sizes, times = zip(*sorted(points))
        latency, per_byte, worst = fit_alpha_beta(sizes, times)
        fits.append(Fit(collective, devices, latency, per_byte, len(points), worst, source))
    return fits


def fit_files(paths: Sequence[str], *, statistic: str = "median") -> list[Fit]:
    """The fits of every sweep file, in order."""
    return [fit for path in paths
            for fit in fit_rows(read_sweep(path), statistic=statistic, source=path)]


#: Swept collectives whose formula has another name: `nccl` on one host runs its ring
#: for the large messages that set a link's bandwidth.
_FORMULA_OF = {"nccl": "nccl_ring"}


def link_for(fit: Fit) -> Link:
    """The link through which `fit.collective`'s formula on `fit.devices`
    devices of one host gives exactly the fitted latency and slope."""
    if fit.devices < 2:
        raise SweepError(f"a fit on {fit.devices} device says nothing about links; sweep "
                         "on 2 or more devices")
    unit = Link("unit", 1.0, 1.0, "")
    free = Link("free", 1.0, 0.0, "")
    topo = cost_model.Topology(fit.devices, fit.devices, unit)
    formula = cost_model.FORMULAS.get(_FORMULA_OF.get(fit.collective, fit.collective))
    if formula is None:
        raise SweepError(f"no cost formula for the swept collective {fit.collective!r}; "
                         f"fitted collectives: {', '.join(cost_model.FORMULAS)}")
    at_unit, at_free = formula(topo), formula(topo.with_links(free))
    steps = at_unit.latency - at_free.latency  # latency per unit of alpha
    alpha = max(fit.latency - at_free.latency, 0.0) / steps
    beta = at_unit.per_byte / fit.per_byte if fit.per_byte > 0 else float("inf")
    return Link(f"fitted {fit.collective} on {fit.devices}", beta, alpha,
                f"least squares over {fit.points} sizes of {fit.source or 'a sweep'} "
                f"(worst point {fit.worst_error:.0%} off)")
