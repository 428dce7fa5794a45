"""Image classifiers from the seeds: MobileNetV2, ResNet50, and a small ResNet.

The two Keras applications are built with `weights=None` (nothing is ever
downloaded), the dataset's input shape and class count, and logits out
(`classifier_activation=None`: the engine's loss takes logits). Both need
images of at least 32x32, which `models.check` enforces before anything is
built.

Inputs arrive as floats in [0, 1]. MobileNetV2 gets the `Rescaling` to
[-1, 1] that its `preprocess_input` does in the transfer-learning tutorial;
ResNet50 and `resnet_small` start with batch normalization-friendly [0, 1].

Variable names are the layers' own fixed names (`Conv1/kernel`,
`stage1_block_conv1/kernel`, ...), not Keras' per-process counters, so the
checkpoints of two runs compare variable by variable.
"""

from __future__ import annotations

import keras

from tfloop.models.registry import register

APPLICATIONS_MIN_SIZE = 32


@register("mobilenet_v2", min_size=APPLICATIONS_MIN_SIZE)
def mobilenet_v2(*, input_shape, num_classes) -> keras.Model:
    """`keras.applications.MobileNetV2`, width 1.0, trained from scratch."""
    base = keras.applications.MobileNetV2(
        input_shape=input_shape, weights=None, classes=num_classes, classifier_activation=None)
    inputs = keras.Input(input_shape, name="images")
    scaled = keras.layers.Rescaling(2.0, offset=-1.0, name="to_unit_range")(inputs)
    return keras.Model(inputs, base(scaled), name="mobilenet_v2")


@register("resnet50", min_size=APPLICATIONS_MIN_SIZE)
def resnet50(*, input_shape, num_classes) -> keras.Model:
    """`keras.applications.ResNet50` (25.6M parameters at 1000 classes)."""
    return keras.applications.ResNet50(
        input_shape=input_shape, weights=None, classes=num_classes, classifier_activation=None)


def _batch_norm(name: str):
    """Momentum 0.9, not Keras' 0.99: the moving statistics settle in tens of
    steps, so the short runs this model exists for evaluate sensibly."""
    return keras.layers.BatchNormalization(momentum=0.9, name=name)


def _residual_block(x, filters: int, stride: int, name: str):
    """Two 3x3 convolutions with batch norm, plus the (projected) input."""
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(filters, 1, strides=stride, use_bias=False,
                                       name=f"{name}_project")(x)
        shortcut = _batch_norm(name=f"{name}_project_bn")(shortcut)
    y = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                            name=f"{name}_conv1")(x)
    y = _batch_norm(name=f"{name}_bn1")(y)
    y = keras.layers.ReLU(name=f"{name}_relu1")(y)
    y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv2")(y)
    y = _batch_norm(name=f"{name}_bn2")(y)
    y = keras.layers.Add(name=f"{name}_add")([shortcut, y])
    return keras.layers.ReLU(name=f"{name}_out")(y)


@register("resnet_small", min_size=4)
def resnet_small(*, input_shape, num_classes) -> keras.Model:
    """A CIFAR-style ResNet: a 3x3 stem and three residual blocks of 16, 32
    and 64 filters (the last two halve the resolution), global average
    pooling, a dense layer of logits. About 75k parameters: it trains on a
    CPU in tests and still has what the big ones have (batch norm, skips)."""
    inputs = keras.Input(input_shape, name="images")
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem_conv")(inputs)
    x = _batch_norm(name="stem_bn")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    for stage, (filters, stride) in enumerate(((16, 1), (32, 2), (64, 2)), start=1):
        x = _residual_block(x, filters, stride, name=f"stage{stage}_block")
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="resnet_small")
