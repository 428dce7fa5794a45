"""The run configuration: one frozen, typed record, validated once.

`bin/train` turns flags into a `RunConfig`; library code and tests build one
directly. Range checks happen here, at construction; checks that need the
machine or the file system (devices, data files, `model_dir`) happen in
`engine.run` before anything is created.
"""

from __future__ import annotations

import dataclasses
import os

from tfloop.engine.errors import ConfigError

MODES = ("train", "evaluate", "train_and_evaluate")
SHARD_POLICIES = ("auto", "file", "data", "off")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def parse_profile_steps(text: str):
    """`"A,B"` → `(A, B)`: profile the steps that take the global step from A to B.

    Empty means no profiling. Raises the one-line ConfigError otherwise.
    """
    if not text:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        first, last = (int(p) for p in parts)
    except ValueError:
        raise ConfigError(
            f"--profile_steps={text!r} is not two integers A,B; e.g. --profile_steps=100,110"
        ) from None
    if not 0 <= first < last:
        raise ConfigError(
            f"--profile_steps={text!r} needs 0 <= A < B (the trace covers steps A to B); "
            "e.g. --profile_steps=100,110"
        )
    return first, last


def option(default, help: str):
    """A `RunConfig` field and its flag's help, written once: `bin/train`
    defines `--<field name>` from the default, type and this help."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one training or evaluation run needs.

    Each field's help (`dataclasses.fields(RunConfig)[i].metadata["help"]`)
    is also the help of its flag (`bin/flag_defs.py` defines them).
    """

    # Distribution.
    strategy: str = option(
        "mirrored", "default | one_device | mirrored | central_storage | multi_worker | "
        "parameter_server (both read TF_CONFIG) | tpu.")
    tpu: str = option(
        "", "--strategy=tpu: a Cloud TPU name, grpc://host:port, or local on a TPU VM "
        "(empty: $TPU_NAME).")
    devices: str = option(
        "", "Comma-separated gpu:N / cpu:N. Empty: every GPU, or cpu:0 without one. "
        "CPU ids beyond the physical CPUs create logical CPU devices.")
    collective: str = option(
        "auto", "Gradient all-reduce: auto | nccl | ring | hierarchical_copy | "
        "reduce_to_one_device, or module:Class for your own.")
    num_packs: int = option(0, "Pack gradients into this many buckets per all-reduce (0: off).")
    pack_bytes: int = option(0, "Pack gradients into buckets of about this many bytes (0: off).")
    gradient_dtype: str = option(
        "float32", "Dtype gradients travel in: float32 | bfloat16 | float16 (compression).")
    reduce_device: str = option(
        "", "Where --collective=reduce_to_one_device sums, e.g. cpu:0 (default: first device).")
    collective_timeout: float = option(
        0.0, "multi_worker: seconds a collective waits for its peers before failing (0: none).")
    # Model and data.
    task: str = option(
        "", "Your own task, module:Class (a tfloop.engine.task.Task subclass, imported from the "
        "working directory or PYTHONPATH); it supplies the model, data and loss.")
    model: str = option("mlp", "Model name: mlp | cnn | resnet_small | mobilenet_v2 | resnet50.")
    dataset: str = option("synthetic", "Dataset name: synthetic | mnist | tfrecord | image_folder.")
    data_dir: str = option(
        "", "Folder with the dataset's files (mnist: mnist.npz; tfrecord: "
        "bin/convert_to_tfrecord's output; image_folder: one sub-folder of JPEG/PNG images "
        "per class).")
    image_size: int = option(
        224, "image_folder: images are resized to this square size (others ignore it).")
    eval_fraction: float = option(
        0.2, "image_folder without a validation/ folder: fraction of images kept for eval.")
    # The loop.
    model_dir: str = option(
        "runs/default", "Checkpoints, summaries/ and metrics.json; reusing it resumes the run.")
    global_batch_size: int = option(
        256, "Examples per step over all replicas; must divide by the replica count.")
    train_steps: int = option(1000, "Global step to train to.")
    steps_per_loop: int = option(
        100, "Steps per compiled loop (one tf.function call, one Python round trip, one "
        "progress line); not an epoch.")
    checkpoint_interval: int = option(500, "Steps between checkpoints (0: only at the end).")
    summary_interval: int = option(
        100, "Steps between TensorBoard train summaries (0: none).")
    mode: str = option(
        "", "train | evaluate | train_and_evaluate. "
        "Default: train_and_evaluate when the dataset has an eval split.")
    eval_interval: int = option(0, "Steps between evaluations (0: only at the end).")
    eval_steps: int = option(-1, "Eval batches per evaluation (-1: the whole eval split).")
    optimizer: str = option("adam", "sgd | momentum (0.9) | adam.")
    learning_rate: float = option(0.001, "Learning rate.")
    seed: int = option(
        0, "Seed for initial weights and data order; the same seed gives the same initial "
        "weights on any strategy.")
    init_from: str = option(
        "", "Start a new run from these model weights (fine-tuning): another run's --model_dir "
        "or ckpt-N, an export/<step> folder, a .keras or .weights.h5 file. Step 0, fresh "
        "optimizer; ignored when --model_dir already has checkpoints (it resumes).")
    export: bool = option(
        True, "Write model_dir/export/<step>/ (a SavedModel with a serving_default signature, "
        "and model.keras for a Keras model) when training finishes.")
    max_checkpoints: int = option(5, "How many ckpt-<step> checkpoints to keep.")
    # Cluster.
    eval_timeout: float = option(
        600.0, "Evaluator task: seconds to wait for a new checkpoint before stopping.")
    startup_timeout: float = option(
        300.0, "multi_worker: seconds to wait for every task of TF_CONFIG's cluster to come "
        "up before giving up (0: forever).")
    auto_shard_policy: str = option(
        "auto", "multi_worker input sharding: auto | file | data | off.")
    # Speed and reproducibility.
    deterministic: bool = option(
        False, "Deterministic TensorFlow ops and tf.data stages in order: reruns and resumed "
        "runs give the same weights.")
    jit_compile: bool = option(
        False, "Compile each replica's forward and backward pass with XLA.")
    mixed_precision: str = option(
        "float32", "float32 | mixed_float16 (with a dynamic loss scale) | mixed_bfloat16; "
        "weights stay float32.")
    fused_optimizer: bool = option(
        False, "Update with TensorFlow's fused kernels (one op per variable), same formulas.")
    profile_steps: str = option(
        "", "A,B: TensorBoard profiler trace of global steps A to B into "
        "<model_dir>/summaries/train (empty: none).")
    intra_op_threads: int = option(
        -1, "Threads one TensorFlow op may use: -1 = cores / CPU replicas when there are "
        "several CPU replicas (else TF's default), 0 = TF's default (all cores), N = N.")

    def __post_init__(self):
        positive = ("global_batch_size", "steps_per_loop", "max_checkpoints", "image_size")
        non_negative = (
            "train_steps", "checkpoint_interval", "summary_interval", "eval_interval", "seed",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name}={getattr(self, name)} must be a positive integer")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name}={getattr(self, name)} must be 0 or more")
        # Imported here, not at the top: bin/train defines its flags from this
        # module before TensorFlow (which `collectives` imports) loads.
        from tfloop import collectives

        collectives.check_options(num_packs=self.num_packs, pack_bytes=self.pack_bytes,
                                  gradient_dtype=self.gradient_dtype)
        if self.eval_steps == 0 or self.eval_steps < -1:
            raise ConfigError(
                f"--eval_steps={self.eval_steps} must be a positive number of batches, "
                "or -1 for the whole eval split"
            )
        if self.auto_shard_policy not in SHARD_POLICIES:
            raise ConfigError(
                f"--auto_shard_policy={self.auto_shard_policy!r} is not a policy; choose one of: "
                f"{', '.join(SHARD_POLICIES)}"
            )
        for name in ("collective_timeout", "eval_timeout", "startup_timeout"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name}={getattr(self, name)} must be 0 or more seconds")
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"--eval_fraction={self.eval_fraction} must be at least 0 and below 1")
        if not self.learning_rate > 0:
            raise ConfigError(f"--learning_rate={self.learning_rate} must be positive")
        if self.mode and self.mode not in MODES:
            raise ConfigError(f"--mode={self.mode!r} is not a mode; choose one of: {', '.join(MODES)}")
        if not self.model_dir:
            raise ConfigError("--model_dir is empty; name the directory for checkpoints and summaries")
        if self.mixed_precision not in PRECISIONS:
            raise ConfigError(
                f"--mixed_precision={self.mixed_precision!r} is not a policy; choose one of: "
                f"{', '.join(PRECISIONS)}"
            )
        parse_profile_steps(self.profile_steps)
        if self.intra_op_threads < -1:
            raise ConfigError(
                f"--intra_op_threads={self.intra_op_threads} must be -1 (a share of the cores "
                "per CPU replica), 0 (TensorFlow's default) or a positive count"
            )

    @property
    def profile_range(self):
        """`profile_steps` as `(A, B)`, or None."""
        return parse_profile_steps(self.profile_steps)

    @property
    def train_summary_dir(self) -> str:
        return os.path.join(self.model_dir, "summaries", "train")

    @property
    def eval_summary_dir(self) -> str:
        return os.path.join(self.model_dir, "summaries", "eval")

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.model_dir, "metrics.json")

    @property
    def evaluations_path(self) -> str:
        """Where `--mode=evaluate` and the evaluator task add their results,
        beside the training record in metrics.json, which they leave alone."""
        return os.path.join(self.model_dir, "evaluations.json")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
