"""SIGTERM as a request to stop at the next loop boundary, agreed by every worker.

A preempted machine gets SIGTERM and some seconds of grace. Python runs a
signal handler only between TensorFlow calls, so the handler just records the
request; the controller asks `StopRequest.agreed()` after every loop, saves a
checkpoint at that step and raises `Preempted`. In a multi-worker cluster the
workers may see their signals one loop apart, so the question is all-reduced
(one tiny collective per loop): either every worker stops at this step or none
does, and no worker is left waiting in a collective for one that left.
"""

from __future__ import annotations

import signal
from typing import Optional

import tensorflow as tf


class Preempted(Exception):
    """Training stopped on SIGTERM after saving a checkpoint at `step`."""

    def __init__(self, step: int, checkpoint: Optional[str]):
        super().__init__(f"preempted (SIGTERM) at step {step}; saved {checkpoint}; "
                         "run the same command to resume")
        self.step = step
        self.checkpoint = checkpoint


class StopRequest:
    """Records SIGTERM; `agreed()` says whether the run should stop now."""

    def __init__(self, strategy: Optional[tf.distribute.Strategy] = None):
        self._strategy = strategy
        self.requested = False
        self._previous = None

    def install(self) -> "StopRequest":
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_signal(self, signum, frame) -> None:
        self.requested = True

    def agreed(self) -> bool:
        """True when this process or, in a cluster, any worker was signalled."""
        if self._strategy is None:
            return self.requested
        flag = tf.constant(1 if self.requested else 0, tf.int32)
        values = self._strategy.experimental_distribute_values_from_function(lambda _: flag)
        return int(self._strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)) > 0
