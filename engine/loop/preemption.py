"""SIGTERM and Ctrl-C as a request to stop at the next loop boundary, agreed by every worker.

A preempted machine gets SIGTERM and some seconds of grace; a user presses
Ctrl-C. Python runs a signal handler only between TensorFlow calls, so the
handler just records the request (an exception raised at an arbitrary point
could leave TensorFlow's scope stacks half entered: we saw a KeyboardInterrupt
inside `strategy.scope()` turn into "Improper nesting of variable_scope"); after
every loop the Controller's `engine.loop.actions.StopOnSignal` action asks
`StopRequest.agreed()`, saves a checkpoint at that step and raises
`Preempted`. In a multi-worker cluster the workers may see their signals one
loop apart, so the question is all-reduced (one tiny collective per loop):
either every worker stops at this step or none does, and no worker is left
waiting in a collective for one that left.
"""

from __future__ import annotations

import signal
import sys
from typing import Optional

import tensorflow as tf

from tfloop.engine.runtime import signals


_REASONS = {signal.SIGTERM: "preempted (SIGTERM)", signal.SIGINT: "interrupted (Ctrl-C)"}


class Preempted(Exception):
    """Training stopped on a signal after saving a checkpoint at `step`.

    `exit_status` is the shell's convention for that signal: 143 for SIGTERM,
    130 for Ctrl-C.
    """

    def __init__(self, step: int, checkpoint: Optional[str], signum: int = signal.SIGTERM):
        super().__init__(f"{_REASONS[signum]} at step {step}; saved {checkpoint}; "
                         "run the same command to resume")
        self.step = step
        self.checkpoint = checkpoint
        self.exit_status = 128 + int(signum)


class StopRequest:
    """Records SIGTERM or Ctrl-C; `agreed()` says whether the run should stop now.

    A second Ctrl-C raises KeyboardInterrupt at once: the user asked to stop
    without waiting for the loop to end (no checkpoint is saved then).
    """

    def __init__(self, strategy: Optional[tf.distribute.Strategy] = None):
        self._strategy = strategy
        self.requested = False
        self.signum: Optional[int] = None
        self._installed: list[signals.Installed] = []

    def install(self) -> "StopRequest":
        """Takes SIGTERM and SIGINT over (from the main thread; a run in
        another thread is not signalled) until `uninstall`."""
        self._installed = [signals.install(signum, self._on_signal) for signum in _REASONS]
        return self

    def uninstall(self) -> None:
        """Gives the handlers it replaced back (`bin/cli`'s, or Python's)."""
        for installed in reversed(self._installed):
            installed.restore()
        self._installed = []

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is None:
            self.signum = signum
            if signum == signal.SIGINT:
                print("Ctrl-C: stopping after this loop to save a checkpoint; "
                      "press Ctrl-C again to stop at once without saving",
                      file=sys.stderr, flush=True)
        self.requested = True

    def agreed(self) -> bool:
        """True when this process or, in a cluster, any worker was signalled."""
        if self._strategy is None:
            return self.requested
        # float32, not int32: it is the dtype the gradients already take through
        # every collective (NCCL included), while TensorFlow keeps int32 tensors
        # in host memory on GPUs, off the path the gradients' all-reduce takes.
        flag = tf.constant(1.0 if self.requested else 0.0, tf.float32)
        values = self._strategy.experimental_distribute_values_from_function(lambda _: flag)
        return float(self._strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)) > 0.5
