"""The loop's settings: `Loop` (the run directory, the batch, how long, every
interval) and `Step` (how each step runs: `Trainer(options=...)`).

Declared here, beside the code that reads them, with `engine.option.option`;
`engine.config.RunConfig` composes them with the other rooms' sections into
bin/train's flat flags (`--clip_norm`, not `--step.clip_norm`). Imports no
TensorFlow (bin/train reads these before it loads).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tfloop.engine.errors import ConfigError
from tfloop.engine.option import (INT32_MAX, NON_NEGATIVE, POSITIVE, Settings, batches_or_all,
                                  non_negative_number, one_of, option, optional_path,
                                  required_path)

MODES = ("train", "evaluate", "train_and_evaluate")
#: Every mode a run can be in: --mode's values, and the evaluator task's own
#: (chosen by its TF_CONFIG role, never by --mode). engine.run has one function each.
RUN_MODES = MODES + ("continuous_evaluate",)
NAN_POLICIES = ("stop", "skip_step")


@dataclasses.dataclass(frozen=True)
class Loop(Settings):
    """The run directory, the batch, how long, and every interval of the loop."""

    TITLE: ClassVar[str] = "The loop"

    model_dir: str = option(
        "runs/default", "Checkpoints, summaries/ and metrics.json; reusing it resumes the run. "
        "On a cluster: gs://... or a volume every task shares. Default on Vertex AI: "
        "$AIP_CHECKPOINT_DIR (else $AIP_MODEL_DIR).", check=required_path)
    summaries_dir: str = option(
        "", "TensorBoard summaries (train/, eval/ under it); empty: <model_dir>/summaries, or "
        "$AIP_TENSORBOARD_LOG_DIR on Vertex AI.", check=optional_path)
    global_batch_size: int = option(
        256, "Examples per step (one optimizer update) over all replicas and, with "
        "--accumulation_steps, all its micro-batches; must divide by the replica count times "
        "--accumulation_steps.", check=POSITIVE, per_range=True)
    per_replica_batch_size: int = option(
        0, "Instead of --global_batch_size: examples per replica per step; the global batch "
        "is this times the replica count (times --accumulation_steps) (0: use "
        "--global_batch_size).", check=NON_NEGATIVE)
    max_per_replica_batch_size: int = option(
        0, "The most examples one replica may take at once (memory): the engine picks the "
        "fewest micro-batches (--accumulation_steps) that keep each replica's share of the "
        "global batch at or below it, on whatever replica count the run starts or resumes "
        "on; a resume keeps the global batch it recorded (0: off; docs/reliability.md).",
        check=NON_NEGATIVE)
    train_steps: int = option(1000, "Global step to train to.", check=NON_NEGATIVE)
    epochs: int = option(
        0, "Instead of --train_steps: passes over the train split, each one pass with every "
        "example once, its last batch partial and trained as Keras's fit trains it (steps per "
        "epoch: its examples / the global batch, rounded up; or --steps_per_epoch, whose epochs "
        "are step counts over a stream that runs on) (0: use --train_steps).", check=NON_NEGATIVE)
    steps_per_epoch: int = option(
        0, "Steps in one epoch for --epochs, for data whose size the engine does not know "
        "(0: the train split's examples / the global batch).", check=NON_NEGATIVE)
    steps_per_loop: int = option(
        100, "Steps per compiled loop (one tf.function call, one Python round trip, one "
        "progress line); not an epoch.", check=POSITIVE)
    checkpoint_interval: int = option(
        500, "Steps between checkpoints (0: only at the end).",
        check=NON_NEGATIVE)
    local_checkpoint_dir: str = option(
        "", "A fast local folder (a RAM disk such as /dev/shm, a local SSD) for extra "
        "checkpoints every --local_checkpoint_interval steps beside the durable ones in "
        "--model_dir: a restart on this machine resumes from the newest that reads (in a "
        "multi_worker cluster: the newest step every worker holds), else from --model_dir "
        "(empty: off; docs/reliability.md).", check=optional_path)
    local_checkpoint_interval: int = option(
        0, "Steps between local checkpoints in --local_checkpoint_dir (0: off), e.g. 10 "
        "with --checkpoint_interval=100.", check=NON_NEGATIVE)
    summary_interval: int = option(
        100, "Steps between TensorBoard train summaries (0: none).", check=NON_NEGATIVE)
    mode: str = option(
        "", "train | evaluate | train_and_evaluate. "
        "Default: train_and_evaluate when the dataset has an eval split.",
        check=one_of(MODES, "mode", empty_allowed=True))
    eval_interval: int = option(
        0, "Steps between evaluations (0: only at the end).",
        check=NON_NEGATIVE)
    eval_steps: int = option(
        -1, "Eval batches per evaluation (-1: the whole eval split).",
        check=batches_or_all)

    def __post_init__(self):
        super().__post_init__()
        self._check_length()
        self._check_batch_request()
        if bool(self.local_checkpoint_dir) != bool(self.local_checkpoint_interval):
            given = (f"--local_checkpoint_dir={self.local_checkpoint_dir}"
                     if self.local_checkpoint_dir
                     else f"--local_checkpoint_interval={self.local_checkpoint_interval}")
            raise ConfigError(f"{given} needs its partner: give both --local_checkpoint_dir "
                              "(where) and --local_checkpoint_interval (every how many steps), "
                              "or neither")

    def _check_length(self) -> None:
        """How long to train: --train_steps, or --epochs (of --steps_per_epoch)."""
        if self.epochs and self.steps_per_epoch and \
                self.epochs * self.steps_per_epoch > INT32_MAX:
            raise ConfigError(f"--epochs={self.epochs} x --steps_per_epoch={self.steps_per_epoch} "
                              f"is beyond the last step a run can reach ({INT32_MAX})")
        resolved = self.steps_per_epoch and self.train_steps == self.epochs * self.steps_per_epoch
        if self.epochs and self.changed("train_steps") and not resolved:
            raise ConfigError(f"--epochs={self.epochs} and --train_steps={self.train_steps} both "
                              "say how long to train; give one")
        if self.steps_per_epoch and not self.epochs:
            raise ConfigError(f"--steps_per_epoch={self.steps_per_epoch} is the length of an "
                              "epoch for --epochs; give --epochs too, or use --train_steps")

    def _check_batch_request(self) -> None:
        """Which flags ask for the batch: one of --global_batch_size,
        --per_replica_batch_size, --max_per_replica_batch_size. What the batch
        then is, on how many replicas (the arithmetic, and its refusals), is
        decided once, in `engine.assembly.batching.decide_batch`."""
        if self.per_replica_batch_size and self.changed("global_batch_size"):
            raise ConfigError(
                f"--per_replica_batch_size={self.per_replica_batch_size} and "
                f"--global_batch_size={self.global_batch_size} both set the batch; give one")
        if self.max_per_replica_batch_size and self.per_replica_batch_size:
            raise ConfigError(
                f"--max_per_replica_batch_size={self.max_per_replica_batch_size} and "
                f"--per_replica_batch_size={self.per_replica_batch_size} both set the "
                "per-replica batch; give one (--per_replica_batch_size: exactly that many, "
                "--max_per_replica_batch_size: at most)")


@dataclasses.dataclass(frozen=True)
class Step(Settings):
    """How each step runs: what `Trainer(options=...)` takes beside its parts.

    The parts (strategy, model, collective, data, global step, objectives)
    are what a trainer trains; these are how each step treats them, under
    their flags' names, checked here once so a bad value is refused naming
    its flag before anything is built. `bin/train` fills them from its flags
    (`RunConfig.step`); tests and benchmarks build one from keywords,
    `Step(clip_norm=1.0)`.
    """

    TITLE: ClassVar[str] = "The step"

    clip_norm: float = option(
        0.0, "Clip the all-reduced gradients to this global norm, identically on every "
        "replica (0: off); the norm before clipping is the train metric grad_norm.",
        check=non_negative_number, per_range=True)
    accumulation_steps: int = option(
        1, "Micro-batches per step: each replica's share of the global batch is split in "
        "this many, their gradients summed, then one all-reduce and one update (1: off).",
        check=POSITIVE, per_range=True)
    nan_policy: str = option(
        "stop", "What a step with a non-finite loss or gradient norm does: stop (the run "
        "stops at the end of its loop with one line naming the steps, exit 1, and saves "
        "nothing, so the last checkpoint stays finite) | skip_step (skip that step's update, "
        "count it in the train metric skipped_steps, stop after --nan_max_skips in a row).",
        check=one_of(NAN_POLICIES, "policy"), per_range=True)
    nan_max_skips: int = option(
        10, "--nan_policy=skip_step: stop (as --nan_policy=stop does) after this many steps "
        "in a row had non-finite gradients.", check=POSITIVE)
    jit_compile: bool = option(
        False, "Compile each replica's forward and backward pass with XLA.")
    synthetic_on_device: bool = option(
        False, "Measure compute alone, the way tf_cnn_benchmarks does: take one batch of the "
        "training data once, keep it on the devices and train every step on it (no input "
        "pipeline runs per step; the model sees the same batch every step). For benchmarks.")

    def __post_init__(self):
        super().__post_init__()
        if self.nan_policy != "skip_step" and self.changed("nan_max_skips"):
            raise ConfigError(f"--nan_max_skips={self.nan_max_skips} applies to "
                              "--nan_policy=skip_step; drop it or add --nan_policy=skip_step")

    @property
    def skips_steps(self) -> bool:
        """Whether the engine itself skips a step with non-finite gradients."""
        return self.nan_policy == "skip_step"
