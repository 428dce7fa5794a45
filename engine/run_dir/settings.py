"""What a run keeps and when it stops: the best checkpoint, early stopping,
the export and how many checkpoints stay.

Declared here, in the run directory's room (every file under model_dir),
with `engine.option.option`; `engine.config.RunConfig` composes them into
bin/train's flat flags. Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tfloop.engine.errors import ConfigError
from tfloop.engine.option import NON_NEGATIVE, POSITIVE, Settings, eval_metric, one_of, option

BEST_MODES = ("auto", "max", "min")


@dataclasses.dataclass(frozen=True)
class Keeping(Settings):
    """What a run keeps and when it stops: best, early stopping, export."""

    TITLE: ClassVar[str] = "Keeping and stopping"

    best_metric: str = option(
        "", "Keep the checkpoint (and export) of the best evaluation by this metric in "
        "model_dir/best/, apart from the rolling ones, e.g. eval/accuracy (empty: off).",
        check=eval_metric)
    best_mode: str = option(
        "auto", "max | min | auto (max for accuracy-like names, else min): which way "
        "--best_metric improves.", check=one_of(BEST_MODES, "mode"))
    early_stopping_patience: int = option(
        0, "Stop after this many evaluations in a row without a better --best_metric "
        "(0: never).", check=NON_NEGATIVE)
    export: bool = option(
        True, "Write model_dir/export/<step>/ (a SavedModel with a serving_default signature, "
        "and model.keras for a Keras model) when training finishes.")
    max_checkpoints: int = option(
        5, "How many ckpt-<step> checkpoints to keep.",
        check=POSITIVE)

    def __post_init__(self):
        super().__post_init__()
        if self.early_stopping_patience and not self.best_metric:
            raise ConfigError(
                f"--early_stopping_patience={self.early_stopping_patience} needs --best_metric, "
                "the metric that must improve; e.g. --best_metric=eval/accuracy")
