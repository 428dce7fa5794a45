"""Progress lines on stdout, for the binaries and for scripts that use the Python API.

The library logs under the `tfloop` logger and configures nothing itself; a
script that wants what `bin/train` prints calls `configure_logging()` once.
"""

from __future__ import annotations

import logging
import sys

from absl import logging as absl_logging


class _Stdout(logging.StreamHandler):
    """Writes to whatever `sys.stdout` is when a line is logged, not the one
    it was when logging was set up: a caller that redirects stdout later (a
    test's captured stream, since closed; a notebook) still gets the lines,
    and a closed stream never turns a log line into a "Logging error" dump."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it; sys.stdout is read instead
        pass


def configure_logging(level: int = logging.INFO) -> None:
    """`HH:MM:SS  message` lines on stdout from every tfloop module, and
    TensorFlow's own Python chatter (absl turns on INFO) down to warnings."""
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    handler = _Stdout()
    handler.setFormatter(logging.Formatter("%(asctime)s  %(message)s", datefmt="%H:%M:%S"))
    log = logging.getLogger("tfloop")
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
