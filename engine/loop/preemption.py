"""SIGTERM and Ctrl-C as a request to stop: at the next step, save, and exit within the grace period.

A preempted machine gets SIGTERM and some seconds of grace (Kubernetes: 30
unless the pod says otherwise), then SIGKILL; a user presses Ctrl-C. Python
runs a signal handler only between TensorFlow calls, so the handler just
records the request (an exception raised at an arbitrary point could leave
TensorFlow's scope stacks half entered: we saw a KeyboardInterrupt inside
`strategy.scope()` turn into "Improper nesting of variable_scope"). A
compiled loop of 100 steps is one TensorFlow call, so the handler would run
only at its end: on a model at 1 step/s, 100 s after the signal. Hence two
paths:

- one process (`stop_step`, the trainer's `request_stop`): the signal's byte
  reaches a relay thread at once (`engine.runtime.signals.on_arrival`), which
  sets a host-side flag the compiled loop's condition reads before each step
  (`engine.loop.trainer`: no device sync, the flag is in host memory). The
  loop ends after the step in flight; then the Controller's
  `engine.loop.actions.StopOnSignal` action saves a checkpoint at that step
  and raises `Preempted`. The stop costs at most one step, the save and the
  exit (docs/reliability.md, "Stopping within the grace period").
- a multi-worker cluster (`strategy`): the workers may see their signals at
  different steps, and one leaving a loop early would leave the others
  waiting in its next collective. So they stop at the loop's end: the
  question is all-reduced there (one tiny collective per loop), and either
  every worker stops at this step or none does. Keep a loop
  (`--steps_per_loop` steps) shorter than the grace period there.
"""

from __future__ import annotations

import signal
import sys
from typing import Callable, Optional

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

    Args:
      strategy: a multi-worker cluster's, whose workers agree on the stop at a
        loop's end; None for one process.
      stop_step: called the moment a signal arrives (on the signal relay's
        thread, while the loop runs): the trainer's `request_stop`, which ends
        the running loop after its current step. Only without `strategy`.

    A second Ctrl-C raises KeyboardInterrupt at once: the user asked to stop
    without waiting for the step (or loop) to end (no checkpoint is saved then).
    """

    def __init__(self, strategy: Optional[tf.distribute.Strategy] = None, *,
                 stop_step: Optional[Callable[[], None]] = None):
        if strategy is not None and stop_step is not None:
            raise ValueError("a cluster's workers stop at a loop's end, agreed: give "
                             "`strategy` or `stop_step`, not both")
        self._strategy = strategy
        self._stop_step = stop_step
        self.requested = False
        self.signum: Optional[int] = None
        self._installed: list[signals.Installed] = []
        self._arrivals: list[signals.Arrival] = []

    @property
    def stops_at_a_step(self) -> bool:
        """Whether a signal ends the running loop after its step (else: at its end)."""
        return bool(self._arrivals)

    def install(self) -> "StopRequest":
        """Takes SIGTERM and SIGINT over (from the main thread; a run in
        another thread is not signalled) until `uninstall`."""
        self._installed = [signals.install(signum, self._on_signal) for signum in _REASONS]
        if self._stop_step is not None:
            self._arrivals = [arrival for arrival in (
                signals.on_arrival(signum, self._arrived) for signum in _REASONS) if arrival]
        return self

    def uninstall(self) -> None:
        """Gives the handlers it replaced back (`bin/cli`'s, or Python's)."""
        for arrival in self._arrivals:
            arrival.cancel()
        self._arrivals = []
        for installed in reversed(self._installed):
            installed.restore()
        self._installed = []

    def _arrived(self, signum: int) -> None:
        """On the relay's thread: the loop ends after its step in flight."""
        self._stop_step()

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is None:
            self.signum = signum
            if signum == signal.SIGINT:
                print(f"Ctrl-C: stopping after this {'step' if self.stops_at_a_step else 'loop'} "
                      "to save a checkpoint; press Ctrl-C again to stop at once without saving",
                      file=sys.stderr, flush=True)
        self.requested = True
        if self._stop_step is not None:  # also here: a signal the relay could not see
            self._stop_step()

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
