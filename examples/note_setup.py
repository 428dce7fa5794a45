"""What examples/mirrored_strategy_note.py uses in place of a download and of
`keras.applications.MobileNetV2`: nothing downloads here, and the full
MobileNetV2 graph takes a minute to trace on a loaded CPU. No line here is
about tfloop."""

import keras
import numpy as np


def load_data():
    """In place of a download: 32x32 RGB images, labelled by their brightest channel."""
    rng = np.random.RandomState(0)
    x = rng.randint(0, 256, (128, 32, 32, 3)).astype("uint8")
    y = x.reshape(128, -1, 3).mean(1).argmax(-1).astype("int64")
    return x, y


def mobilenet_v2_ish(weights=None, input_shape=(32, 32, 3), classes=3):
    """`keras.applications.MobileNetV2(weights=None, ...)`'s shape in
    miniature: a strided stem, one inverted residual block (1x1 expand, 3x3
    depthwise, 1x1 linear projection, batch norm and ReLU6, the skip
    connection) and global pooling; it traces in seconds."""
    assert weights is None
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(x))
    y = keras.layers.Conv2D(48, 1, use_bias=False)(x)
    y = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(y))
    y = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False)(y)
    y = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(y))
    y = keras.layers.BatchNormalization()(keras.layers.Conv2D(8, 1, use_bias=False)(y))
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Add()([x, y]))
    return keras.Model(inputs, keras.layers.Dense(classes, activation="softmax")(x))
