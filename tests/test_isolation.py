"""tests/isolation.py puts back what a test changed for its worker; the
canary of its private TensorFlow import (tests/test_private_apis.py)."""

import logging

import tensorflow as tf

import isolation
from tfloop.engine.observe import step_time
from tfloop.engine.runtime import logs


def test_a_verbose_runs_logging_is_put_back():
    log = logging.getLogger("tfloop")
    before = (list(log.handlers), log.level, log.propagate)
    with isolation.restored():
        logs.configure_logging()  # what tfloop.fit(verbose=2) does
        assert log.propagate is False
    assert (list(log.handlers), log.level, log.propagate) == before


def test_op_determinism_is_switched_back_off_and_timestamps_run_again():
    """The private switch still exists and still works (the canary)."""
    assert step_time.timestamps_allowed()
    with isolation.restored():
        tf.config.experimental.enable_op_determinism()
        assert not step_time.timestamps_allowed()
    assert step_time.timestamps_allowed()
