"""Speed and reproducibility: determinism, precision, the fused update, the
profiler's steps and the threads of one op.

Declared here, in the runtime's room (the process's TensorFlow set-up reads
most of them), with `engine.option.option`; `engine.config.RunConfig`
composes them into bin/train's flat flags. Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

from tfloop.engine.option import Settings, one_of, option, parse_profile_steps, step_range, threads

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


@dataclasses.dataclass(frozen=True)
class Speed(Settings):
    """Speed and reproducibility: determinism, precision, threads."""

    TITLE: ClassVar[str] = "Speed and reproducibility"

    deterministic: bool = option(
        False, "Deterministic TensorFlow ops and tf.data stages in order: reruns and resumed "
        "runs give the same weights.")
    mixed_precision: str = option(
        "float32", "float32 | mixed_float16 (with a dynamic loss scale) | mixed_bfloat16; "
        "weights stay float32. Left at float32: Keras's global dtype policy (float32 unless the "
        "script or --task module set one).", check=one_of(PRECISIONS, "policy"), per_range=True)
    fused_optimizer: bool = option(
        True, "Update with TensorFlow's fused kernels (one op per variable; Keras's formulas "
        "and slots): --nofused_optimizer for Keras's own element-wise update.")
    profile_steps: str = option(
        "", "A,B: TensorBoard profiler trace of global steps A to B into "
        "<model_dir>/summaries/train (empty: none).", check=step_range)
    intra_op_threads: int = option(
        -1, "Threads one TensorFlow op may use: -1 = cores / CPU replicas when there are "
        "several CPU replicas (else TF's default), 0 = TF's default (all cores), N = N.",
        check=threads)

    @property
    def profile_range(self) -> Optional[tuple[int, int]]:
        """`profile_steps` as `(A, B)`, or None."""
        return parse_profile_steps(self.profile_steps)
