"""The user's step code runs through autograph; the engine's own loops do not.

The engine's compiled loops (`engine.loop.trainer`, `engine.loop.evaluator`)
are written with `tf.while_loop` and `tf.cond` and traced with
`autograph=False`. Autograph's conversion of them (parse, transform, write
and load some 60 engine functions, once per process) took 3.8 s of the 8.2 s
CPU of a fresh process's first 30-step mirrored MLP run, paid again by every
`bin/train`, every cluster worker and every restart (docs/performance.md,
"Start-up"). Nothing in them needs it: their Python `if`s are on Python
values, and their two loops are written out.

What a step calls of the user's (a task's `loss`, `gradients`, `train_step`,
and through them the model) still runs converted where the engine calls it
(`engine.loop.replica_step`, the evaluator's step), exactly as
`tf.function` and `strategy.run` convert it: Python `if`, `for` and `while`
over tensors in a task work as before; Keras's and TensorFlow's own code
stays unconverted (autograph's allowlist, which `tf.function` applies too);
a function marked `tf.autograph.experimental.do_not_convert` is not
converted; conversions are cached per function, so a process converts each
once. The engine's own code on that path is marked so: the default task's
`loss`, `scaled` and `serve`, `classification_loss`, the compiled loss
(`engine.task.compiled_model`, unconverted as Keras's `fit` runs it) and the
export's serving function, which calls the task's `serve` through
`converted` (tests/engine/task/test_user_code.py).

Private API, fenced here: `tf.__internal__.autograph.tf_convert` is how
TensorFlow's own higher-order functions (`strategy.run`, `Dataset.map`)
convert a user's function, and it converts by the status it is given; the
status "enabled" (what an `autograph=True` `tf.function` sets) exists only
as `tensorflow.python.autograph.core.ag_ctx`. No public API converts a
callable by autograph's own rules: `tf.autograph.to_graph` takes functions
only and ignores the allowlist. The canary: tests/engine/task/test_user_code.py.
"""

from __future__ import annotations

from typing import Callable, Optional, TypeVar

import tensorflow as tf
from tensorflow.python.autograph.core import ag_ctx as _ag_ctx

F = TypeVar("F", bound=Callable)

#: The conversion status an `autograph=True` `tf.function` runs its function under.
_ENABLED = _ag_ctx.ControlStatusCtx(status=_ag_ctx.Status.ENABLED)


def converted(fn: Optional[F]) -> Optional[F]:
    """`fn` as an `autograph=True` `tf.function` would call it (None stays None)."""
    if fn is None:
        return None
    return tf.__internal__.autograph.tf_convert(fn, _ENABLED)
