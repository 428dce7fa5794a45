"""Datasets by name: `--dataset=synthetic` → `load("synthetic", ...)`."""

from __future__ import annotations

from typing import Callable

from engine.errors import ConfigError
from inputs import mnist, synthetic
from inputs.examples import Splits

Loader = Callable[..., Splits]

_LOADERS: dict[str, Loader] = {
    "synthetic": lambda *, data_dir, seed: synthetic.load(seed=seed),
    "mnist": lambda *, data_dir, seed: mnist.load(data_dir=data_dir),
}


def available() -> list[str]:
    return sorted(_LOADERS)


def register(name: str, loader: Loader) -> None:
    """Adds a dataset: `loader(*, data_dir, seed) -> Splits`."""
    if name in _LOADERS:
        raise ValueError(f"dataset {name!r} is already registered")
    _LOADERS[name] = loader


def load(name: str, *, data_dir: str = "", seed: int = 0) -> Splits:
    if name not in _LOADERS:
        raise ConfigError(
            f"--dataset={name!r} is not a dataset; choose one of: {', '.join(available())}"
        )
    return _LOADERS[name](data_dir=data_dir, seed=seed)
