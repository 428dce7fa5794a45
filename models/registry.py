"""Model builders by name: `--model=mlp` → `build("mlp", ...)`.

Builders take the input shape and class count so the same names serve MNIST
and any other image classification input; they return Keras models whose
variable names are stable, so checkpoints of two runs compare variable by
variable.
"""

from __future__ import annotations

from typing import Callable

import keras

from tfloop.models.errors import ModelError

ModelBuilder = Callable[..., keras.Model]

_BUILDERS: dict[str, ModelBuilder] = {}
_MIN_SIZES: dict[str, int] = {}


def register(name: str, *, min_size: int = 0) -> Callable[[ModelBuilder], ModelBuilder]:
    """Class/function decorator adding a model builder under `name`.

    `min_size`: the smallest image height and width the model accepts (Keras
    applications downsample 32x), checked before anything is built.
    """

    def decorate(builder: ModelBuilder) -> ModelBuilder:
        if name in _BUILDERS:
            raise ValueError(f"model {name!r} is already registered")
        _BUILDERS[name] = builder
        _MIN_SIZES[name] = min_size
        return builder

    return decorate


def available() -> list[str]:
    return sorted(_BUILDERS)


def check(name: str, input_shape=None, *, larger: str = "") -> None:
    """Raises the one-line error for an unknown name, or for images smaller than
    the model accepts, without building anything. `larger`: how the caller's
    user asks for larger images, `{size}` standing for the size to ask for
    (default: bin/train's flags)."""
    if name not in _BUILDERS:
        raise ModelError(
            f"--model={name!r} is not a model; choose one of: {', '.join(available())}"
        )
    least = _MIN_SIZES[name]
    if input_shape is not None and len(input_shape) == 3 and min(input_shape[:2]) < least:
        height, width = input_shape[:2]
        raise ModelError(
            f"--model={name} needs images of at least {least}x{least}, and the dataset gives "
            f"{height}x{width}; " + (larger.format(size=max(least, 224)) or
                                     f"use larger images (e.g. --image_size={max(least, 224)} "
                                     "with --dataset=synthetic or image_folder)")
        )


def build(name: str, *, input_shape=(28, 28, 1), num_classes: int = 10) -> keras.Model:
    """Builds model `name`; call inside `strategy.scope()` to get mirrored variables."""
    check(name, input_shape)
    return _BUILDERS[name](input_shape=tuple(input_shape), num_classes=num_classes)


@register("mlp")
def mlp(*, input_shape, num_classes) -> keras.Model:
    """The seed's 784-256-256-10 perceptron."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(num_classes),
        ],
        name="mlp",
    )


@register("cnn")
def cnn(*, input_shape, num_classes) -> keras.Model:
    """The seed's Conv2D(32, 3) → Flatten → Dense(128) → Dense(10)."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(num_classes),
        ],
        name="cnn",
    )
