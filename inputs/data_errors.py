"""Errors that show only when a pipeline runs, turned into one line naming the file.

Most damage is refused before training by the loaders' cheap checks (see
`tfrecord.load`, `records.RecordData`, `mnist.load`, `arrays.ArrayData`);
what they cannot see without reading everything surfaces mid-run as a
TensorFlow error that does not say which file: "corrupted record at 60102",
"jpeg::Uncompress failed". Two ways lead from such an error to the file:

- a check inside the pipeline that knows the file (`check`): the record
  parsers carry each record's file and index, so a label outside
  `[0, num_classes)` or an image of the wrong size fails with a message
  that names them, between `<<tfloop: ` and `>>`;
- an explainer a pipeline registered when it was built (`watch`), asked
  after the failure: it reads the files it knows to find the damaged one
  (TFRecord framing at the offset TensorFlow names, or every image decoded
  once). This costs time only on a run that has already failed.

`naming()` wraps the engine's training and evaluation: such an error leaves
it as an `InputError` (one line, exit 2); any other error passes unchanged.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
from typing import Callable, Hashable, Iterator, Optional

import tensorflow as tf

from tfloop.inputs import framing
from tfloop.inputs.errors import InputError

logger = logging.getLogger(__name__)

Explainer = Callable[[tf.errors.OpError], Optional[str]]

_MARK = re.compile(r"<<tfloop: (.*?)>>", re.S)
_WATCHED: "collections.OrderedDict[Hashable, Explainer]" = collections.OrderedDict()
_MAX_WATCHED = 16


def check(ok: tf.Tensor, message: Callable[[], tf.Tensor]) -> tf.Tensor:
    """In a pipeline function: `ok` passed through, or an error whose text is
    `message()` (a string tensor, built only when `ok` is False)."""
    def fail():
        text = tf.strings.join(["<<tfloop: ", message(), ">>"])
        with tf.control_dependencies([tf.debugging.Assert(False, [text])]):
            return tf.identity(ok)
    return tf.cond(ok, lambda: ok, fail)


def watch(key: Hashable, explainer: Explainer) -> None:
    """Registers `explainer` for the data `key` names (its files): asked,
    newest first, when a run stops on a TensorFlow error."""
    _WATCHED.pop(key, None)
    _WATCHED[key] = explainer
    while len(_WATCHED) > _MAX_WATCHED:
        _WATCHED.popitem(last=False)


def explain(error: tf.errors.OpError) -> Optional[InputError]:
    """The one-line InputError `error` stands for, or None if no data explains it."""
    message = error.message or ""
    marked = _MARK.search(message)
    if marked:
        return InputError(" ".join(marked.group(1).split()))
    for explainer in reversed(list(_WATCHED.values())):
        try:
            found = explainer(error)
        except Exception:  # a failed explanation must not hide the original error
            logger.debug("an explainer failed", exc_info=True)
            continue
        if found:
            return InputError(" ".join(found.split()))
    return None


@contextlib.contextmanager
def naming() -> Iterator[None]:
    """Re-raises a pipeline's TensorFlow error as the InputError naming its file."""
    try:
        yield
    except tf.errors.OpError as error:
        named = explain(error)
        if named is None:
            raise
        raise named from None


_RECORD_DAMAGE = re.compile(r"(corrupted|truncated) record at (\d+)")


def _records_explainer(files, compression: str = "") -> Explainer:
    """Names the TFRecord file behind "corrupted/truncated record at N"."""
    def explainer(error):
        found = _RECORD_DAMAGE.search(error.message or "")
        if not found:
            return None
        offset = int(found.group(2))
        for path in files:
            damage = framing.damage_at(path, offset, compression)
            if damage:
                return (f"{path} is damaged: {damage}; re-create or remove the file "
                        f"(TensorFlow: {found.group(0)})")
        return None
    return explainer


def watch_records(files, compression: str = "") -> None:
    """`watch` for TFRecord `files`: a damaged frame found mid-run is traced to its file."""
    files = tuple(files)
    watch(files, _records_explainer(files, compression))
