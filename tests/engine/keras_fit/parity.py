"""The parity harness: the same model, data, seed and callbacks through Keras's
`model.fit` under `tf.distribute.MirroredStrategy` and through `tfloop.fit` on
the same logical CPU devices, compared per epoch (History) and on the final
weights.

    keras_side, ours = parity.compare(build, data, replicas=2, model_dir=tmp_path,
                                      epochs=2, validation_data=val)

`build` is a function of no arguments that builds and compiles the model (the
tutorials' `build_and_compile_model`): Keras's side calls it under its
strategy's scope, tfloop's side hands it to `fit`, which calls it under the
engine's. Both sides seed Keras alike (`keras.utils.set_random_seed(seed)`
before the model is built: the engine does it with `RunConfig.seed`), so
they start from the same weights. `callbacks` is a function returning fresh
callbacks for each side. Every other keyword is `fit`'s own (`epochs`,
`validation_data`, `class_weight`, `batch_size` ...), given alike to both.

Both sides compute with the suite's threads (tests/conftest.py: one intra-op
thread per op, four logical CPUs per process), so a difference is the
engine's, not the kernels'. One `MirroredStrategy` per replica count is made
per process and reused (`keras_strategy`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import keras
import numpy as np
import tensorflow as tf

from tfloop.engine import RunConfig, fit

#: Relative agreement the matrix asks of weights and logs.
RTOL = 1e-6
#: Absolute floor for values near zero (a bias that stays ~0, a loss near 0).
ATOL = 1e-7
#: Logs the engine adds that Keras's History has not: none (issue 31 item 10:
#: no grad_norm), so every name must be the same on both sides.
ENGINE_ONLY_LOGS = ()


@dataclasses.dataclass
class Side:
    """One side's run: `history` (name -> one value per epoch), `epoch`, the
    final `weights` (every variable of the model, trainable or not), the
    model, and the `fit`'s return value."""

    history: dict
    epoch: list
    weights: list
    model: Any
    returned: Any


def data(n: int, seed: int = 0, features: int = 6) -> tuple:
    """`n` examples of `features` uniform features, labelled by whether they sum past half."""
    rng = np.random.RandomState(seed)
    x = rng.rand(n, features).astype("float32")
    return x, (x.sum(1) > features / 2).astype("int64")


def dataset(n: int, batch: int, seed: int = 0) -> tf.data.Dataset:
    """`data(n, seed)` in batches of `batch` (the last one partial)."""
    return tf.data.Dataset.from_tensor_slices(data(n, seed)).batch(batch)


def devices(replicas: int) -> list[str]:
    """The logical CPUs of `replicas` replicas, as both sides name them."""
    return [f"/cpu:{i}" for i in range(replicas)]


@functools.lru_cache(maxsize=None)
def keras_strategy(replicas: int) -> tf.distribute.MirroredStrategy:
    """One MirroredStrategy per replica count and process (the CPUs'
    default cross-device reduction, as the engine's `reduce_to_one_device`)."""
    return tf.distribute.MirroredStrategy(
        devices(replicas), cross_device_ops=tf.distribute.ReductionToOneDevice())


def run_keras(build: Callable[[], keras.Model], x: Any = None, *, replicas: int = 2,
              seed: int = 3, callbacks: Optional[Callable[[], list]] = None,
              model: Optional[keras.Model] = None, **fit_kwargs) -> Side:
    """Keras's own `model.fit(x, **fit_kwargs)` under MirroredStrategy.
    `model`: a model from an earlier call (a second `fit`), else `build()` is
    called, seeded, under the strategy's scope."""
    strategy = keras_strategy(replicas)
    if model is None:
        with strategy.scope():
            keras.utils.set_random_seed(seed)
            model = build()
    fit_kwargs.setdefault("verbose", 0)
    with strategy.scope():
        history = model.fit(x, callbacks=callbacks() if callbacks else None, **fit_kwargs)
    return Side(dict(history.history), list(history.epoch), _weights(model), model, history)


def config(model_dir: Any, *, replicas: int = 2, seed: int = 3, **overrides) -> RunConfig:
    """tfloop's side: mirrored on the same logical CPUs, one step per loop
    (Keras's `steps_per_execution=1`: a callback sees every batch)."""
    return RunConfig(strategy="mirrored", devices=",".join(d[1:] for d in devices(replicas)),
                     collective="reduce_to_one_device", model_dir=str(model_dir), seed=seed,
                     steps_per_loop=1, **overrides)


def run_tfloop(build: Callable[[], keras.Model], x: Any = None, *, model_dir: Any,
               replicas: int = 2, seed: int = 3, callbacks: Optional[Callable[[], list]] = None,
               config_overrides: Optional[dict] = None, **fit_kwargs) -> Side:
    """`tfloop.fit(build, x, **fit_kwargs)` on the same devices."""
    fit_kwargs.setdefault("verbose", False)
    history = fit(build, x, callbacks=callbacks() if callbacks else (),
                  config=config(model_dir, replicas=replicas, seed=seed,
                                **(config_overrides or {})), **fit_kwargs)
    return Side(dict(history.history), list(history.epoch), _weights(history.model),
                history.model, history)


def compare(build: Callable[[], keras.Model], x: Any = None, *, model_dir: Any,
            replicas: int = 2, seed: int = 3, callbacks: Optional[Callable[[], list]] = None,
            rtol: float = RTOL, atol: float = ATOL, config_overrides: Optional[dict] = None,
            **fit_kwargs) -> tuple[Side, Side]:
    """Runs both sides and asserts they agree: the same epochs, the same log
    names, each log within `rtol` per epoch, every weight within `rtol`.
    Returns (keras's side, tfloop's side) for a case's own assertions."""
    theirs = run_keras(build, x, replicas=replicas, seed=seed, callbacks=callbacks,
                       **fit_kwargs)
    ours = run_tfloop(build, x, model_dir=model_dir, replicas=replicas, seed=seed,
                      callbacks=callbacks, config_overrides=config_overrides, **fit_kwargs)
    assert_same(theirs, ours, rtol=rtol, atol=atol)
    return theirs, ours


def assert_same(theirs: Side, ours: Side, *, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Keras's side and tfloop's agree on epochs, logs and weights."""
    assert ours.epoch == theirs.epoch, (ours.epoch, theirs.epoch)
    logs = set(ours.history) - set(ENGINE_ONLY_LOGS)
    assert logs == set(theirs.history), (sorted(logs), sorted(theirs.history))
    for name, values in theirs.history.items():
        np.testing.assert_allclose(ours.history[name], values, rtol=rtol, atol=atol,
                                   err_msg=f"log {name!r} per epoch (tfloop vs Keras)")
    assert len(ours.weights) == len(theirs.weights)
    for (name, a), (_, b) in zip(ours.weights, theirs.weights):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol,
                                   err_msg=f"weight {name} (tfloop vs Keras)")


def _weights(model: keras.Model) -> list:
    """(path, value) of every variable, trainable or not (BN's moving stats)."""
    return [(getattr(v, "path", v.name), np.asarray(v.numpy())) for v in model.weights]
