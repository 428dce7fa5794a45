"""`bin/predict_scaling --against=measured`: the prediction against what this
machine measures, in one run.

Logical CPU devices share the host's cores: N replicas compute side by side
only as far as the cores go, and on a shared machine only as far as the
cores other work leaves. So the prediction for N replicas of a global batch
B is built from measurements of ONE replica and of the host, never of N
replicas::

    compute(N) = (one replica's step, timed alone at batch B/N with the
                  intra-op threads a replica of N gets)
                 x N / P(N)      P(N): what N busy processes get done at once,
                                 probed (`host_parallelism`) before and after
                                 the measured runs: min(N, cores) when idle
    comm(N)    = the step's all-reduces as `--collective=auto` routes them,
                 each latency + per_byte * bytes fitted from a
                 bin/bench_collectives sweep on N devices (latencies overlap
                 up to the cores, `bench.scaling.comm_seconds`)
    predicted examples/s = B / (compute(N) + comm(N))

and set beside `bin/bench_train --device_counts=1,2,4`, run in the same
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

from tfloop.bench import cost_fit, report, scaling
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


def host_parallelism(counts: Sequence[int], repeats: int = 3) -> dict[int, float]:
    """P(k) = k x t(1) / t(k): how many processes' worth of work k busy
    processes get done at once on this host now (k up to the free cores on an
    idle host, fewer while other work shares it); the median of `repeats`."""
    samples: dict[int, list[float]] = {k: [] for k in counts}
    for _ in range(repeats):
        one = _busy(1)
        for k in counts:
            samples[k].append(1.0 if k == 1 else k * one / _busy(k))
    return {k: statistics.median(v) for k, v in samples.items()}


def sweep_collectives(out: str, bin_dir: str, progress: Progress) -> list[cost_fit.Fit]:
    """Fits of the collectives `auto` uses on CPUs, on 2 and 4 devices."""
    files = []
    for n in COUNTS[1:]:
        folder = os.path.join(out, f"collectives_{n}dev")
        _run(bin_dir, "bench_collectives",
             [f"--devices={_devices(n)}", "--collectives=hierarchical_copy,reduce_to_one_device",
              f"--sizes={SWEEP_SIZES}", "--nooverhead", "--noplot", "--rounds=2", "--repeats=3",
              f"--output_dir={folder}"], os.path.join(folder, "log.txt"), progress)
        files.append(os.path.join(folder, "bench_collectives.json"))
    return cost_fit.fit_files(files)


def _engine_step(folder: str) -> tuple[float, dict]:
    """(seconds per step at the engine's median, the result) of a bench_train run."""
    [path] = glob.glob(os.path.join(folder, "bench_train_*dev.json"))
    with open(path) as f:
        result = json.load(f)
    [row] = [r for r in result["rows"] if r["variant"] == "engine"]
    return result["config"]["global_batch_size"] / row["median"], result


def measure_model(model: str, out: str, bin_dir: str, common: Sequence[str],
                  progress: Progress) -> tuple[dict[int, float], dict[int, float], list[dict]]:
    """One replica alone at each batch B/N, then the N-device sweep measured
    with the host's parallelism probed before and after it."""
    from tfloop.engine.runtime import devices as engine_devices

    alone = {}
    for n in COUNTS[1:]:
        threads = engine_devices.intra_op_threads_for([f"/cpu:{i}" for i in range(n)])
        folder = os.path.join(out, model, f"alone_batch{GLOBAL_BATCH // n}")
        _run(bin_dir, "bench_train",
             [*common, "--devices=cpu:0", f"--global_batch_size={GLOBAL_BATCH // n}",
              f"--intra_op_threads={threads or 0}", f"--output_dir={folder}"],
             os.path.join(folder, "log.txt"), progress)
        alone[n], _ = _engine_step(folder)
    folder = os.path.join(out, model, "measured")
    before = host_parallelism(COUNTS)
    _run(bin_dir, "bench_train",
         [*common, f"--devices={_devices(max(COUNTS))}", f"--global_batch_size={GLOBAL_BATCH}",
          f"--device_counts={','.join(map(str, COUNTS))}", "--noplot", f"--output_dir={folder}"],
         os.path.join(folder, "log.txt"), progress)
    after = host_parallelism(COUNTS)
    parallelism = {n: (before[n] + after[n]) / 2 for n in COUNTS}
    progress(f"  host parallelism around it (1, 2, 4 busy processes): "
             + ", ".join(f"{parallelism[n]:.2f}" for n in COUNTS))
    measured = [_engine_step(os.path.join(folder, f"{n}dev"))[1] for n in COUNTS]
    alone[1] = _engine_step(os.path.join(folder, "1dev"))[0]  # one device is one replica
    return alone, parallelism, measured


def compare(model: str, alone: dict[int, float], parallelism: dict[int, float],
            measured: list[dict], fits: Sequence[cost_fit.Fit], cores: int) -> list[dict]:
    """Predicted beside measured, per device count."""
    sizes = scaling.travelling_sizes(scaling.model_variable_sizes(model), "float32")
    work = scaling.Workload(
        name=model, sizes=sizes,
        compute=scaling.Compute.shared_host(alone, parallelism,
                                            "bin/bench_train, engine variant, median"),
        examples=lambda n: GLOBAL_BATCH, batch=f"{GLOBAL_BATCH} global",
        device_kind="cpu", in_flight=cores)
    costs = scaling.CostSource(fits)
    rows = []
    for result in measured:
        n = result["num_devices"]
        topo = scaling.Topology(n, n, _unused_link())
        step = scaling.estimate(work, scaling.Choice("auto"), topo, costs)
        [row] = [r for r in result["rows"] if r["variant"] == "engine"]
        predicted = GLOBAL_BATCH / step.step
        rows.append(dict(model=model, devices=n, predicted=predicted, measured=row["median"],
                         low=row["low"], high=row["high"],
                         error=predicted / row["median"] - 1,
                         compute_ms=step.compute * 1e3, comm_ms=step.comm * 1e3,
                         parallelism=parallelism[n], basis=step.basis))
    return rows


def _unused_link():
    """The cost source answers from fits on one host; the link is never read."""
    from tfloop.bench import links

    return links.intra("pcie4")


def table(rows: Sequence[dict], cores: int) -> str:
    """Markdown: predicted vs measured examples/s and the error."""
    lines = ["| model | devices | predicted examples/s | measured (median) | min – max | error "
             "| compute ms | all-reduce ms | host parallelism |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['devices']} | {r['predicted']:,.0f} | "
                     f"{r['measured']:,.0f} | {r['low']:,.0f} – {r['high']:,.0f} | "
                     f"{r['error']:+.1%} | {r['compute_ms']:.3g} | {r['comm_ms']:.3g} | "
                     f"{r['parallelism']:.2f} |")
    lines += ["", f"global batch {GLOBAL_BATCH}, --collective=auto, {cores} cores; compute = one "
              "replica's step timed alone at batch B/N x N / the host's parallelism (N busy "
              "processes' speedup, probed before and after the measured runs); all-reduce = "
              "fitted from bin/bench_collectives on N devices (1 device: the measurement itself)"]
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
    fits = sweep_collectives(out, bin_dir, progress)
    common = ["--variants=engine", f"--steps={steps}", f"--repetitions={repetitions}"]
    rows = []
    for model in models:
        alone, parallelism, measured = measure_model(
            model, out, bin_dir, common + [f"--model={model}"], progress)
        rows += compare(model, alone, parallelism, measured, fits, cores)
    progress(table(rows, cores))
    progress(f"load average at the end {os.getloadavg()[0]:.2f}")
    path = report.write_json(os.path.join(output_dir, "against_measured.json"), dict(
        rows=rows, cores=cores,
        fits=[dict(collective=f.collective, devices=f.devices, latency_s=f.latency,
                   per_byte_s=f.per_byte, worst_error=f.worst_error) for f in fits]))
    progress(f"wrote {path}")
    return rows
