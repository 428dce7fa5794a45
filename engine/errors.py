"""The error users see: one line, no traceback.

Library code raises `ConfigError` for a mistake in what the user asked for
(unknown name, missing file, impossible device layout). The binaries print its
message on stderr and exit with status 2, as they do the other packages' own
user-error types (`collectives.CollectiveError`, ...); anything else is a bug
and keeps its traceback. Importing this module imports nothing else, so the
binaries can define their flags from `engine.config` before TensorFlow loads.
"""

class ConfigError(ValueError):
    """What the user asked for cannot be done; the message says how to fix it."""


class ClusterFailure(RuntimeError):
    """A multi-worker run lost a peer mid-training.

    Not the user's mistake, and nothing to debug in a traceback: the binaries
    print one line and exit with status 1; restarting every task resumes from
    the last checkpoint (`bin/launch --max_restarts` does it).
    """


class NonFinite(RuntimeError):
    """Training produced a non-finite loss, gradient norm or weight.

    The run stops at the end of the loop it happened in, before anything is
    saved or exported, so the newest checkpoint is still the last good one;
    the message names the steps. Like `ClusterFailure`, the binaries print it
    as one line and exit with status 1: the request was valid, the run failed.
    """
