"""What is trained, on what data: the task, or the built-in model and
dataset, and the data's own options.

Declared here, in the task's room, with `engine.option.option`;
`engine.config.RunConfig` composes them into bin/train's flat flags. The
fields declared `identity=True` are what run.json remembers
(`run_identity.IDENTITY`). Imports no TensorFlow at module level (this
package's `__init__` loads its modules on first use, not on import).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tfloop.engine.errors import ConfigError
from tfloop.engine.option import (MAX_CLASSES, MAX_IMAGE_SIZE, Settings, count, fraction,
                                  one_of, option, optional_path)


@dataclasses.dataclass(frozen=True)
class ModelAndData(Settings):
    """What is trained, on what data."""

    TITLE: ClassVar[str] = "Model and data"

    task: str = option(
        "", "Your own task, module:Class (a tfloop.engine.task.Task subclass, imported from the "
        "working directory or PYTHONPATH); it supplies the model, data and loss. Or "
        "module:function, a function that builds and compiles a Keras model: its loss, metrics "
        "and optimizer train it on --dataset (docs/keras.md).", identity=True)
    model: str = option(
        "mlp", "Model name: mlp | cnn | resnet_small | mobilenet_v2 | resnet50.",
        identity=True)
    dataset: str = option(
        "synthetic", "Dataset name: synthetic | mnist | tfrecord | image_folder | imagenet "
        "(the standard ImageNet TFRecords: train-*-of-*, validation-*-of-*; docs/data.md).",
        identity=True)
    data_dir: str = option(
        "", "Folder with the dataset's files (mnist: mnist.npz; tfrecord: "
        "bin/convert_to_tfrecord's output; image_folder: one sub-folder of JPEG/PNG images "
        "per class; imagenet: local, gs:// or ram://).", check=optional_path, identity=True)
    image_size: int = option(
        0, "Square image size. image_folder and imagenet: images are cropped/resized to it "
        "(0: 224). synthetic: "
        "0 is MNIST-shaped 28x28x1; N makes NxNx3 images (e.g. 224 with --num_classes=1000: "
        "ImageNet-sized, generated as uint8). Others ignore it.",
        check=count(0, MAX_IMAGE_SIZE), identity=True)
    num_classes: int = option(
        0, "synthetic: the number of classes (0: 10). Other datasets have their own labels.",
        check=count(0, MAX_CLASSES))
    eval_fraction: float = option(
        0.2, "image_folder without a validation/ folder: fraction of images kept for eval.",
        check=fraction, identity=True)
    augment: str = option(
        "", "Train-time augmentation of image_folder and imagenet: inception (the standard "
        "ImageNet recipe: a random crop of 8-100% of the area, aspect 3/4-4/3, a random "
        "flip, resized; eval on the central 224/256 crop; random per example yet exact on "
        "resume) or none (image_folder: resized whole; imagenet: central crop). Empty: the "
        "dataset's default, none for image_folder, inception for imagenet.",
        check=one_of(("none", "inception"), "known augmentation", empty_allowed=True),
        identity=True)

    def __post_init__(self):
        super().__post_init__()
        if self.num_classes and self.dataset != "synthetic":
            raise ConfigError(f"--num_classes={self.num_classes} applies to --dataset=synthetic "
                              f"only; --dataset={self.dataset} has its own labels: drop it")
