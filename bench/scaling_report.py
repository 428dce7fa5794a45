"""What `bin/predict_scaling` prints and writes: the prediction table, its
JSON, and a PNG of examples/s and scaling efficiency against device count."""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from tfloop.bench.scaling import Prediction, Workload


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def prediction_table(workload: Workload, predictions: Sequence[Prediction],
                     collectives: Sequence[str]) -> str:
    """One Markdown row per device count: each collective's step time (its
    best packing), the best choice, examples/s, efficiency, and the basis of
    the numbers; then the assumptions under the table."""
    header = (["devices", "hosts"] + [f"{c} step ms" for c in collectives]
              + ["best (collective+packing)", "all-reduce ms (exposed)", "examples/s",
                 "efficiency", "all-reduce from"])
    text = {len(header) - 5, len(header) - 1}  # the choice and its basis
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i in text else "---:" for i in range(len(header))) + "|"]
    for p in predictions:
        steps = [_ms(p.by_collective[c].step) if c in p.by_collective else "n/a"
                 for c in collectives]
        best = p.best
        chosen = ("none (one device)" if p.devices == 1 else
                  f"{best.choice} ({best.algorithms}, {best.all_reduces} "
                  f"all-reduce{'' if best.all_reduces == 1 else 's'})")
        cells = [str(p.devices), str(p.hosts), *steps, chosen,
                 f"{_ms(best.comm)} ({_ms(best.exposed)})", f"{p.examples_per_second:,.0f}",
                 f"{p.efficiency:.1%}", best.basis]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *assumptions(workload, predictions)]
    return "\n".join(lines)


def assumptions(workload: Workload, predictions: Sequence[Prediction]) -> list[str]:
    """The lines under the table: what every number rests on."""
    overlap = ("the all-reduce does not overlap the backward pass (what the engine does "
               "today: one all-reduce after the whole backward pass)"
               if workload.overlap == "none" else
               f"what-if: all but the first variables' bucket hidden behind the backward pass "
               f"({workload.backward_fraction:.0%} of the compute)")
    lines = [f"{workload.name}: {len(workload.sizes)} gradients, "
             f"{workload.total_bytes / 1e6:.4g} MB per device as they travel; batch {workload.batch}",
             f"- {workload.compute.assumption}",
             f"- step = compute + exposed all-reduce{' + casts' if workload.cast_seconds else ''}; "
             f"{overlap}",
             f"- a step's all-reduces pay their latencies {workload.in_flight} at a time "
             "(1: one after another, as NCCL runs a communicator's operations)",
             "- left out: stragglers, the input pipeline, contention with other jobs, NCCL's "
             "LL/LL128 protocols and channel tuning (docs/collectives.md)"]
    skipped: dict[str, str] = {}
    for p in predictions:  # the first device count each is n/a at says why
        for c, why in p.unavailable.items():
            skipped.setdefault(c, why)
    lines += [f"- {c} n/a: {why}" for c, why in sorted(skipped.items())]
    return lines


def as_json(workload: Workload, predictions: Sequence[Prediction], inputs: dict) -> dict:
    """Everything the table shows, and the inputs it came from."""
    return dict(
        inputs=inputs, model=workload.name, gradient_sizes=list(workload.sizes),
        batch=workload.batch, compute=workload.compute.assumption, overlap=workload.overlap,
        predictions=[dict(devices=p.devices, hosts=p.hosts, best=dataclasses.asdict(p.best),
                          examples_per_second=p.examples_per_second, efficiency=p.efficiency,
                          by_collective={c: dataclasses.asdict(s)
                                         for c, s in p.by_collective.items()},
                          unavailable=p.unavailable)
                     for p in predictions])


def plot(workload: Workload, predictions: Sequence[Prediction], collectives: Sequence[str],
         path: str) -> str:
    """Scaling efficiency against devices, one line per collective (its best
    packing), hosts marked: on log-log examples/s every line hugs linear."""
    from tfloop.bench import report  # its device names import TensorFlow

    fig, ax = report._figure()
    one = predictions[0].examples_per_second  # one device: the compute alone
    for name in collectives:
        points = [(p.devices, workload.examples(p.devices) / p.by_collective[name].step
                   / (p.devices * one)) for p in predictions if name in p.by_collective]
        if points:
            ax.plot(*zip(*points), marker="o", label=name)
    hosts = next((p.devices for p in predictions if p.hosts > 1), None)
    if hosts:
        ax.axvline(hosts, color="grey", linestyle=":", label=f"more than one host ({hosts}+)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("devices")
    ax.set_ylabel("scaling efficiency (predicted)")
    last = predictions[-1]
    ax.set_title(f"{workload.name}, batch {workload.batch}: {last.examples_per_second:,.0f} "
                 f"examples/s on {last.devices} ({last.best.choice})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return report._save(fig, path)


def write(workload: Workload, predictions: Sequence[Prediction], collectives: Sequence[str],
          output_dir: str, inputs: dict, *, plot_png: bool) -> list[str]:
    """`predict_scaling.json`, then (with `plot_png`) `predict_scaling.png`."""
    from tfloop.bench import report

    files = [report.write_json(os.path.join(output_dir, "predict_scaling.json"),
                               as_json(workload, predictions, inputs))]
    if plot_png:
        files.append(plot(workload, predictions, collectives,
                          os.path.join(output_dir, "predict_scaling.png")))
    return files
