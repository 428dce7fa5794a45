"""Keras's guide "Multi-GPU distributed training with TensorFlow", run by tfloop.

The guide's code as written, with two lines changed (each marked `# tfloop`):

1. `import tfloop; tfloop.use_devices("cpu:0,cpu:1")` at the top: the devices
   (here two logical CPUs; on a GPU machine "gpu:0,gpu:1") are set up before
   the script builds its data, which starts TensorFlow;
2. `model.fit(...)` becomes `tfloop.fit(<the function that builds and
   compiles the model>, ...)`, which calls that function under the engine's
   strategy and returns Keras's History (`.model` is the trained model).

and local generated data in place of `keras.datasets.mnist.load_data()`
(nothing is downloaded here), with smaller numbers so it runs in seconds.

The guide's fault-tolerance section follows, its `model.fit` changed the same
way (`# tfloop`): `ModelCheckpoint` writes `ckpt-<epoch>.keras` into `./ckpt`
(on the chief), and the second `run_training` starts from the newest one.
Its `make_or_restore_model` takes only the `.keras` files there (one more
changed line): anything else in the folder (a tfloop run's `train.lock` or
`ckpt-N.index`, were `./ckpt` also given as a `model_dir`) is not a model.
tfloop's own run folder is temporary here (no `model_dir`): `fit` removes it.
With a `model_dir` (`config=tfloop.RunConfig(model_dir=...)`), or a
`BackupAndRestore(backup_dir)` callback, the engine itself resumes an
interrupted `fit` exactly, mid-epoch included.

    python examples/keras_multi_gpu_guide.py
"""

import os

import numpy as np
import tensorflow as tf
import keras

import tfloop; tfloop.use_devices("cpu:0,cpu:1")  # noqa: E702  # tfloop


def load_data():  # in place of keras.datasets.mnist.load_data(): no download here
    rng = np.random.RandomState(0)
    x = rng.randint(0, 256, (640, 28, 28)).astype("uint8")
    y = (x.reshape(640, -1).mean(-1) > 127.5).astype("uint8") + 2 * (x[:, 0, 0] > 127)
    return (x[:512], y[:512]), (x[512:], y[512:])


# --- the guide, as written (sizes smaller) ------------------------------------------------
def get_compiled_model():
    # Make a simple 2-layer densely-connected neural network.
    inputs = keras.Input(shape=(784,))
    x = keras.layers.Dense(256, activation="relu")(inputs)
    x = keras.layers.Dense(256, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


def get_dataset():
    batch_size = 32
    num_val_samples = 128

    # Return the MNIST dataset in the form of a `tf.data.Dataset`.
    (x_train, y_train), (x_test, y_test) = load_data()

    # Preprocess the data (these are Numpy arrays)
    x_train = x_train.reshape(-1, 784).astype("float32") / 255
    x_test = x_test.reshape(-1, 784).astype("float32") / 255
    y_train = y_train.astype("float32")
    y_test = y_test.astype("float32")

    # Reserve num_val_samples samples for validation
    x_val = x_train[-num_val_samples:]
    y_val = y_train[-num_val_samples:]
    x_train = x_train[:-num_val_samples]
    y_train = y_train[:-num_val_samples]
    return (
        tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size),
    )


# Create a MirroredStrategy.
strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))

# Open a strategy scope.
with strategy.scope():
    # Everything that creates variables should be under the strategy scope.
    # In general this is only model construction & `compile()`.
    model = get_compiled_model()

# Train the model on all available devices.
train_dataset, val_dataset, test_dataset = get_dataset()
model = tfloop.fit(get_compiled_model, train_dataset, epochs=2, validation_data=val_dataset).model  # noqa: E501  # tfloop

# Test the model on all available devices.
model.evaluate(test_dataset)


# --- the guide's "Using callbacks to ensure fault tolerance" -------------------------------
# Prepare a directory to store all the checkpoints.
checkpoint_dir = "./ckpt"
if not os.path.exists(checkpoint_dir):
    os.makedirs(checkpoint_dir)


def make_or_restore_model():
    # Either restore the latest model, or create a fresh one
    # if there is no checkpoint available.
    checkpoints = [checkpoint_dir + "/" + name for name in os.listdir(checkpoint_dir)
                   if name.endswith(".keras")]  # Keras's models only: not a run's train.lock
    if checkpoints:
        latest_checkpoint = max(checkpoints, key=os.path.getctime)
        print("Restoring from", latest_checkpoint)
        return keras.models.load_model(latest_checkpoint)
    print("Creating a new model")
    return get_compiled_model()


def run_training(epochs=1):
    # Create a MirroredStrategy.
    strategy = tf.distribute.MirroredStrategy()

    # Open a strategy scope and create/restore the model
    with strategy.scope():
        model = make_or_restore_model()

    callbacks = [
        # This callback saves a SavedModel every epoch
        # We include the current epoch in the folder name.
        keras.callbacks.ModelCheckpoint(
            filepath=checkpoint_dir + "/ckpt-{epoch}.keras",
            save_freq="epoch",
        )
    ]
    return tfloop.fit(make_or_restore_model, train_dataset, epochs=epochs, callbacks=callbacks, validation_data=val_dataset, verbose=2)  # noqa: E501  # tfloop


# Running the first time creates the model
run_training(epochs=1)

# Calling the same function again will resume from where we left off
run_training(epochs=1)
