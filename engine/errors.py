"""The errors users see: one line, no traceback.

The engine raises `ConfigError` for a mistake in what the user asked for
(unknown strategy, impossible device layout, unwritable `model_dir`); each
library package raises its own type (`collectives.CollectiveError`,
`inputs.InputError`, `models.ModelError`), so none of them imports the
engine. The binaries print any of `USER_ERRORS` on stderr as one line and exit
with status 2; anything else is a bug and keeps its traceback.
"""

from collectives.interface import CollectiveError
from inputs.errors import InputError
from models.errors import ModelError


class ConfigError(ValueError):
    """What the user asked for cannot be done; the message says how to fix it."""


class ClusterFailure(RuntimeError):
    """A multi-worker run lost a peer mid-training.

    Not the user's mistake, and nothing to debug in a traceback: the binaries
    print one line and exit with status 1; restarting every task resumes from
    the last checkpoint (`bin/launch --max_restarts` does it).
    """


#: Exceptions the binaries report as one line instead of a traceback.
USER_ERRORS = (ConfigError, CollectiveError, InputError, ModelError)
