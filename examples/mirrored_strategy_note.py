"""TensorFlow's MirroredStrategy note (the "Distributed training with
TensorFlow" guide's Keras use, with the Keras guide's MobileNetV2 variant),
run by tfloop on two devices.

The note's code as written, with two lines changed (each marked `# tfloop`):

1. `import tfloop; tfloop.use_devices("cpu:0,cpu:1")` at the top: the devices
   (two logical CPUs here; "gpu:0,gpu:1" on a GPU machine) are set up before
   the script builds its data, which starts TensorFlow;
2. `model.fit(...)` becomes `tfloop.fit(<the function that builds and
   compiles the model>, ...)`, which builds it under the engine's strategy
   and returns Keras's History (`.model` is the trained model).

What differs for another reason (said where it is): `load_data()` makes
random 32x32 images with a learnable label in place of a download (nothing
downloads here), and `mobilenet_v2_ish` (32x32 inputs, one inverted residual
block) stands in for `keras.applications.MobileNetV2(weights=None)`, whose
graph alone takes a minute to trace on a loaded CPU, so the test stays cheap.

    python examples/mirrored_strategy_note.py
"""

import numpy as np
import tensorflow as tf
import keras

import tfloop; tfloop.use_devices("cpu:0,cpu:1")  # noqa: E702  # tfloop


def load_data():  # in place of a download: 32x32 RGB images, label = the brightest channel
    rng = np.random.RandomState(0)
    x = rng.randint(0, 256, (128, 32, 32, 3)).astype("uint8")
    y = x.reshape(128, -1, 3).mean(1).argmax(-1).astype("int64")
    return x, y


def mobilenet_v2_ish(input_shape, classes):  # in place of keras.applications.MobileNetV2
    """MobileNetV2's shape in miniature: a strided stem, one inverted residual
    block (1x1 expand, 3x3 depthwise, 1x1 linear projection, batch norm and
    ReLU6, the skip connection) and global pooling: the full model traces for
    a minute on a loaded CPU, this one in seconds."""
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


def get_compiled_model():
    model = mobilenet_v2_ish(input_shape=(32, 32, 3), classes=3)
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.SGD(),
                  metrics=[keras.metrics.sparse_categorical_accuracy])
    return model


# --- the note, as written ------------------------------------------------------------------
x, y = load_data()
dataset = tf.data.Dataset.from_tensor_slices((x / np.float32(255), y)).batch(16)

strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))

with strategy.scope():
    model = get_compiled_model()

model = tfloop.fit(get_compiled_model, dataset, epochs=2).model  # tfloop
model.evaluate(dataset)
