"""What both benchmarks print and write: tables, CSV, JSON and PNG plots.

Everything here works on results already measured (`bench.collectives`'
`CollectiveBenchResults`, `bench.training`'s `TrainBenchResult` or the dicts
their JSON holds), so a report can be redrawn from files without timing
anything again. File names:

    bin/bench_collectives   bench_collectives_{sweep,overhead,model}.csv,
                            bench_collectives.json, bench_collectives_busbw.png
    bin/bench_train         bench_train_<model>_<N>dev.json per device count;
                            with --device_counts also bench_train.json, bench_train.png
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import statistics
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tfloop.collectives import device_names

if TYPE_CHECKING:  # only for annotations: those modules import this one
    from tfloop.bench.collectives import CollectiveBenchResults
    from tfloop.bench.training import TrainBenchResult


# -- files and figures, for both ----------------------------------------------------------


def write_json(path: str, data: Any) -> str:
    """`data` as indented JSON at `path` (its folder created); returns `path`."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    return path


def write_csv(path: str, rows: Sequence[Any]) -> str:
    """Dataclass `rows` as CSV, one column per field; returns `path`."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dataclasses.asdict(rows[0])))
        writer.writeheader()
        for row in rows:
            writer.writerow(dataclasses.asdict(row))
    return path


#: The refusal before a run that would plot and cannot: said before any timing,
#: so a plain `pip install .` never ends a long sweep without its plot.
NO_PLOT = ("matplotlib is not installed, and the PNG plot needs it: pip install '.[plot]' "
           "(or 'tfloop[plot]'), or run with --noplot, which writes everything but the plot")


#: The line a benchmark prints when it skips its plot for want of matplotlib.
NO_PLOT_SKIPPED = ("skipping {png}: matplotlib is not installed (pip install '.[plot]' or "
                   "'tfloop[plot]' to draw it; --noplot says not to)")


def can_plot() -> bool:
    """matplotlib is an extra (`[plot]`), not a dependency of the engine."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure():
    """A fresh 8x5 figure and its axes, drawn without a display."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt.subplots(figsize=(8, 5))


def _save(fig, path: str) -> str:
    from matplotlib import pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# -- bin/bench_collectives -----------------------------------------------------------------


def collectives_report(results: CollectiveBenchResults) -> str:
    """The tables printed at the end of a collectives run."""
    lines = [_sweep_table(results)] if results.sweep else []
    for table in (_overhead_table(results), _auto_table(results), _model_table(results)):
        if table:
            lines += ["", table]
    return "\n".join(lines)


def _sweep_table(results: CollectiveBenchResults) -> str:
    if not results.sweep:
        return ""
    config = results.config
    devices = device_names.short_list(config.devices)
    lines = [f"# all-reduce (sum) over {len(config.devices)} devices: {devices}"]
    width = max(22, *(len(r.description) for r in results.sweep))
    lines.append(f"# {'size':>12} {'count':>12} {'type':>9} {'collective':>{width}} "
                 f"{'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'correct':>8}")
    for r in results.sweep:
        lines.append(f"  {r.size:>12} {r.count:>12} {r.dtype:>9} {r.description:>{width}} "
                     f"{r.time_us:>12.1f} {r.algbw_gbs:>12.4f} {r.busbw_gbs:>12.4f} "
                     f"{'ok' if r.correct else 'WRONG':>8}")
    return "\n".join(lines)


def _overhead_table(results: CollectiveBenchResults) -> str:
    if not results.overhead:
        return ""
    lines = ["# plug-in overhead: TF cross-device ops called directly vs through Collective",
             f"# {'size':>12} {'collective':>22} {'direct(us)':>12} {'layer(us)':>12} "
             f"{'ratio':>8} {'graph ops direct/layer':>24}"]
    for r in results.overhead:
        lines.append(f"  {r.size:>12} {r.collective:>22} {r.direct_us:>12.1f} "
                     f"{r.layer_us:>12.1f} {r.ratio:>8.3f} "
                     f"{f'{r.direct_graph_ops}/{r.layer_graph_ops}':>24}")
    big = [r.ratio for r in results.overhead if r.size >= 1 << 20]
    if big:
        lines.append(f"# sizes >= 1M: layer/direct median {statistics.median(big):.3f}, "
                     f"max {max(big):.3f} over {len(big)} measurements")
    return "\n".join(lines)


def _auto_table(results: CollectiveBenchResults) -> str:
    comparison = results.auto_vs_fastest()
    if not comparison:
        return ""
    lines = ["# auto vs the fastest other collective per size"]
    width = max(30, *(len(c["auto"]) for c in comparison))
    lines.append(f"# {'size':>12} {'fastest':>22} {'time(us)':>12} {'auto':>{width}} "
                 f"{'time(us)':>12} {'auto/fastest':>12}")
    for c in comparison:
        lines.append(f"  {c['size']:>12} {c['fastest']:>22} {c['fastest_us']:>12.1f} "
                     f"{c['auto']:>{width}} {c['auto_us']:>12.1f} {c['ratio']:>12.3f}")
    return "\n".join(lines)


def _model_table(results: CollectiveBenchResults) -> str:
    if not results.model:
        return ""
    r0 = results.model[0]
    lines = [f"# model {r0.model}: {r0.tensors} gradients, {r0.total_bytes} bytes "
             "per replica; 'largest alone' = its largest gradient by itself, the floor "
             "for packing; 'removed' = the share of the rest that packing took away",
             f"# {'collective':>22} {'unpacked(us)':>13} {'packed(us)':>12} "
             f"{'packed/unpacked':>16} {'largest alone(us)':>18} {'removed':>8} "
             f"{'correct':>8}  packed as"]
    for r in results.model:
        lines.append(f"  {r.collective:>22} {r.unpacked_us:>13.1f} {r.packed_us:>12.1f} "
                     f"{r.ratio:>16.3f} {r.largest_alone_us:>18.1f} {r.removed:>8.2f} "
                     f"{'ok' if r.correct else 'WRONG':>8}  {r.packed}")
    return "\n".join(lines)


def write_collectives_outputs(results: CollectiveBenchResults,
                              progress: Callable[[str], None] = print) -> list[str]:
    """CSV per table, one JSON with everything, then (with `config.plot`) the
    busbw plot: the numbers are on disk before matplotlib is touched. Without
    matplotlib (a plain `pip install .`) the plot is skipped with one line
    (`NO_PLOT_SKIPPED`): the numbers are the benchmark, the PNG a view of them."""
    from tfloop.bench import timing

    out_dir = results.config.output_dir
    os.makedirs(out_dir, exist_ok=True)
    files = []
    for name, rows in (("sweep", results.sweep), ("overhead", results.overhead),
                       ("model", results.model)):
        if rows:
            files.append(write_csv(os.path.join(out_dir, f"bench_collectives_{name}.csv"), rows))
    files.append(write_json(os.path.join(out_dir, "bench_collectives.json"), dict(
        config=dataclasses.asdict(results.config),
        environment=timing.environment(),
        sweep=[dataclasses.asdict(r) for r in results.sweep],
        overhead=[dataclasses.asdict(r) for r in results.overhead],
        auto_vs_fastest=results.auto_vs_fastest(),
        model=[dataclasses.asdict(r) for r in results.model],
    )))
    if results.sweep and results.config.plot and not can_plot():
        progress(NO_PLOT_SKIPPED.format(png="bench_collectives_busbw.png"))
    elif results.sweep and results.config.plot:
        files.append(plot_busbw(results, os.path.join(out_dir, "bench_collectives_busbw.png")))
    return files


def plot_busbw(results: CollectiveBenchResults, path: str) -> str:
    """Bus bandwidth against size per replica, one line per collective."""
    fig, ax = _figure()
    for name in results.config.collectives:
        rows = sorted((r for r in results.sweep if r.collective == name), key=lambda r: r.size)
        if rows:
            ax.plot([r.size for r in rows], [r.busbw_gbs for r in rows], marker="o",
                    label=rows[0].description)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size per replica (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    config = results.config
    ax.set_title(f"all-reduce over {len(config.devices)} devices "
                 f"({device_names.short_list(config.devices)}), {config.dtype}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)


# -- bin/bench_train -------------------------------------------------------------------------


def _as_dicts(results: Sequence[TrainBenchResult | dict]) -> list[dict]:
    return [r if isinstance(r, dict) else r.as_dict() for r in results]


def training_table(results: Sequence[TrainBenchResult | dict]) -> str:
    """One Markdown table: a row per (device count, variant)."""
    results = _as_dicts(results)
    header = ("| devices | variant | examples/s (median) | min – max | vs fit | vs fit tuned "
              "| vs hand loop | mfu | of measured matmul |")
    lines = [header, "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for result in results:
        ratios = result["ratios"]
        for row in result["rows"]:
            r = ratios[row["variant"]]
            cells = [str(result["num_devices"]), row["description"], f"{row['median']:,.0f}",
                     f"{row['low']:,.0f} – {row['high']:,.0f}"]
            cells += [f"{r[b]:.2f}×" if b in r else "–" for b in ("fit", "fit_tuned", "hand_loop")]
            for key in ("mfu", "peak_fraction"):
                cells.append(f"{row[key]:.1%}" if row.get(key) is not None else "–")
            lines.append("| " + " | ".join(cells) + " |")
    first = results[0]
    lines.append("")
    config = first["config"]
    images = (f"{config['image_size']}x{config['image_size']} images"
              if config.get("image_size") else "default images")
    lines.append(f"model {config['model']}, global batch {config['global_batch_size']}, "
                 f"{config.get('dataset', 'synthetic')} ({images}"
                 f"{', one batch on the devices' if config.get('synthetic_on_device') else ''}), "
                 f"optimizer {config['optimizer']}, collective {config['collective']}; "
                 f"{first['machine']}")
    for result in results:  # each device count ran in its own process
        peaks = "; ".join(f"{precision} {peak['flops_per_second'] / 1e12:.3g} TFLOP/s "
                          f"({peak['source']})"
                          for precision, peak in result.get("peaks", {}).items())
        lines.append(f"{result['num_devices']} device(s): mfu is of the peak the engine uses "
                     f"({peaks or 'unknown'}); measured float32 matmul rate "
                     f"{result['matmul_gflops']:.1f} GFLOP/s, "
                     f"{result['machine'].rsplit(', ', 1)[-1]}")
    for result in results:
        if result.get("bound"):
            lines.append(f"{result['num_devices']} device(s): {result['bound']['line']}")
    return "\n".join(lines)


def write_training_result(result: TrainBenchResult, output_dir: str) -> str:
    """`bench_train_<model>_<N>dev.json`: one device count's result."""
    return write_json(os.path.join(output_dir, f"bench_train_{result.config.model}_"
                                               f"{len(result.config.devices)}dev.json"),
                      result.as_dict())


def write_training_sweep(results: Sequence[dict], output_dir: str, *,
                         plot: bool = True) -> list[str]:
    """`bench_train.json` (every device count's result), then with `plot`
    `bench_train.png`."""
    path = write_json(os.path.join(output_dir, "bench_train.json"), list(results))
    if not plot:
        return [path]
    return [path, plot_training_scaling(results, os.path.join(output_dir, "bench_train.png"))]


def plot_training_scaling(results: Sequence[dict], path: str) -> str:
    """examples/sec against device count, one line per variant."""
    fig, ax = _figure()
    variants = [row["variant"] for row in results[0]["rows"]]
    for variant in variants:
        points = sorted((r["num_devices"], row) for r in results for row in r["rows"]
                        if row["variant"] == variant)
        xs = [n for n, _ in points]
        ax.errorbar(xs, [row["median"] for _, row in points],
                    yerr=[[row["median"] - row["low"] for _, row in points],
                          [row["high"] - row["median"] for _, row in points]],
                    marker="o", capsize=3, label=points[0][1]["description"])
    ax.set_xlabel("devices (logical CPUs)" if "cpu" in results[0]["config"]["devices"][0]
                  else "devices")
    ax.set_xticks(sorted({r["num_devices"] for r in results}))
    ax.set_ylabel("examples / second")
    config = results[0]["config"]
    ax.set_title(f"{config['model']}, global batch {config['global_batch_size']}, "
                 f"{config['optimizer']}")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
