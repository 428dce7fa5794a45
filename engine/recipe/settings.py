"""The recipe's settings: what a step does with the gradients (optimizer,
schedule, weight decay, EMA, the seed and the warm start).

Declared here, beside the code that reads them (`schedules.from_recipe`,
`objectives.bind`, ...), with `engine.option.option`; `engine.config.RunConfig`
composes them into bin/train's flat flags. Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tfloop.engine.errors import ConfigError
from tfloop.engine.option import (NON_NEGATIVE, SEED_MAX, Settings, count, decay,
                                  non_negative_number, one_of, option, optional_path,
                                  parse_steps, positive_number, step_list)

LR_SCHEDULES = ("constant", "cosine", "step", "polynomial")
LR_SCALING = ("none", "linear")
#: --weight_decay_exclude's keyword: every variable of at most one dimension.
BIASES_AND_NORMS = "biases_and_norms"


@dataclasses.dataclass(frozen=True)
class Recipe(Settings):
    """What a step does with the gradients: optimizer, schedule, decay, EMA."""

    TITLE: ClassVar[str] = "The recipe"

    optimizer: str = option(
        "adam", "sgd | momentum (0.9) | adam | adamw (adam with --weight_decay, 0.004 when "
        "that is 0).", per_range=True)
    learning_rate: float = option(
        0.001, "Peak learning rate: reached after --warmup_steps, before any decay; times the "
        "replica count with --scale_learning_rate=linear.", check=positive_number,
        per_range=True)
    lr_schedule: str = option(
        "constant", "constant | cosine (decays to --end_learning_rate at the last step) | "
        "step (times --lr_decay_rate at each of --lr_decay_steps) | polynomial (to "
        "--end_learning_rate, power --lr_power); a function of the global step, after "
        "--warmup_steps.", check=one_of(LR_SCHEDULES, "schedule"), per_range=True)
    warmup_steps: int = option(
        0, "Steps of linear warmup from 0 to --learning_rate before the schedule starts.",
        check=NON_NEGATIVE, per_range=True)
    lr_decay_steps: str = option(
        "", "--lr_schedule=step: comma-separated global steps where the rate is multiplied by "
        "--lr_decay_rate, e.g. 30000,60000.", check=step_list)
    lr_decay_rate: float = option(
        0.1, "--lr_schedule=step: the factor at each decay step.",
        check=positive_number)
    lr_power: float = option(
        1.0, "--lr_schedule=polynomial: the power (1: linear decay).",
        check=positive_number)
    end_learning_rate: float = option(
        0.0, "--lr_schedule=cosine|polynomial: the rate at the last step.",
        check=non_negative_number, per_range=True)
    scale_learning_rate: str = option(
        "none", "none | linear: multiply --learning_rate (and --end_learning_rate) by the "
        "replica count (the linear scaling rule), logged at start.",
        check=one_of(LR_SCALING, "rule"))
    weight_decay: float = option(
        0.0, "Decoupled weight decay (AdamW's, for every optimizer): each step subtracts "
        "learning rate x weight_decay x weight (0: off).", check=non_negative_number,
        per_range=True)
    weight_decay_exclude: str = option(
        BIASES_AND_NORMS, "Variables weight decay leaves alone: biases_and_norms (every "
        "variable of at most one dimension: biases, normalization scales and offsets), none, "
        "or comma-separated substrings of variable paths, e.g. bias,gamma,beta.")
    ema_decay: float = option(
        0.0, "Keep an exponential moving average of the trained weights with this decay, "
        "e.g. 0.999; evaluation and export use the average (0: off).", check=decay)
    seed: int = option(
        0, "Seed for initial weights and data order; the same seed gives the same initial "
        "weights on any strategy.", check=count(0, SEED_MAX))
    init_from: str = option(
        "", "Start a new run from these model weights (fine-tuning): another run's --model_dir "
        "or ckpt-N, an export/<step> folder, a .keras or .weights.h5 file. Step 0, fresh "
        "optimizer; ignored when --model_dir already has checkpoints (it resumes).",
        check=optional_path)
    init_from_skip_mismatch: bool = option(
        False, "--init_from: load the variables that fit (same name, shape and dtype) and "
        "skip the rest (a new head: 10 classes -> 5), logging each variable loaded and "
        "skipped; without it any mismatch is refused.")

    def __post_init__(self):
        super().__post_init__()
        self._check_schedule()
        if self.init_from_skip_mismatch and not self.init_from:
            raise ConfigError("--init_from_skip_mismatch says what --init_from skips; give "
                              "--init_from too, or drop it")

    def _check_schedule(self) -> None:
        """The learning-rate schedule's flags."""
        steps = self.lr_decay_boundaries
        if self.lr_schedule == "step" and not steps:
            raise ConfigError("--lr_schedule=step needs --lr_decay_steps, the global steps where "
                              "the rate drops; e.g. --lr_decay_steps=30000,60000")
        if steps and self.lr_schedule != "step":
            raise ConfigError(f"--lr_decay_steps={self.lr_decay_steps} applies to "
                              f"--lr_schedule=step, not {self.lr_schedule}; drop it or use step")
        if self.lr_schedule in ("cosine", "polynomial") and \
                self.end_learning_rate >= self.learning_rate:
            raise ConfigError(
                f"--end_learning_rate={self.end_learning_rate} must be below "
                f"--learning_rate={self.learning_rate} for --lr_schedule={self.lr_schedule}")

    @property
    def lr_decay_boundaries(self) -> tuple[int, ...]:
        """`lr_decay_steps` as global steps."""
        return parse_steps("lr_decay_steps", self.lr_decay_steps)
