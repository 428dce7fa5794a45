"""TensorFlow's tutorial "Multi-worker training with Keras": its "Model
training on a single worker" cells, trained by tfloop on two devices.

The tutorial's code as written, with two lines changed (each marked `# tfloop`):

1. `import tfloop; tfloop.use_devices("cpu:0,cpu:1")` at the top: the devices
   (two logical CPUs here; "gpu:0,gpu:1" on a GPU machine) are set up before
   the tutorial builds its dataset, which starts TensorFlow;
2. `single_worker_model.fit(...)` becomes `tfloop.fit(<the tutorial's
   build_and_compile_cnn_model>, ...)`, which builds and compiles the model
   under the engine's strategy and trains it with the tutorial's arguments;
   `steps_per_epoch` is read from the environment variable TUTORIAL_STEPS
   (70, the tutorial's, when unset: the test sets 3, to stay cheap).

mnist_setup.py reads a local mnist.npz in place of the MNIST download (see
there). Run from this folder, with an mnist.npz in it:

    python single_worker.py
"""

import os

import tfloop; tfloop.use_devices("cpu:0,cpu:1")  # noqa: E702  # tfloop

import mnist_setup

batch_size = 64
single_worker_dataset = mnist_setup.mnist_dataset(batch_size)
single_worker_model = mnist_setup.build_and_compile_cnn_model()
tfloop.fit(mnist_setup.build_and_compile_cnn_model, single_worker_dataset, epochs=3, steps_per_epoch=int(os.environ.get("TUTORIAL_STEPS", 70)))  # noqa: E501  # tfloop
