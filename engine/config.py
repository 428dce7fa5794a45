"""The run configuration: one frozen, typed record, validated once.

`bin/train` turns flags into a `RunConfig`; library code and tests build one
directly. Range checks happen here, at construction; checks that need the
machine or the file system (devices, data files, `model_dir`) happen in
`engine.run` before anything is created.
"""

from __future__ import annotations

import dataclasses
import os

import collectives
from engine.errors import ConfigError

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


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one training or evaluation run needs.

    Attributes:
      strategy: `default`, `one_device`, `mirrored`, `central_storage`,
        `multi_worker`, `parameter_server` (both from `TF_CONFIG`) or `tpu`.
      tpu: `--strategy=tpu`'s TPU: a Cloud TPU name, `grpc://host:port` or
        `local`; empty means `$TPU_NAME` (with neither, tpu is refused).
      devices: comma-separated `gpu:N`/`cpu:N`; empty means every GPU, or
        cpu:0 without one. More CPU ids than CPUs create logical CPU devices.
      collective: how gradients are all-reduced (a `collectives` name, or
        `module:Class` for a user's own).
      num_packs: gradient buckets per all-reduce (0 = no packing).
      pack_bytes: target bucket size in bytes instead of a count (0 = off).
      gradient_dtype: dtype gradients travel in (`float32`, `bfloat16`,
        `float16`): compression, cast back after the all-reduce.
      reduce_device: where `reduce_to_one_device` sums (e.g. `cpu:0`).
      collective_timeout: seconds a multi-worker collective may wait for its
        peers before failing (0 = TensorFlow's default, no timeout).
      model, dataset: registry names; `data_dir` holds the dataset's files.
      image_size: `image_folder` images are resized to this square size
        (other datasets have a fixed shape and ignore it).
      eval_fraction: `image_folder` without a `validation/` folder keeps this
        fraction of the images for evaluation.
      model_dir: checkpoints, `summaries/`, `metrics.json`; re-running with
        the same directory resumes from its latest checkpoint.
      global_batch_size: examples per step over all replicas; must divide by
        the replica count.
      train_steps: the global step training stops at.
      steps_per_loop: steps per compiled loop (Python runs once per loop).
      checkpoint_interval: steps between checkpoints (0 = only at the end).
      summary_interval: steps between train summaries (0 = none).
      mode: `train`, `evaluate` or `train_and_evaluate`; empty picks
        `train_and_evaluate` when the dataset has an eval split.
      eval_interval: steps between evaluations in `train_and_evaluate`
        (0 = only at the end).
      eval_steps: eval batches per evaluation; -1 = the whole eval split.
      optimizer, learning_rate: `sgd`, `momentum` (0.9) or `adam`.
      seed: initial weights and data order; the same seed gives the same
        initial weights whatever the strategy and device count.
      max_checkpoints: how many `ckpt-<step>` files to keep.
      eval_timeout: seconds the sidecar evaluator waits for a new checkpoint.
      startup_timeout: seconds a multi-worker task waits for every task of
        its cluster to come up before it gives up with a one-line error
        (0 = wait forever).
      auto_shard_policy: how multi-worker input is split between workers
        (`auto`, `file`, `data`, `off`; see `tf.data.experimental.AutoShardPolicy`).
      deterministic: make TensorFlow ops deterministic, so a rerun (or a
        resumed run) reproduces the same weights; also keeps every `tf.data`
        stage in order (without it, stages whose order does not decide which
        batch a step sees may run out of order, which is faster).
      jit_compile: compile each replica's forward and backward pass with XLA.
      mixed_precision: Keras dtype policy of the model: `float32`,
        `mixed_float16` (with a dynamic loss scale) or `mixed_bfloat16`;
        weights and optimizer state stay float32.
      fused_optimizer: update with TensorFlow's fused training kernels (one
        op per variable: `ResourceApplyAdam`, ...), same formulas as Keras.
      profile_steps: `A,B` writes a TensorBoard profiler trace of the steps
        from global step A to B into `summaries/train` (empty: none).
      intra_op_threads: threads each TensorFlow op may split its work over:
        -1 = one core's share per CPU replica when there are several (TF's
        default otherwise), 0 = TF's default (every core), N = N.
    """

    strategy: str = "mirrored"
    tpu: str = ""
    devices: str = ""
    collective: str = "auto"
    num_packs: int = 0
    pack_bytes: int = 0
    gradient_dtype: str = "float32"
    reduce_device: str = ""
    collective_timeout: float = 0.0
    model: str = "mlp"
    dataset: str = "synthetic"
    data_dir: str = ""
    image_size: int = 224
    eval_fraction: float = 0.2
    model_dir: str = "runs/default"
    global_batch_size: int = 256
    train_steps: int = 1000
    steps_per_loop: int = 100
    checkpoint_interval: int = 500
    summary_interval: int = 100
    mode: str = ""
    eval_interval: int = 0
    eval_steps: int = -1
    optimizer: str = "adam"
    learning_rate: float = 0.001
    seed: int = 0
    max_checkpoints: int = 5
    eval_timeout: float = 600.0
    startup_timeout: float = 300.0
    auto_shard_policy: str = "auto"
    deterministic: bool = False
    jit_compile: bool = False
    mixed_precision: str = "float32"
    fused_optimizer: bool = False
    profile_steps: str = ""
    intra_op_threads: int = -1

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

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
