"""TensorFlow's tutorial "Multi-worker training with Keras": its mnist_setup.py.

As written, but for one line (marked `# local data`): the tutorial's
`tf.keras.datasets.mnist.load_data()` downloads MNIST, and nothing downloads
here, so `load_data()` reads an `mnist.npz` of Keras's layout from the current
folder (tests/examples/test_tutorials.py writes one: the UCI 8x8 handwritten
digits in tests/data/, made 28x28). `InputLayer(shape=...)` is Keras 3's spelling of the tutorial's
`input_shape=`. No line here is about tfloop.
"""

import os

import tensorflow as tf
import numpy as np


def load_data(path="mnist.npz"):
  """`keras.datasets.mnist.load_data()`'s result, from a local file."""
  with np.load(os.path.abspath(path)) as data:
    return (data["x_train"], data["y_train"]), (data["x_test"], data["y_test"])


def mnist_dataset(batch_size):
  (x_train, y_train), _ = load_data()  # local data
  # The `x` arrays are in uint8 and have values in the [0, 255] range.
  # You need to convert them to float32 with values in the [0, 1] range.
  x_train = x_train / np.float32(255)
  y_train = y_train.astype(np.int64)
  train_dataset = tf.data.Dataset.from_tensor_slices(
      (x_train, y_train)).shuffle(60000).repeat().batch(batch_size)
  return train_dataset


def build_and_compile_cnn_model():
  model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(shape=(28, 28)),
      tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
      tf.keras.layers.Conv2D(32, 3, activation='relu'),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(128, activation='relu'),
      tf.keras.layers.Dense(10)
  ])
  model.compile(
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
      metrics=['accuracy'])
  return model
