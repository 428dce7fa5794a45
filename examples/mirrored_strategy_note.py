"""TensorFlow's MirroredStrategy note (the "Distributed training with
TensorFlow" guide's Keras use, with Keras's MobileNetV2), run by tfloop on
two devices.

The note's code as written (tests/examples/originals/mirrored_strategy_note.py;
the test counts the `diff`), with two lines changed, each marked `# tfloop`:

1. `import tfloop; tfloop.use_devices("cpu:0,cpu:1")` at the top: the devices
   (two logical CPUs here; on a GPU machine `import tfloop` alone, and the
   note's `MirroredStrategy()` takes every GPU) exist before the script builds
   its data, which starts TensorFlow;
2. `model.fit(...)` becomes `tfloop.fit(model, ...)`: fit adopts the note's
   own strategy and trains the note's `model` in place, so `model.evaluate`
   after it evaluates the trained model.

Not about tfloop (marked `# local data`, `# smaller`, from examples/note_setup.py):
random 32x32 images in place of a download, and a miniature MobileNetV2 in
place of `keras.applications.MobileNetV2`, so the test stays cheap.

    python examples/mirrored_strategy_note.py
"""
import tfloop; tfloop.use_devices("cpu:0,cpu:1")  # noqa: E702  # tfloop
import numpy as np
import tensorflow as tf
import keras
from note_setup import load_data, mobilenet_v2_ish  # local data

x, y = load_data()
dataset = tf.data.Dataset.from_tensor_slices((x / np.float32(255), y)).batch(16)

strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))

with strategy.scope():
    model = mobilenet_v2_ish(weights=None, input_shape=(32, 32, 3), classes=3)  # smaller
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.SGD(),
                  metrics=[keras.metrics.sparse_categorical_accuracy])

tfloop.fit(model, dataset, epochs=2)  # tfloop
model.evaluate(dataset)
