"""What an in-process test changes for the rest of its worker, put back after it.

Two settings of a process outlive the test that changed them, and a later
test on the same pytest worker then fails for a reason of its own: which
tests share a worker, and in which order, is pytest-xdist's choice
(`--dist loadgroup` changed it, and both showed):

- **The `tfloop` logger.** A verbose run (`tfloop.run(verbose=True)`,
  `tfloop.fit(verbose=2)`) calls `engine.runtime.logs.configure_logging()`,
  which gives the logger a stdout handler and stops its propagation, as a
  script wants: every later `caplog` test on that worker then saw nothing.
- **Op determinism.** `--deterministic` in process enables it for the
  process (`tf.config.experimental.enable_op_determinism()`, which has no
  public way back): later, `tf.timestamp` is refused (no sampled loop, no
  step-time breakdown) and Keras's `compile(jit_compile=True)` quietly drops
  XLA (`keras.src.trainers.trainer.model_supports_jit`). TensorFlow's own
  switch back is private (`tensorflow.python.framework.config`): this module
  is the one place the suite uses it, and `tests/test_isolation.py` fails
  loudly if it moves.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from tensorflow.python.framework import config as tf_framework_config

#: The loggers whose handlers, level and propagation a test may change.
LOGGERS = ("tfloop", "tensorflow")


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """Around one test: the loggers and op determinism as they were."""
    saved = {name: _logger_state(logging.getLogger(name)) for name in LOGGERS}
    deterministic = tf_framework_config.is_op_determinism_enabled()
    try:
        yield
    finally:
        for name, (handlers, level, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate
        if tf_framework_config.is_op_determinism_enabled() and not deterministic:
            tf_framework_config.disable_op_determinism()


def _logger_state(logger: logging.Logger) -> tuple[list, int, bool]:
    return list(logger.handlers), logger.level, logger.propagate
