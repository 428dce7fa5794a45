"""Synthetic images, deterministic from a seed: MNIST-shaped by default, any size on request.

Default (`image_size=0`): 28x28x1 digits of 10 classes. Each class has a
prototype image, a shared grey background plus a faint class-specific
pattern; an example is its class prototype plus strong pixel noise. The task
is learnable but not instant, so the loss visibly falls over a short run, and
nothing has to be downloaded or read from disk.

`image_size=N` (`--image_size=224 --num_classes=1000`: ImageNet-sized):
NxNx3 images of `num_classes` classes, for benchmarks of the models every
GPU benchmark uses (`--model=resnet50`, `mobilenet_v2`). They are made as
uint8 (the pipeline hands the device uint8 and the step casts it there: a
quarter of the bytes of float32 per step), from uniform noise plus a
per-class colour offset, cheaply (no per-class prototype images: 1000 of
them at 224x224 would be 150 MB), and as many as fit in `BUDGET_BYTES`
(1783 at 224x224, so a global batch up to that): the pipeline repeats and
reshuffles them, which is all a benchmark needs. `--synthetic_on_device` goes further and keeps one batch on
the devices (`engine.loop.trainer`).
"""

from __future__ import annotations

import functools

import numpy as np

from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import Examples, Splits

NUM_CLASSES = 10
SHAPE = (28, 28, 1)
#: Memory for the train split of sized images (the eval split gets a quarter).
BUDGET_BYTES = 256 << 20
#: Splits up to this size are kept (`load`); larger ones are made on every call.
KEPT_BYTES = 32 << 20


def _make(rng: np.random.Generator, prototypes: np.ndarray, count: int) -> Examples:
    y = rng.integers(0, NUM_CLASSES, size=count)
    noise = rng.normal(0.0, 80.0, size=(count,) + SHAPE)
    x = np.clip(prototypes[y] + noise, 0, 255).astype(np.uint8)
    return Examples(x=x, y=y.astype(np.int64))


def _make_sized(rng: np.random.Generator, offsets: np.ndarray, size: int,
                count: int) -> Examples:
    """`count` images of `size` x `size` (the channels of `offsets`): noise
    plus the class's offset, at most 127 + 127 (no overflow)."""
    y = rng.integers(0, len(offsets), size=count)
    x = rng.integers(0, 128, size=(count, size, size, offsets.shape[-1]), dtype=np.uint8)
    x += offsets[y]
    return Examples(x=x, y=y.astype(np.int64))


def load(*, seed: int, num_train: int = 8192, num_eval: int = 2048, image_size: int = 0,
         num_classes: int = 0) -> Splits:
    """The splits; `image_size` 0 and `num_classes` 0 give the MNIST-shaped default.

    A process that runs several times (a notebook, a test suite, a benchmark's
    variants) makes the same splits once: up to `KEPT_BYTES` they are kept
    (the default's 10,240 images took 0.2-0.3 s of CPU per run), their arrays
    read-only so that no caller can change another's data."""
    if image_size < 0 or num_classes < 0:
        raise InputError(f"synthetic data needs --image_size >= 0 and --num_classes >= 0, got "
                         f"{image_size} and {num_classes}")
    side, channels = (image_size, 3) if image_size else (SHAPE[0], SHAPE[2])
    if (num_train + num_eval) * side * side * channels <= KEPT_BYTES:
        return _kept(seed, num_train, num_eval, image_size, num_classes)
    return _made(seed, num_train, num_eval, image_size, num_classes)


@functools.lru_cache(maxsize=8)
def _kept(*args) -> Splits:
    splits = _made(*args)
    for examples in (splits.train, splits.eval):
        examples.x.setflags(write=False)
        examples.y.setflags(write=False)
    return splits


def _made(seed: int, num_train: int, num_eval: int, image_size: int,
          num_classes: int) -> Splits:
    rng = np.random.default_rng(seed)
    if not image_size:
        classes = num_classes or NUM_CLASSES
        if classes != NUM_CLASSES:
            return _sized(rng, SHAPE[0], classes, num_train, num_eval, channels=SHAPE[2])
        background = rng.uniform(64, 192, size=SHAPE)
        prototypes = background + rng.normal(0.0, 10.0, size=(NUM_CLASSES,) + SHAPE)
        return Splits(
            train=_make(rng, prototypes, num_train),
            eval=_make(rng, prototypes, num_eval),
            num_classes=NUM_CLASSES,
        )
    return _sized(rng, image_size, num_classes or NUM_CLASSES, num_train, num_eval)


def _sized(rng: np.random.Generator, size: int, classes: int, num_train: int, num_eval: int,
           channels: int = 3) -> Splits:
    per_example = size * size * channels
    train = max(8, min(num_train, BUDGET_BYTES // per_example))
    evaluate = max(8, min(num_eval, train // 4))
    offsets = rng.integers(0, 128, size=(classes, 1, 1, channels), dtype=np.uint8)
    return Splits(train=_make_sized(rng, offsets, size, train),
                  eval=_make_sized(rng, offsets, size, evaluate), num_classes=classes)
