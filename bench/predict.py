"""What `bin/predict_scaling` does with its flags' values: read the inputs,
build the workload, predict every device count, print the table, write the
JSON and the plot (`bench.scaling`, `bench.scaling_report`)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional, Sequence

from tfloop.bench import cost_fit, links, scaling, scaling_report
from tfloop.bench.scaling import Progress
from tfloop.bench.links import ScalingError
from tfloop.bench.sizes import parse_size

#: The collectives compared by default, per device kind.
DEFAULT_COLLECTIVES = {
    "gpu": ("nccl", "ring", "hierarchical_copy", "reduce_to_one_device", "two_level"),
    "cpu": ("ring", "hierarchical_copy", "reduce_to_one_device", "auto"),
}
DEFAULT_PACKINGS = ("none", "num_packs=1", "pack_bytes=4M", "pack_bytes=32M")
DEFAULT_COUNTS = tuple(str(1 << i) for i in range(11))  # 1 .. 1024
#: Device memory bandwidth for compression's casts, bytes/s (H100 HBM3 3.35 TB/s,
#: vendor spec sheet; a CPU's few tens of GB/s).
DEFAULT_MEMORY_BANDWIDTH = {"gpu": 2000e9, "cpu": 20e9}


def parse_packings(values: Sequence[str]) -> list[tuple[int, int]]:
    """["none", "num_packs=1", "pack_bytes=4M"] → [(0, 0), (1, 0), (0, 4 MiB)]."""
    out = []
    for value in values:
        name, _, amount = value.strip().partition("=")
        try:
            if name == "none" and not amount:
                out.append((0, 0))
            elif name == "num_packs" and int(amount) > 0:
                out.append((int(amount), 0))
            elif name == "pack_bytes" and parse_size(amount) > 0:
                out.append((0, parse_size(amount)))
            else:
                raise ValueError(value)
        except ValueError:
            raise ScalingError(f"--packings: {value!r} is not a packing; write none, "
                               "num_packs=N or pack_bytes=SIZE (e.g. none,num_packs=1,"
                               "pack_bytes=4M)") from None
    return out


def parse_counts(values: Sequence[str]) -> list[int]:
    """["1", "8", "64"] → [1, 8, 64]; each 1..65536, ascending, starting at 1."""
    try:
        counts = sorted({int(v) for v in values})
    except ValueError:
        raise ScalingError(f"--device_counts={','.join(values)} is not a list of integers; "
                           "e.g. --device_counts=1,8,64,512") from None
    if not counts or counts[0] < 1 or counts[-1] > 65536:
        raise ScalingError(f"--device_counts={','.join(values)}: counts must lie in 1..65536")
    return counts if counts[0] == 1 else [1, *counts]  # efficiency is against one device


def step_from_bench_train(path: str) -> tuple[float, int, int]:
    """(seconds per step, global batch, devices) of the engine's median in a
    `bin/bench_train` JSON (one device count's `bench_train_<model>_<N>dev.json`)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise ScalingError(f"--bench_train_json={path}: cannot read it ({error}); give the "
                           "bench_train_<model>_1dev.json that bin/bench_train writes") from None
    rows = [r for r in data.get("rows", []) if r.get("variant") == "engine"] \
        if isinstance(data, dict) else []
    if not rows:
        raise ScalingError(f"--bench_train_json={path} has no 'engine' row; run bin/bench_train "
                           "with --variants=engine on one device")
    batch = int(data["config"]["global_batch_size"])
    return batch / rows[0]["median"], batch, int(data.get("num_devices", 1))


@dataclasses.dataclass(frozen=True)
class Request:
    """The binary's flags, parsed."""

    model: str = ""
    parameters: float = 0.0
    tensors: int = 0
    image_size: int = 0
    num_classes: int = 0
    global_batch_size: int = 0
    per_device_batch: int = 0
    step_ms: float = 0.0
    bench_train_json: str = ""
    device_kind: str = "gpu"
    device_counts: tuple[str, ...] = DEFAULT_COUNTS
    gpus_per_host: int = 8
    intra_link: str = "nvlink3"
    inter_link: str = "ib_hdr"
    nics_per_host: int = 1
    collectives: tuple[str, ...] = ()
    packings: tuple[str, ...] = DEFAULT_PACKINGS
    gradient_dtype: str = "float32"
    overlap: str = "none"
    sweeps: tuple[str, ...] = ()
    concurrent_all_reduces: int = 0
    output_dir: str = ""
    plot: bool = True


def check(request: Request) -> None:
    """Every mistake in the request, before anything is built (one line each)."""
    if bool(request.model) == bool(request.parameters):
        raise ScalingError("give exactly one of --model (a models registry name) and "
                           "--parameters (a count such as 25.6e6, with --tensors)")
    if bool(request.global_batch_size) == bool(request.per_device_batch):
        raise ScalingError("give exactly one of --global_batch_size (a fixed global batch "
                           "split N ways) and --per_device_batch (a fixed batch per device)")
    if bool(request.step_ms) == bool(request.bench_train_json):
        raise ScalingError("give exactly one of --step_ms (one device's step at the batch "
                           "given) and --bench_train_json (a bin/bench_train result on one device)")
    if request.device_kind not in DEFAULT_COLLECTIVES:
        raise ScalingError(f"--device_kind={request.device_kind!r}: choose gpu or cpu")
    if request.gradient_dtype not in scaling.DTYPE_BYTES:
        raise ScalingError(f"--gradient_dtype={request.gradient_dtype!r}: choose one of "
                           f"{', '.join(scaling.DTYPE_BYTES)}")
    if request.device_kind == "cpu" and "nccl" in request.collectives:
        raise ScalingError("--collectives=nccl needs --device_kind=gpu: NCCL has no CPU kernel")
    for name in ("gpus_per_host", "nics_per_host"):
        if getattr(request, name) < 1:
            raise ScalingError(f"--{name}={getattr(request, name)} must be at least 1")
    links.intra(request.intra_link), links.inter(request.inter_link)
    parse_counts(request.device_counts), parse_packings(request.packings)


def workload(request: Request, sizes: Sequence[int]) -> scaling.Workload:
    """The step to predict: its gradients, its compute, its examples."""
    batch = request.per_device_batch or request.global_batch_size
    if request.bench_train_json:
        seconds, measured_batch, devices = step_from_bench_train(request.bench_train_json)
        if devices != 1 or measured_batch != batch:
            raise ScalingError(
                f"--bench_train_json={request.bench_train_json} timed global batch "
                f"{measured_batch} on {devices} device(s); the prediction needs one device at "
                f"batch {batch} (the batch flag given): rerun bin/bench_train --devices=<one> "
                f"--global_batch_size={batch}")
        what = f"measured: {os.path.basename(request.bench_train_json)}"
    else:
        seconds, what = request.step_ms / 1e3, "given by --step_ms"
    weak = bool(request.per_device_batch)
    compute = scaling.Compute.weak(seconds, what) if weak else scaling.Compute.strong(seconds, what)
    elements = sum(sizes) / scaling.DTYPE_BYTES["float32"]
    compressed = request.gradient_dtype != "float32"
    memory = DEFAULT_MEMORY_BANDWIDTH[request.device_kind]
    return scaling.Workload(
        name=request.model or f"{request.parameters:.4g} parameters",
        sizes=scaling.travelling_sizes([(int(s // 4), 4) for s in sizes], request.gradient_dtype),
        compute=compute,
        examples=(lambda n: n * batch) if weak else (lambda n: batch),
        batch=f"{batch} per device" if weak else f"{batch} global",
        device_kind=request.device_kind, overlap=request.overlap,
        # Two casts per element, float32 -> 16 bits -> float32: 12 bytes through memory.
        cast_seconds=12 * elements / memory if compressed else 0.0,
        in_flight=request.concurrent_all_reduces or (
            1 if request.device_kind == "gpu" else os.cpu_count() or 1))


def float32_sizes(request: Request) -> list[int]:
    """Bytes of each gradient in float32: the model's variables, or
    `--parameters` split evenly over `--tensors`."""
    if request.model:
        from tfloop import models

        shape = ((request.image_size, request.image_size, 3) if request.image_size
                 else (28, 28, 1))
        models.check(request.model, shape, larger="add --image_size={size} (its default, 0, "
                                                  "models the synthetic 28x28x1 images)")
        variables = scaling.model_variable_sizes(request.model, input_shape=shape,
                                                 num_classes=request.num_classes or 10)
        return [count * 4 for count, _ in variables]
    tensors = max(1, request.tensors)
    total = int(request.parameters) * 4
    return [total // tensors + (1 if i < total % tensors else 0) for i in range(tensors)]


def main(request: Request, *, progress: Progress = print) -> list[scaling.Prediction]:
    """Predicts, prints the table, writes `predict_scaling.json` and the PNG."""
    check(request)
    from tfloop.bench import report

    if request.plot and request.output_dir and not report.can_plot():
        raise ScalingError(report.NO_PLOT)
    fits = cost_fit.fit_files(list(request.sweeps)) if request.sweeps else []
    work = workload(request, float32_sizes(request))
    collectives = request.collectives or DEFAULT_COLLECTIVES[request.device_kind]
    choices = [scaling.Choice(c, packs, nbytes) for c in collectives
               for packs, nbytes in parse_packings(request.packings)]
    predictions = scaling.predict(
        work, parse_counts(request.device_counts), per_host=request.gpus_per_host,
        intra=links.intra(request.intra_link), inter=links.inter(request.inter_link),
        nics_per_host=request.nics_per_host, choices=choices,
        costs=scaling.CostSource(fits))
    for fit in fits:
        progress(f"fitted {fit.collective} on {fit.devices} devices: latency "
                 f"{fit.latency * 1e6:.1f} us, busbw {fit.busbw / 1e9:.3g} GB/s "
                 f"({fit.points} sizes, worst point {fit.worst_error:.0%} off; {fit.source})")
    progress(scaling_report.prediction_table(work, predictions, collectives))
    if request.output_dir:
        files = scaling_report.write(work, predictions, collectives, request.output_dir,
                                     dataclasses.asdict(request), plot_png=request.plot)
        progress(f"wrote {', '.join(files)}")
    return predictions
