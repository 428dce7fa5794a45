"""`bin/predict_scaling --against=measured`: the prediction against what this
machine measures, in one run.

Logical CPU devices share the host's cores: N replicas compute side by side
only as far as the cores go, and on a shared machine only as far as the
cores other work leaves. So the prediction for N replicas of a global batch
B is built from measurements of ONE replica and of the host, never of N
replicas::

    compute(N) = (one replica's step, timed alone at batch B/N with the
                  intra-op threads a replica of N gets)
                 x N / min(P(N), T(N))
                   P(N): what N busy processes get done at once, probed
                         (`host_parallelism`) before and after the measured
                         runs: min(N, cores) when the host is idle
                   T(N): the intra-op threads of the N-replica process. TensorFlow
                         has one intra-op pool per process, and the engine sizes it
                         cores / replicas (1 here for 2 and 4 replicas): measured,
                         2 replicas of the cnn took 2.1x one replica alone at
                         half the batch while the probe said the host could run
                         two processes at 2.07x (docs/performance.md)
    comm(N)    = the step's all-reduces as `--collective=auto` routes them,
                 each latency + per_byte * bytes fitted from a
                 bin/bench_collectives sweep on N devices (latencies overlap
                 up to the cores, `bench.scaling.comm_seconds`)
    predicted examples/s = B / (compute(N) + comm(N))

A second prediction takes the host's sharing out of the question: the
N-replica step timed with a collective that moves nothing
(`bench.no_exchange`), plus the same predicted all-reduce::

    predicted examples/s = B / (B / no-exchange rate(N) + comm(N))

It checks what carries over to a GPU cluster (the α–β fit, and no overlap
of the one all-reduce with the compute); the first checks the guess of how
logical CPUs share the cores, which has no counterpart there. Both are
set beside `bin/bench_train --device_counts=1,2,4`, run in the same
invocation (the machine is shared; its load moves every number, so the
inputs and the measurement are taken minutes apart, not days). Every run is
its own process (logical devices are fixed per process), its output kept
under `<output_dir>/measured/`.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import subprocess
import sys
from typing import Sequence

from tfloop.bench import cost_fit, no_exchange, report, scaling
from tfloop.bench.scaling import Progress
from tfloop.bench.links import ScalingError

GLOBAL_BATCH = 256
COUNTS = (1, 2, 4)
SWEEP_SIZES = "1K:16M"  # the mlp's 40 B .. the cnn's 11 MB gradients
#: One run of a binary; a shared 2-core machine has taken minutes for one.
RUN_TIMEOUT_S = 1200
#: The probe of the host's parallelism: float32 matmuls on one BLAS thread,
#: timed in each of k processes started together (about 0.2 s each here). A
#: matmul, not a Python loop: the step's work is matmuls and convolutions, and
#: two hyperthreads of one core share its vector units (a Python loop would
#: count them as two cores).
_BUSY = ("import sys, time\nimport numpy as np\na = np.ones((512, 512), np.float32)\n"
         "b = a @ a\nstart = time.perf_counter()\n"
         "for _ in range(int(sys.argv[1])): b = a @ a\n"
         "print(time.perf_counter() - start)\n")
PROBE_MATMULS = 100
_ONE_BLAS_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                           "MKL_NUM_THREADS")}


def _run(bin_dir: str, binary: str, args: Sequence[str], log: str, progress: Progress) -> None:
    """`bin/<binary> args`, its output into `log`; one line on failure."""
    command = [sys.executable, os.path.join(bin_dir, binary), *args]
    progress(f"  $ bin/{binary} {' '.join(args)}")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as out:
        try:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=RUN_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise ScalingError(f"bin/{binary} ran past {RUN_TIMEOUT_S} s; its output: {log}") \
                from None
    if done.returncode:
        raise ScalingError(f"bin/{binary} failed (exit {done.returncode}); its output: {log}")


def _devices(n: int) -> str:
    return ",".join(f"cpu:{i}" for i in range(n))


def _busy(k: int) -> float:
    """Mean seconds of the probe's loop in `k` processes started together."""
    env = dict(os.environ, **_ONE_BLAS_THREAD)
    processes = [subprocess.Popen([sys.executable, "-c", _BUSY, str(PROBE_MATMULS)],
                                  stdout=subprocess.PIPE, text=True, env=env)
                 for _ in range(k)]
    times = []
    for process in processes:
        out, _ = process.communicate(timeout=120)
        times.append(float(out))
    return sum(times) / k


def host_parallelism(counts: Sequence[int], repeats: int = 3) -> dict[int, list[float]]:
    """P(k) = k x t(1) / t(k): how many processes' worth of work k busy
    processes get done at once on this host now (k up to the free cores on an
    idle host, fewer while other work shares it); `repeats` samples each."""
    samples: dict[int, list[float]] = {k: [] for k in counts}
    for _ in range(repeats):
        one = _busy(1)
        for k in counts:
            samples[k].append(1.0 if k == 1 else k * one / _busy(k))
    return samples


#: Steps per timed repetition by model, unless --steps says otherwise: about 3-5 s
#: each here, so that a burst of other work lands inside repetitions, not on one.
STEPS = {"mlp": 400, "cnn": 50}

#: How a set of samples is summarised, on both sides alike: the median, and
#: the best (the fastest repetition, the host's parallelism at its highest):
#: on a shared machine the best is the least disturbed.
STATISTICS = {"median": statistics.median, "best": max}


def sweep_collectives(out: str, bin_dir: str, progress: Progress) -> list[str]:
    """bin/bench_collectives on 2 and 4 devices, the collectives `auto` uses on
    CPUs; their JSON files."""
    files = []
    for n in COUNTS[1:]:
        folder = os.path.join(out, f"collectives_{n}dev")
        _run(bin_dir, "bench_collectives",
             [f"--devices={_devices(n)}", "--collectives=hierarchical_copy,reduce_to_one_device",
              f"--sizes={SWEEP_SIZES}", "--nooverhead", "--noplot", "--rounds=2", "--repeats=3",
              f"--output_dir={folder}"], os.path.join(folder, "log.txt"), progress)
        files.append(os.path.join(folder, "bench_collectives.json"))
    return files


def _engine(folder: str) -> dict:
    """The result of a bench_train run (its one JSON in `folder`)."""
    [path] = glob.glob(os.path.join(folder, "bench_train_*dev.json"))
    with open(path) as f:
        return json.load(f)


def engine_rate(result: dict, statistic: str) -> float:
    """The engine's examples/s in a bench_train result: the median, or the
    best repetition's."""
    [row] = [r for r in result["rows"] if r["variant"] == "engine"]
    return row["median"] if statistic == "median" else row["high"]


def pool_threads(n: int) -> int:
    """The intra-op threads of a process with `n` CPU replicas, as the engine
    sizes them (`engine.runtime.devices.intra_op_threads_for`; TF's default, all
    usable cores, where it leaves the default)."""
    from tfloop.engine.runtime import devices as engine_devices

    threads = engine_devices.intra_op_threads_for([f"/cpu:{i}" for i in range(n)])
    return threads or engine_devices.usable_cores()


def measure_model(model: str, out: str, bin_dir: str, common: Sequence[str], progress: Progress
                  ) -> tuple[dict[int, dict], dict[int, list[float]], list[dict], dict[int, dict]]:
    """One replica alone at each batch B/N, then the N-device sweep measured
    with the host's parallelism probed before and after it, then the sweep
    again with no exchange: the alone results, the probe's samples, the
    measured results, the exchange-free ones by device count."""
    alone = {}
    for n in COUNTS[1:]:
        folder = os.path.join(out, model, f"alone_batch{GLOBAL_BATCH // n}")
        _run(bin_dir, "bench_train",
             [*common, "--devices=cpu:0", f"--global_batch_size={GLOBAL_BATCH // n}",
              f"--intra_op_threads={pool_threads(n)}", f"--output_dir={folder}"],
             os.path.join(folder, "log.txt"), progress)
        alone[n] = _engine(folder)
    folder = os.path.join(out, model, "measured")
    before = host_parallelism(COUNTS)
    _run(bin_dir, "bench_train",
         [*common, f"--devices={_devices(max(COUNTS))}", f"--global_batch_size={GLOBAL_BATCH}",
          f"--device_counts={','.join(map(str, COUNTS))}", "--noplot", f"--output_dir={folder}"],
         os.path.join(folder, "log.txt"), progress)
    after = host_parallelism(COUNTS)
    probed = {n: before[n] + after[n] for n in COUNTS}
    free = os.path.join(out, model, "no_exchange")
    _run(bin_dir, "bench_train",
         [*common, f"--devices={_devices(max(COUNTS))}", f"--global_batch_size={GLOBAL_BATCH}",
          f"--device_counts={','.join(map(str, COUNTS[1:]))}", f"--collective={no_exchange.NAME}",
          "--noplot", f"--output_dir={free}"], os.path.join(free, "log.txt"), progress)
    progress("  host parallelism around it (1, 2, 4 busy processes; median, best): "
             + ", ".join(f"{statistics.median(probed[n]):.2f}/{max(probed[n]):.2f}"
                         for n in COUNTS))
    measured = [_engine(os.path.join(folder, f"{n}dev")) for n in COUNTS]
    alone[1] = measured[0]  # one device is one replica
    exchange_free = {n: _engine(os.path.join(free, f"{n}dev")) for n in COUNTS[1:]}
    exchange_free[1] = measured[0]  # one device exchanges nothing anyway
    return alone, probed, measured, exchange_free


def predict_rate(model: str, n: int, alone: dict[int, dict], probed: dict[int, list[float]],
                 pools: dict[int, int], fits: Sequence[cost_fit.Fit], cores: int,
                 statistic: str) -> tuple[float, scaling.StepEstimate, float]:
    """(examples/s, the step, min(P(N), T(N))) predicted for `n` replicas from
    one replica's runs, the probe, the processes' intra-op threads `pools` and
    the fits, every input summarised by `statistic`."""
    summary = STATISTICS[statistic]
    seconds = {k: result["config"]["global_batch_size"] / engine_rate(result, statistic)
               for k, result in alone.items()}
    parallelism = {k: min(summary(v), pools[k]) for k, v in probed.items()}
    work = scaling.Workload(
        name=model, sizes=scaling.travelling_sizes(scaling.model_variable_sizes(model), "float32"),
        compute=scaling.Compute.shared_host(seconds, parallelism,
                                            f"bin/bench_train, engine variant, {statistic}"),
        examples=lambda k: GLOBAL_BATCH, batch=f"{GLOBAL_BATCH} global",
        device_kind="cpu", in_flight=cores)
    step = scaling.estimate(work, scaling.Choice("auto"), scaling.Topology(n, n, _unused_link()),
                            scaling.CostSource(fits))
    return GLOBAL_BATCH / step.step, step, parallelism[n]


def compare(model: str, alone: dict[int, dict], probed: dict[int, list[float]],
            pools: dict[int, int], measured: list[dict],
            fits: dict[str, Sequence[cost_fit.Fit]], cores: int,
            exchange_free: dict[int, dict]) -> list[dict]:
    """Predicted beside measured, per device count, by both statistics: from
    one replica (`predicted`), and from N replicas with no exchange
    (`from_replicas`), each plus the predicted all-reduce."""
    rows = []
    for result in measured:
        n = result["num_devices"]
        row = dict(model=model, devices=n)
        for statistic in STATISTICS:
            rate, step, parallelism = predict_rate(model, n, alone, probed, pools,
                                                   fits[statistic], cores, statistic)
            got = engine_rate(result, statistic)
            free_step = GLOBAL_BATCH / engine_rate(exchange_free[n], statistic)
            from_replicas = GLOBAL_BATCH / (free_step + step.comm)
            row[statistic] = dict(predicted=rate, measured=got, error=rate / got - 1,
                                  compute_ms=step.compute * 1e3, comm_ms=step.comm * 1e3,
                                  parallelism=parallelism, basis=step.basis,
                                  from_replicas=from_replicas,
                                  from_replicas_error=from_replicas / got - 1,
                                  no_exchange_ms=free_step * 1e3)
        rows.append(row)
    return rows


def _unused_link():
    """The cost source answers from fits on one host; the link is never read."""
    from tfloop.bench import links

    return links.intra("pcie4")


def table(rows: Sequence[dict], cores: int) -> str:
    """Markdown: predicted vs measured examples/s and the error, by the median
    and by the best repetition."""
    lines = ["| model | devices | measured (median) | from one replica | error | from N "
             "replicas, no exchange | error | measured (best) | from one replica | error | "
             "from N replicas | error | compute ms | no-exchange step ms | all-reduce ms | host "
             "parallelism (median/best) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        med, best = r["median"], r["best"]
        lines.append(
            f"| {r['model']} | {r['devices']} | {med['measured']:,.0f} | "
            f"{med['predicted']:,.0f} | {med['error']:+.1%} | {med['from_replicas']:,.0f} | "
            f"{med['from_replicas_error']:+.1%} | {best['measured']:,.0f} | "
            f"{best['predicted']:,.0f} | {best['error']:+.1%} | {best['from_replicas']:,.0f} | "
            f"{best['from_replicas_error']:+.1%} | {med['compute_ms']:.3g} | "
            f"{med['no_exchange_ms']:.3g} | {med['comm_ms']:.3g} | "
            f"{med['parallelism']:.2f}/{best['parallelism']:.2f} |")
    lines += ["", f"global batch {GLOBAL_BATCH}, --collective=auto, {cores} cores; compute = one "
              "replica's step timed alone at batch B/N x N / min(P(N), T(N)): P(N) N busy "
              "processes' speedup, probed before and after the measured runs, T(N) the "
              "process's intra-op threads (shown: the min); from N replicas: the N-replica step "
              f"timed with --collective={no_exchange.NAME} (no bytes move) + the all-reduce; "
              "all-reduce = fitted from bin/bench_collectives on N devices; 1 device is the "
              "measurement itself. median: every input and the measurement by their medians; best: by "
              "their fastest repetitions (the highest P(N)); compute and all-reduce ms: median"]
    return "\n".join(lines)


def main(*, models: Sequence[str], steps: int, repetitions: int, output_dir: str, bin_dir: str,
         progress: Progress = print) -> list[dict]:
    """Measures, predicts, prints the table; writes `against_measured.json`."""
    from tfloop import models as model_registry
    from tfloop.engine.runtime import devices as engine_devices

    for model in models:
        model_registry.check(model)
    out = os.path.join(output_dir, "measured")
    cores = engine_devices.usable_cores()
    progress(f"measuring on {cores} cores (load average {os.getloadavg()[0]:.2f}) into {out}")
    files = sweep_collectives(out, bin_dir, progress)
    fits = {statistic: cost_fit.fit_files(files, statistic=statistic) for statistic in STATISTICS}
    rows = []
    for model in models:
        common = ["--variants=engine", f"--steps={steps or STEPS.get(model, 100)}",
                  f"--repetitions={repetitions}", f"--model={model}"]
        alone, probed, measured, exchange_free = measure_model(model, out, bin_dir, common,
                                                               progress)
        pools = {n: pool_threads(n) for n in COUNTS}
        rows += compare(model, alone, probed, pools, measured, fits, cores, exchange_free)
    progress(table(rows, cores))
    progress(f"load average at the end {os.getloadavg()[0]:.2f}")
    path = report.write_json(os.path.join(output_dir, "against_measured.json"), dict(
        rows=rows, cores=cores,
        fits={statistic: [dict(collective=f.collective, devices=f.devices, latency_s=f.latency,
                               per_byte_s=f.per_byte, worst_error=f.worst_error) for f in group]
              for statistic, group in fits.items()}))
    progress(f"wrote {path}")
    return rows
