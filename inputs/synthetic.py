"""MNIST-shaped synthetic digits, deterministic from a seed.

Each class has a prototype image, a shared grey background plus a faint
class-specific pattern; an example is its class prototype plus strong pixel
noise. The task is learnable but not instant, so the loss visibly falls over a
short run, and nothing has to be downloaded or read from disk.
"""

from __future__ import annotations

import numpy as np

from tfloop.inputs.splits import Examples, Splits

NUM_CLASSES = 10
SHAPE = (28, 28, 1)


def _make(rng: np.random.Generator, prototypes: np.ndarray, count: int) -> Examples:
    y = rng.integers(0, NUM_CLASSES, size=count)
    noise = rng.normal(0.0, 80.0, size=(count,) + SHAPE)
    x = np.clip(prototypes[y] + noise, 0, 255).astype(np.uint8)
    return Examples(x=x, y=y.astype(np.int64))


def load(*, seed: int, num_train: int = 8192, num_eval: int = 2048) -> Splits:
    rng = np.random.default_rng(seed)
    background = rng.uniform(64, 192, size=SHAPE)
    prototypes = background + rng.normal(0.0, 10.0, size=(NUM_CLASSES,) + SHAPE)
    return Splits(
        train=_make(rng, prototypes, num_train),
        eval=_make(rng, prototypes, num_eval),
        num_classes=NUM_CLASSES,
    )
