"""`bin/predict_scaling --against=published`: the model beside multi-GPU
scaling others measured and published, from each publication's own
single-GPU rate and its hardware's link speeds.

Sources (each figure below is copied from them; docs/performance.md cites them):

* NVIDIA DeepLearningExamples, TensorFlow/Classification/ConvNets/resnet50v1.5/
  README.md, "Training performance results" (TF 20.06-tf1 NGC container,
  Horovod + NCCL, XLA, synthetic+real ImageNet, averaged over an epoch):
  DGX A100 (8x A100 40GB, NVLink 3 through NVSwitch), DGX-1 (8x V100 16GB,
  NVLink 2 hybrid cube mesh), DGX-2 (16x V100 32GB, NVSwitch).
* Horovod's documentation, docs/benchmarks.rst: "128 servers with 4 Pascal
  GPUs each connected by RoCE-capable 25 Gbit/s network. Horovod achieves
  90% scaling efficiency for both Inception V3 and ResNet-101, and 68% scaling
  efficiency for VGG-16" (tf_cnn_benchmarks, batch 64 per GPU in its example
  command). The page gives no single-GPU rate: the one used is TensorFlow's
  own P100 benchmark (tensorflow/docs site/en/r1/guide/performance/
  benchmarks.md, DGX-1 P100, synthetic, batch 64: Inception V3 142 img/s,
  VGG16 154, ResNet-50 219, ResNet-152 91.8). ResNet-101 is not in that
  table: its rate here is interpolated by FLOPs between ResNet-50 (3.9
  GFLOPs) and ResNet-152 (11.3 GFLOPs) at 7.6 GFLOPs, an estimate, marked so.
  The Horovod paper (Sergeev & Del Balso 2018, arXiv:1802.05799) shows the same
  benchmark; its figures are recalled here from memory, not quoted.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from tfloop.bench import links, scaling
from tfloop.bench.scaling import Progress

DLE = ("NVIDIA DeepLearningExamples, TensorFlow/Classification/ConvNets/resnet50v1.5/README.md, "
       "'Training performance results'")
HOROVOD = ("Horovod docs/benchmarks.rst ('128 servers with 4 Pascal GPUs each ... 25 Gbit/s'); "
           "single-GPU rate from tensorflow/docs r1 guide/performance/benchmarks.md (P100, "
           "synthetic, batch 64)")
#: Horovod's tensor fusion buffer (HOROVOD_FUSION_THRESHOLD default, 64 MB: recalled
#: from Horovod's tuning docs) and the ring-only NCCL 2 of 2017 (trees came in NCCL 2.4).
HOROVOD_FUSION = 64 << 20


@dataclasses.dataclass(frozen=True)
class Published:
    """One published scaling result and the hardware it ran on."""

    name: str
    keras_model: str
    per_device_batch: int
    rate_one: float
    devices: int
    per_host: int
    efficiency: float
    intra: str
    inter: Optional[str]
    nics_per_host: int
    collective: str
    pack_bytes: int
    source: str
    note: str = ""


RESULTS: tuple[Published, ...] = (
    Published("ResNet-50 v1.5, TF32+XLA, DGX A100", "ResNet50", 256, 909, 8, 8, 7000 / 8 / 909,
              "nvlink3", None, 1, "nccl", HOROVOD_FUSION, DLE),
    Published("ResNet-50 v1.5, AMP+XLA, DGX A100", "ResNet50", 256, 2375, 8, 8,
              17400 / 8 / 2375, "nvlink3", None, 1, "nccl", HOROVOD_FUSION, DLE,
              "gradients of the float32 variables, float32 (TF-AMP)"),
    Published("ResNet-50 v1.5, FP32+XLA, DGX-1 V100", "ResNet50", 128, 412, 8, 8, 3170 / 8 / 412,
              "nvlink2", None, 1, "nccl", HOROVOD_FUSION, DLE),
    Published("ResNet-50 v1.5, AMP+XLA, DGX-1 V100", "ResNet50", 256, 1270, 8, 8,
              9510 / 8 / 1270, "nvlink2", None, 1, "nccl", HOROVOD_FUSION, DLE),
    Published("ResNet-50 v1.5, AMP+XLA, DGX-2 V100", "ResNet50", 256, 1300, 16, 16,
              17250 / 16 / 1300, "nvlink2", None, 1, "nccl", HOROVOD_FUSION, DLE),
    Published("Inception V3, Horovod, 512 P100", "InceptionV3", 64, 142, 512, 4, 0.90,
              "pcie3", "eth25", 1, "nccl_ring", HOROVOD_FUSION, HOROVOD,
              "PCIe P100 hosts assumed; one 25 GbE RoCE card per host"),
    Published("ResNet-101, Horovod, 512 P100", "ResNet101", 64, 129, 512, 4, 0.90,
              "pcie3", "eth25", 1, "nccl_ring", HOROVOD_FUSION, HOROVOD,
              "single-GPU rate 129 img/s ESTIMATED (FLOPs interpolation), not published"),
    Published("VGG-16, Horovod, 512 P100", "VGG16", 64, 154, 512, 4, 0.68,
              "pcie3", "eth25", 1, "nccl_ring", HOROVOD_FUSION, HOROVOD,
              "PCIe P100 hosts assumed; one 25 GbE RoCE card per host"),
)


def gradient_sizes(keras_model: str) -> tuple[int, ...]:
    """float32 bytes of each trainable variable of `keras.applications.<name>`
    (weights=None: nothing downloaded), at 224x224x3 (299 for Inception V3)
    and 1000 classes."""
    import keras

    size = 299 if keras_model == "InceptionV3" else 224
    model = getattr(keras.applications, keras_model)(
        weights=None, input_shape=(size, size, 3), classes=1000)
    sizes = tuple(int(v.numpy().size) * 4 for v in model.trainable_variables)
    keras.backend.clear_session()
    return sizes


def predict_one(result: Published, sizes: Sequence[int], overlap: str) -> float:
    """The predicted scaling efficiency at the published device count."""
    work = scaling.Workload(
        name=result.keras_model, sizes=tuple(sizes),
        compute=scaling.Compute.weak(result.per_device_batch / result.rate_one, "published"),
        examples=lambda n: n * result.per_device_batch, batch=f"{result.per_device_batch}",
        overlap=overlap)
    [_, at] = scaling.predict(
        work, [1, result.devices], per_host=result.per_host, intra=links.intra(result.intra),
        inter=links.inter(result.inter) if result.inter else None,
        nics_per_host=result.nics_per_host,
        choices=[scaling.Choice(result.collective, pack_bytes=result.pack_bytes)])
    return at.efficiency


def main(*, progress: Progress = print) -> list[dict]:
    """Predicts each published result; prints the table."""
    rows, sizes = [], {}
    for result in RESULTS:
        if result.keras_model not in sizes:
            progress(f"counting the gradients of keras.applications.{result.keras_model} ...")
            sizes[result.keras_model] = gradient_sizes(result.keras_model)
        model_sizes = sizes[result.keras_model]
        rows.append(dict(result=result, megabytes=sum(model_sizes) / 1e6,
                         none=predict_one(result, model_sizes, "none"),
                         backward=predict_one(result, model_sizes, "backward")))
    progress(table(rows))
    return rows


def table(rows: Sequence[dict]) -> str:
    """Markdown: published beside predicted efficiency, both overlaps."""
    lines = ["| result | GPUs (per host) | links | 1-GPU img/s (batch) | gradients MB | "
             "published efficiency | predicted, no overlap (engine) | predicted, backward "
             "overlap (Horovod) | note |", "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        r = row["result"]
        wires = r.intra + (f" + {r.nics_per_host}x{r.inter}" if r.inter else "")
        lines.append(f"| {r.name} | {r.devices} ({r.per_host}) | {wires} | {r.rate_one:g} "
                     f"({r.per_device_batch}) | {row['megabytes']:.0f} | {r.efficiency:.1%} | "
                     f"{row['none']:.1%} | {row['backward']:.1%} | {r.note} |")
    lines += ["", "sources: " + DLE + "; " + HOROVOD,
              f"all-reduce: {', '.join(sorted({r['result'].collective for r in rows}))}, "
              f"packed into {HOROVOD_FUSION >> 20} MB buckets (Horovod's tensor fusion); "
              "link presets of bench/links.py"]
    return "\n".join(lines)
