"""engine.runtime.logs: the progress lines go to the `sys.stdout` of the moment
a line is logged, so a stream closed since set-up (a test's capture) never
turns a line into a "Logging error" dump on stderr."""

import io
import logging
import sys

from tfloop.engine.runtime import logs


def test_lines_go_to_the_stdout_of_the_moment(monkeypatch):
    log = logging.getLogger("tfloop")
    saved = (list(log.handlers), log.level, log.propagate)
    try:
        first = io.StringIO()
        monkeypatch.setattr(sys, "stdout", first)
        logs.configure_logging()
        first.close()  # what a finished test's captured stream is
        later = io.StringIO()
        monkeypatch.setattr(sys, "stdout", later)
        logging.getLogger("tfloop.engine.test").info("a progress line")
        assert later.getvalue().endswith("  a progress line\n")
    finally:
        log.handlers[:], log.level, log.propagate = saved[0], saved[1], saved[2]
