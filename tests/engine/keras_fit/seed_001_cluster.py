"""Seed 001 (TF's "Multi-worker training with Keras" tutorial) through `fit`,
with seed 000's callback (the "Writing your own callbacks" guide) and
CSVLogger, EarlyStopping and a recorder of `logs`: what
test_cluster.py runs on two workers under bin/launch.

The tutorial's code is kept as written, but for (1) local generated data in
place of the MNIST download, (2) `fit(build_and_compile_cnn_model, lambda
context: mnist_dataset(global_batch_size), batch_size=global_batch_size, ...)`
in place of `strategy = MultiWorkerMirroredStrategy()` / `with strategy.scope():
model = build...()` / `model.fit(multi_worker_dataset, ...)` (the dataset is
made by fit, after the strategy, as the tutorial makes it after its
strategy), smaller numbers (batch, steps) so the test stays cheap, and
`verbose=2` (one line per epoch, and the engine's lines the test reads, as
Keras advises for runs nobody watches in a terminal).
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf
import keras

from tfloop.engine import RunConfig, fit


def local_mnist():  # in place of tf.keras.datasets.mnist.load_data()
    rng = np.random.RandomState(0)
    x = rng.randint(0, 256, (256, 28, 28)).astype("uint8")
    return (x, rng.randint(0, 10, 256).astype("uint8")), (None, None)


# --- the tutorial's mnist_setup.py -------------------------------------------------------
def mnist_dataset(batch_size):
  (x_train, y_train), _ = local_mnist()
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


# --- seed 000: the guide's callback that prints the keys of `logs` -----------------------
class CustomCallback(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        keys = list(logs.keys())
        print("Starting training; got log keys: {}".format(keys))

    def on_train_end(self, logs=None):
        keys = list(logs.keys())
        print("Stop training; got log keys: {}".format(keys))

    def on_epoch_begin(self, epoch, logs=None):
        keys = list(logs.keys())
        print("Start epoch {} of training; got log keys: {}".format(epoch, keys))

    def on_epoch_end(self, epoch, logs=None):
        keys = list(logs.keys())
        print("End epoch {} of training; got log keys: {}".format(epoch, keys))

    def on_train_batch_begin(self, batch, logs=None):
        keys = list(logs.keys())
        print("...Training: start of batch {}; got log keys: {}".format(batch, keys))

    def on_train_batch_end(self, batch, logs=None):
        keys = list(logs.keys())
        print("...Training: end of batch {}; got log keys: {}".format(batch, keys))


class Recorder(keras.callbacks.Callback):
    """A tracker's callback: every worker's epochs and logs, written at the end."""

    def __init__(self, path):
        super().__init__()
        self.path, self.epochs = path, []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append([epoch, dict(logs)])

    def on_train_end(self, logs=None):
        with open(self.path, "w") as f:
            json.dump({"epochs": self.epochs, "stop_training": self.model.stop_training}, f)


if __name__ == "__main__":
  out = sys.argv[1]
  task = json.loads(os.environ["TF_CONFIG"])["task"]
  me = f"{task['type']}{task['index']}"
  # --- the tutorial's main.py ---------------------------------------------------------
  per_worker_batch_size = 8
  tf_config = json.loads(os.environ['TF_CONFIG'])
  num_workers = len(tf_config['cluster']['worker'])
  global_batch_size = per_worker_batch_size * num_workers
  callbacks = [CustomCallback(), keras.callbacks.CSVLogger(os.path.join(out, f"log-{me}.csv")),
               # min_delta 10: no epoch improves on the first; patience 1 stops after the second.
               keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=10),
               Recorder(os.path.join(out, f"logs-{me}.json"))]
  history = fit(build_and_compile_cnn_model, lambda context: mnist_dataset(global_batch_size),
                batch_size=global_batch_size, epochs=3, steps_per_epoch=4, callbacks=callbacks, verbose=2, config=RunConfig(model_dir=os.path.join(out, "model"),
                                                      steps_per_loop=2, seed=1))
  print(f"{me} history epochs {history.epoch} loss {len(history.history['loss'])}")
