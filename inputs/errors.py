"""The error users see from `inputs`: one line, no traceback.

Loaders and pipelines raise `InputError` for a mistake in what the user asked
for (an unknown dataset, a missing or malformed file, a sharding TensorFlow
would fail on at the first step). It is this package's own type, as
`collectives.CollectiveError` is that package's, so `inputs` needs nothing
from `engine`; the binaries print every such type as one line (exit 2).
"""


class InputError(ValueError):
    """The dataset cannot be loaded or batched as asked; the message says how to fix it."""
