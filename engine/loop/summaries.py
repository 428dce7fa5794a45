"""TensorBoard scalar summaries, written lazily.

The event-file writer is created on the first write, so a run that fails
before training leaves no `summaries/` directory behind.

Every write to storage here (the writer's creation, each flush) that fails
(a full disk, a folder made read-only) is a `RunFailure`: one line naming
the folder, the reason and the free space there, exit status 1, as a failed
checkpoint save is (`storing`; `engine.observe.board` writes its events
through it too). Before, a full disk at the first summary or at the chief's
straggler table was a traceback ending "a bug".
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping, Optional

import tensorflow as tf

from tfloop.engine.errors import RunFailure, one_line
from tfloop.engine.runtime import disk


class SummaryWriter:
    def __init__(self, logdir: str):
        self.logdir = logdir
        self._writer: Optional[tf.summary.SummaryWriter] = None

    def tf_writer(self) -> tf.summary.SummaryWriter:
        """TensorFlow's writer, created now if not yet (`engine.observe.board` writes more kinds)."""
        if self._writer is None:
            with self.storing():
                self._writer = tf.summary.create_file_writer(self.logdir)
        return self._writer

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        with self.storing():
            with self.tf_writer().as_default(step=step):
                for name, value in scalars.items():
                    tf.summary.scalar(name, value)
            self._writer.flush()

    @contextlib.contextmanager
    def storing(self) -> Iterator[None]:
        """A write to `logdir` inside the block that fails is a `RunFailure`
        (see the module docstring)."""
        try:
            yield
        except (tf.errors.OpError, OSError) as error:
            raise RunFailure(write_failed(self.logdir, error)) from None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def write_failed(logdir: str, error: Exception) -> str:
    """The one line of a failed summary write: where, why, the free space, what to do."""
    if isinstance(error, tf.errors.OpError):
        reason = error.message
    else:
        reason = getattr(error, "strerror", None) or str(error)
    reason = one_line((reason or type(error).__name__).replace(logdir.rstrip("/") + "/", ""),
                      100)
    return (f"could not write the TensorBoard summaries in {logdir} ({reason}); "
            f"{disk.free_there(_nearest_folder(logdir))}: {disk.advice(error, logdir, reason)} "
            "and run the same command (it resumes from the last checkpoint)")


def _nearest_folder(path: str) -> str:
    """`path`, or the nearest folder above it that exists (the summaries'
    folder may not be there yet when its creation failed); a URL as it is."""
    if "://" in path:
        return path
    path = os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path
