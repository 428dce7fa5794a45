"""TensorBoard scalar summaries, written lazily.

The event-file writer is created on the first write, so a run that fails
before training leaves no `summaries/` directory behind.
"""

from __future__ import annotations

from typing import Mapping, Optional

import tensorflow as tf


class SummaryWriter:
    def __init__(self, logdir: str):
        self.logdir = logdir
        self._writer: Optional[tf.summary.SummaryWriter] = None

    def tf_writer(self) -> tf.summary.SummaryWriter:
        """TensorFlow's writer, created now if not yet (`engine.observe.board` writes more kinds)."""
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.logdir)
        return self._writer

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        with self.tf_writer().as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
