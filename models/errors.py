"""The error users see from `models`: one line, no traceback.

`ModelError` is this package's own type, as `collectives.CollectiveError` is
that package's, so `models` needs nothing from `engine`; the binaries print
every such type as one line (exit 2).
"""


class ModelError(ValueError):
    """The model cannot be built as asked (unknown name, images too small); the
    message says how to fix it."""
