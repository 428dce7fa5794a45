"""Progress lines on stdout, for the binaries and for scripts that use the Python API.

The library logs under the `tfloop` logger and configures nothing itself; a
script that wants what `bin/train` prints calls `configure_logging()` once.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator

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


@contextlib.contextmanager
def to_logging_only() -> Iterator[None]:
    """While it lasts, the library's lines reach only the handlers the
    program configured: `tfloop.fit(verbose=0)` prints nothing, as Keras's
    `fit(verbose=0)` prints nothing of its own.

    Two things would print them otherwise. With no handler anywhere, Python's
    `logging.lastResort` writes every warning (the engine's input-bound
    notice) to stderr; and absl's `logging.info`, which TensorFlow's
    checkpoint saver calls, runs `logging.basicConfig()` when the root logger
    has no handler, putting a stderr handler there for the rest of the
    process. A NullHandler on a root logger that has none stops both, and is
    taken away after. The stdout handler `configure_logging` put on the
    `tfloop` logger (a verbose run before this one) is set aside too; a
    handler the program added itself stays.
    """
    root, ours = logging.getLogger(), logging.getLogger("tfloop")
    added = []  # (logger, its NullHandler for the while)
    if not root.handlers:
        added.append((root, logging.NullHandler()))
    set_aside = [h for h in ours.handlers if isinstance(h, _Stdout)]
    if set_aside:  # `configure_logging` stopped propagation: no handler left is lastResort
        added.append((ours, logging.NullHandler()))
    for handler in set_aside:
        ours.removeHandler(handler)
    for logger, handler in added:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger, handler in added:
            logger.removeHandler(handler)
        for handler in set_aside:
            ours.addHandler(handler)
