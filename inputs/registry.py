"""Datasets by name: `--dataset=synthetic` → `load("synthetic", ...)`.

A loader is `loader(*, data_dir, seed, image_size, num_classes, eval_fraction,
augment) -> Splits` and takes what it needs: `image_size` (0: the dataset's
own) to `image_folder`, `imagenet` and `synthetic`, `num_classes` (0: its own)
to `synthetic`, `eval_fraction` to `image_folder`, `augment` (`""`: the
dataset's default) to `image_folder` (default `none`) and `imagenet`
(default `inception`). Loaders check files in plain Python and never start
TensorFlow's runtime (the multi-worker strategy must come first).
"""

from __future__ import annotations

from typing import Callable

from tfloop.inputs import augment as augmentation
from tfloop.inputs import image_folder, imagenet, mnist, synthetic, tfrecord
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import Splits

Loader = Callable[..., Splits]

_LOADERS: dict[str, Loader] = {
    "synthetic": lambda *, seed, image_size=0, num_classes=0, **_: synthetic.load(
        seed=seed, image_size=image_size, num_classes=num_classes),
    "mnist": lambda *, data_dir, **_: mnist.load(data_dir=data_dir),
    "tfrecord": lambda *, data_dir, **_: tfrecord.load(data_dir=data_dir),
    "image_folder": lambda *, data_dir, image_size, eval_fraction, augment="", **_: (
        image_folder.load(data_dir=data_dir, image_size=image_size,
                          eval_fraction=eval_fraction, augment=augment or "none")),
    "imagenet": lambda *, data_dir, image_size, augment="", **_: imagenet.load(
        data_dir=data_dir, image_size=image_size, augment_train=augment or "inception"),
}

#: The datasets `--augment` applies to (the others decode one way only).
AUGMENTED = ("image_folder", "imagenet")


def available() -> list[str]:
    return sorted(_LOADERS)


def register(name: str, loader: Loader) -> None:
    """Adds a dataset: `loader(*, data_dir, seed, image_size, num_classes, eval_fraction,
    **_) -> Splits`."""
    if name in _LOADERS:
        raise ValueError(f"dataset {name!r} is already registered")
    _LOADERS[name] = loader


def load(name: str, *, data_dir: str = "", seed: int = 0, image_size: int = 0,
         num_classes: int = 0, eval_fraction: float = 0.2, augment: str = "") -> Splits:
    if name not in _LOADERS:
        raise InputError(
            f"--dataset={name!r} is not a dataset; choose one of: {', '.join(available())}"
        )
    if num_classes and name != "synthetic":
        raise InputError(f"--num_classes={num_classes} applies to --dataset=synthetic only; "
                         f"--dataset={name} has its own labels: drop it")
    if augment:
        augmentation.check(augment)
    if augment not in ("", "none") and name not in AUGMENTED:
        raise InputError(f"--augment={augment} applies to --dataset="
                         f"{' or '.join(AUGMENTED)}; --dataset={name} has one decode: drop it")
    extra = {"augment": augment} if augment else {}
    return _LOADERS[name](data_dir=data_dir, seed=seed, image_size=image_size,
                          num_classes=num_classes, eval_fraction=eval_fraction, **extra)
