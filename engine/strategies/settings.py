"""Where the replicas run and how their gradients travel (`Distribution`), and
a cluster's waits, sharding and stragglers (`Cluster`).

Declared here, beside the strategies that read them, with
`engine.option.option`; `engine.config.RunConfig` composes them into
bin/train's flat flags. Imports no TensorFlow at module level (this
package's `__init__` loads its strategies on first use, not on import).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tfloop.engine.errors import ConfigError
from tfloop.engine.option import (INT32_MAX, MAX_PACK_BYTES, MAX_VIRTUAL_GPUS, NON_NEGATIVE,
                                  Settings, count, factor_or_off, one_of, option, seconds,
                                  service_address)
from tfloop.launch import platforms  # the cluster sources (standard library only)

SHARD_POLICIES = ("auto", "file", "data", "off")


@dataclasses.dataclass(frozen=True)
class Distribution(Settings):
    """Where the replicas run and how their gradients travel."""

    TITLE: ClassVar[str] = "Distribution"

    strategy: str = option(
        "mirrored", "default | one_device | mirrored | central_storage | multi_worker | "
        "parameter_server (both read TF_CONFIG) | tpu.")
    tpu: str = option(
        "", "--strategy=tpu: a Cloud TPU name, grpc://host:port, or local on a TPU VM "
        "(empty: $TPU_NAME).")
    devices: str = option(
        "", "Comma-separated gpu:N / cpu:N. Empty: every GPU, or cpu:0 without one. "
        "CPU ids beyond the physical CPUs create logical CPU devices.")
    virtual_gpus: int = option(
        0, "Split each GPU into N logical GPUs (0: off), so that one GPU runs N replicas and "
        "tests every collective but NCCL (which needs one physical GPU per replica); "
        "refused on a machine without a GPU.", check=count(0, MAX_VIRTUAL_GPUS))
    gpu_memory_growth: bool = option(
        False, "Allocate GPU memory as needed instead of nearly all of each visible GPU at "
        "start (lets processes share a GPU; same as TF_FORCE_GPU_ALLOW_GROWTH=true).")
    collective: str = option(
        "auto", "Gradient all-reduce: auto | nccl | ring | hierarchical_copy | "
        "reduce_to_one_device, or module:Class for your own (imported from sys.path and run "
        "inside every step: trusted code only; its results are checked).")
    num_packs: int = option(
        0, "Pack gradients into this many buckets per all-reduce (0: off).")
    pack_bytes: int = option(
        0, "Pack gradients into buckets of about this many bytes (0: off).")
    gradient_dtype: str = option(
        "float32", "Dtype gradients travel in: float32 | bfloat16 | float16 (compression).")
    reduce_device: str = option(
        "", "Where --collective=reduce_to_one_device sums, e.g. cpu:0 (default: first device).")
    collective_timeout: float = option(
        0.0, "multi_worker: seconds a collective waits for its peers before failing (0: none).",
        check=seconds)
    check_collective: int = option(
        0, "Debug: compare the first N all-reduces with the plain sum of the replicas and stop "
        "at a difference, naming the gradient (0: off; e.g. 3 to test a --collective=module:Class).",
        check=NON_NEGATIVE)

    def __post_init__(self):
        super().__post_init__()
        # Imported here, not at the top: bin/train defines its flags from this
        # module before TensorFlow (which `collectives` imports) loads.
        from tfloop import collectives

        collectives.check_options(num_packs=self.num_packs, pack_bytes=self.pack_bytes,
                                  gradient_dtype=self.gradient_dtype)
        for name, high in (("num_packs", INT32_MAX), ("pack_bytes", MAX_PACK_BYTES)):
            if getattr(self, name) > high:
                raise ConfigError(f"--{name}={getattr(self, name)} must be at most {high}")
        self._check_gpu_options()

    def _check_gpu_options(self) -> None:
        """--gpu_memory_growth needs a GPU among --devices."""
        if not self.gpu_memory_growth:
            return
        from tfloop.collectives import device_names  # TensorFlow: see __post_init__

        named = [device_names.canonical(d) for d in self.devices.split(",") if d.strip()]
        if named and not any(d and device_names.kind(d) == "gpu" for d in named):
            raise ConfigError(f"--gpu_memory_growth applies to GPUs, and --devices={self.devices} "
                              "names none; drop it or name GPUs, e.g. --devices=gpu:0,gpu:1")


@dataclasses.dataclass(frozen=True)
class Cluster(Settings):
    """A multi-worker cluster's waits, sharding and stragglers."""

    TITLE: ClassVar[str] = "Cluster"

    eval_timeout: float = option(
        600.0, "Evaluator task: seconds to wait for a new checkpoint before stopping.",
        check=seconds)
    startup_timeout: float = option(
        300.0, "multi_worker: seconds to wait for every task of TF_CONFIG's cluster to come "
        "up before giving up, and --data_service: for its dispatcher (0: forever).",
        check=seconds)
    auto_shard_policy: str = option(
        "auto", "multi_worker input sharding: auto | file | data | off.",
        check=one_of(SHARD_POLICIES, "policy"))
    data_service: str = option(
        "", "grpc://host:port of a tf.data service dispatcher (bin/data_service starts one with "
        "its data workers): the train pipeline runs on those workers, dealt out with dynamic "
        "sharding (each example once per pass, in the order the workers finish; a resumed run "
        "starts a new pass); evaluation stays here. Empty: the pipeline runs here "
        "(docs/data.md).", check=service_address)
    cluster_from: str = option(
        "auto", "Where the cluster comes from: auto (TF_CONFIG, else Vertex AI's CLUSTER_SPEC, "
        "else a JobSet / Indexed Job pod's JOB_COMPLETION_INDEX with TFLOOP_NUM_WORKERS) | "
        "tf_config | vertex | jobset (that one only; see docs/clusters.md).",
        check=one_of(platforms.SOURCES, "cluster source"))
    hang_timeout: float = option(
        1800.0, "Seconds without a train loop ending before each task dumps its threads' "
        "stacks, phase and last step to <model_dir>/diagnostics/ and goes on (0: never).",
        check=seconds)
    straggler_threshold: float = option(
        3.0, "multi_worker: name a worker whose own time per step (outside the all-reduce) is "
        "over this many times the other workers' median for 3 loops in a row (0: off).",
        check=factor_or_off)
