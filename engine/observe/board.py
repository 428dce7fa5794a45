"""TensorBoard as users expect it: each step once after a resume, the run's
flags and final metrics in the HParams dashboard, the train loop's graph.

- **Each step once.** A run killed after step 130 with its last checkpoint at
  100 resumes at 100 and writes steps 101..130 again, into a new event file
  beside the old one. TensorBoard drops the orphans when told where the run
  restarted: an event `session_log { status: START }` at step s makes its
  reader (`plugin_event_accumulator`, what the server uses) purge every
  earlier event of that run directory with a step >= s, except for the
  first START of a run directory, which only marks the start. So every
  writer of the run writes START at `start_step + 1` first thing
  (`mark_start`): a fresh run's is the first (ignored), a resumed run's purges
  what came after its checkpoint; the summaries and the evaluation of the
  checkpoint's own step stay.
- **HParams.** The run's flags (`RunConfig`) through the HParams plugin in
  `summaries/` (the root: the `train` and `eval` runs are its metrics'
  groups), and at the end the final train and eval metrics as scalars
  `final/train/<name>`, `final/eval/<name>` beside them.
- **Graph.** The compiled train loop's graph (its while loop holding the step),
  traced once around the first loop (`TrainGraph`), into `summaries/train`.

A write that fails (a full disk at start-up, a folder made read-only) is one
`RunFailure` line naming the folder and its free space (`SummaryWriter.storing`);
only the graph, a view, is a warning.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping, Optional

import tensorflow as tf
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.hparams import api as hparams_api

from tfloop.engine.errors import one_line
from tfloop.engine.loop.actions import Action, LoopEnd
from tfloop.engine.loop.summaries import SummaryWriter

logger = logging.getLogger(__name__)


def mark_start(writer: SummaryWriter, start_step: int) -> None:
    """Writes `SessionLog(START)` at `start_step + 1` (see the module docstring).

    TF2's summary API writes `Summary` protos only; TensorFlow's own
    `ImportEvent` op writes a whole `Event` into the same writer (its
    `_resource` is the writer's handle: no public accessor exists).
    """
    event = event_pb2.Event(step=start_step + 1, wall_time=time.time())
    event.session_log.status = event_pb2.SessionLog.START
    with writer.storing():  # a full disk at start-up: one RunFailure line
        tf.raw_ops.ImportEvent(writer=writer.tf_writer()._resource,
                               event=event.SerializeToString())
        writer.tf_writer().flush()


def _hparam_value(value: Any):
    """HParams take bool, int, float and str; anything else as its text."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def write_hparams(writer: SummaryWriter, hparams: Mapping[str, Any], *, step: int) -> None:
    """The run's flags, once, at the step it starts from."""
    with writer.storing():
        with writer.tf_writer().as_default(step=step):
            hparams_api.hparams({name: _hparam_value(value) for name, value in hparams.items()},
                                trial_id=None)
        writer.tf_writer().flush()


def write_final_metrics(writer: SummaryWriter, step: int,
                        metrics: Mapping[str, Mapping[str, float]]) -> None:
    """`final/train/loss`, `final/eval/accuracy`, ...: the HParams table's columns."""
    scalars = {f"final/{kind}/{name}": value for kind, values in metrics.items()
               for name, value in values.items() if name != "examples"}
    if scalars:
        writer.write(step, scalars)


class TrainGraph(Action):
    """Traces the first train loop's graph (`tf.summary.trace_on(graph=True)`)
    and writes it to `writer` once: TensorBoard's Graphs tab."""

    def __init__(self, writer: SummaryWriter):
        self.writer = writer
        self.tracing = False
        self.done = False

    def loop_begin(self, step: int) -> None:
        if not self.done and not self.tracing:
            tf.summary.trace_on(graph=True, profiler=False)
            self.tracing = True

    def __call__(self, loop: LoopEnd) -> None:
        if self.tracing:
            self.tracing, self.done = False, True
            try:
                with self.writer.tf_writer().as_default(step=loop.step):
                    tf.summary.trace_export("train_loop", step=loop.step)
                self.writer.tf_writer().flush()
            except tf.errors.OpError as error:  # the graph is a view; the run goes on
                tf.summary.trace_off()
                logger.warning("TensorBoard: the train loop's graph was not written (%s)",
                               one_line(str(error)))

    def close(self) -> None:
        if self.tracing:
            tf.summary.trace_off()
            self.tracing = False
