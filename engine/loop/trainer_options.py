"""How the trainer's step runs: the options `Trainer` takes beside its parts.

The parts (strategy, model, collective, data, global step, objectives) are
what a trainer trains; these are how each step treats them, checked once
here so a bad value is refused naming itself before anything is built.
`engine.strategies` fills them from the run's flags; tests and benchmarks
from keywords.
"""

from __future__ import annotations

import dataclasses

from tfloop.engine.loop import finite


@dataclasses.dataclass(frozen=True)
class TrainerOptions:
    """The step's options (`--flag` names in brackets).

    Attributes:
      jit_compile: compile each replica's forward and backward pass with XLA
        (`--jit_compile`).
      accumulation_steps: micro-batches per step, their gradients summed
        before the one all-reduce (`--accumulation_steps`).
      clip_norm: clip the reduced gradients to this global norm; 0: off (`--clip_norm`).
      nan_policy: `stop` (a loop with a non-finite loss or gradient norm
        raises `NonFinite`) or `skip_step` (such a step applies no update)
        (`--nan_policy`).
      max_skips: with `skip_step`, raise `NonFinite` after this many skipped
        steps in a row (`--nan_max_skips`).
      input_on_device: train every step on one batch taken once from the
        dataset and kept on the devices (`--synthetic_on_device`).
      stops_at_any_step: the loop's condition also reads a host-side stop
        flag (`Trainer.request_stop`: a signal's), so a loop can end after any
        step; False in a multi-worker cluster, whose workers must all run the
        same steps (they stop at a loop's end, agreed: `engine.loop.preemption`).
    """

    jit_compile: bool = False
    accumulation_steps: int = 1
    clip_norm: float = 0.0
    nan_policy: str = finite.STOP
    max_skips: int = 10
    input_on_device: bool = False
    stops_at_any_step: bool = True

    def __post_init__(self):
        if not isinstance(self.accumulation_steps, int) or self.accumulation_steps < 1:
            raise ValueError(f"`accumulation_steps` ({self.accumulation_steps!r}) must be a "
                             "positive integer")
        if self.clip_norm < 0:
            raise ValueError(f"`clip_norm` ({self.clip_norm!r}) must be >= 0 (0: off)")
        if self.nan_policy not in (finite.STOP, finite.SKIP_STEP):
            raise ValueError(f"`nan_policy` ({self.nan_policy!r}) must be {finite.STOP!r} or "
                             f"{finite.SKIP_STEP!r}")
        if not isinstance(self.max_skips, int) or self.max_skips < 1:
            raise ValueError(f"`max_skips` ({self.max_skips!r}) must be a positive integer")

    @property
    def skips_steps(self) -> bool:
        """Whether the engine itself skips a step with non-finite gradients."""
        return self.nan_policy == finite.SKIP_STEP
