"""Keras optimizers by name (`--optimizer=sgd|momentum|adam`)."""

from __future__ import annotations

import keras

from engine.errors import ConfigError

_OPTIMIZERS = {
    "sgd": lambda lr: keras.optimizers.SGD(learning_rate=lr),
    "momentum": lambda lr: keras.optimizers.SGD(learning_rate=lr, momentum=0.9),
    "adam": lambda lr: keras.optimizers.Adam(learning_rate=lr),
}


def available() -> list[str]:
    return sorted(_OPTIMIZERS)


def check(name: str) -> None:
    """Raises the one-line error for an unknown name, without building anything."""
    if name not in _OPTIMIZERS:
        raise ConfigError(
            f"--optimizer={name!r} is not an optimizer; choose one of: {', '.join(available())}"
        )


def build(name: str, learning_rate: float) -> keras.optimizers.Optimizer:
    """Builds optimizer `name`; call inside `strategy.scope()`."""
    check(name)
    return _OPTIMIZERS[name](learning_rate)
