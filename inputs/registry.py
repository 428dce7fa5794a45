"""Datasets by name: `--dataset=synthetic` → `load("synthetic", ...)`.

A loader is `loader(*, data_dir, seed, image_size, eval_fraction) -> Splits`
and takes what it needs: `image_size` and `eval_fraction` matter to
`image_folder` only. Loaders check files in plain Python and never start
TensorFlow's runtime (the multi-worker strategy must come first).
"""

from __future__ import annotations

from typing import Callable

from tfloop.inputs import image_folder, mnist, synthetic, tfrecord
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import Splits

Loader = Callable[..., Splits]

_LOADERS: dict[str, Loader] = {
    "synthetic": lambda *, seed, **_: synthetic.load(seed=seed),
    "mnist": lambda *, data_dir, **_: mnist.load(data_dir=data_dir),
    "tfrecord": lambda *, data_dir, **_: tfrecord.load(data_dir=data_dir),
    "image_folder": lambda *, data_dir, image_size, eval_fraction, **_: image_folder.load(
        data_dir=data_dir, image_size=image_size, eval_fraction=eval_fraction),
}


def available() -> list[str]:
    return sorted(_LOADERS)


def register(name: str, loader: Loader) -> None:
    """Adds a dataset: `loader(*, data_dir, seed, image_size, eval_fraction, **_) -> Splits`."""
    if name in _LOADERS:
        raise ValueError(f"dataset {name!r} is already registered")
    _LOADERS[name] = loader


def load(name: str, *, data_dir: str = "", seed: int = 0, image_size: int = 224,
         eval_fraction: float = 0.2) -> Splits:
    if name not in _LOADERS:
        raise InputError(
            f"--dataset={name!r} is not a dataset; choose one of: {', '.join(available())}"
        )
    return _LOADERS[name](data_dir=data_dir, seed=seed, image_size=image_size,
                          eval_fraction=eval_fraction)
