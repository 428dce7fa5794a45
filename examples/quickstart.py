"""README's first Python example, runnable as written: your own data and loss
as a `tfloop.Task`, trained, evaluated and exported by `tfloop.run`.

    python examples/quickstart.py        # writes runs/quickstart_regression/

tests/examples/test_quickstart.py runs this file as it is.
"""

import keras
import numpy as np
import tensorflow as tf

import tfloop

# Your data: NumPy arrays (dict features work too), float targets, sample weights.
rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 8)).astype("float32")
y = x @ rng.normal(size=8).astype("float32") + 0.1 * rng.normal(size=2048).astype("float32")
w = rng.uniform(0.5, 2.0, size=2048).astype("float32")


class Regression(tfloop.Task):
    def __init__(self, x, y, w):
        self.data = tfloop.ArrayData(features=x, targets=y, sample_weight=w, eval_fraction=0.2)

    def build_model(self):                      # called inside strategy.scope()
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])

    def train_dataset(self, context):           # endless global batches from context.start_step
        return self.data.train_dataset(context)

    def eval_dataset(self, context):            # one pass
        return self.data.eval_dataset(context)

    def loss(self, model, batch, *, training):  # per-example values, shape (batch,)
        x, y, w = batch
        error = model(x, training=training)[:, 0] - y
        return tfloop.LossOutput(per_example_loss=w * error**2, metrics={"mae": tf.abs(error)})


config = tfloop.RunConfig(model_dir="runs/quickstart_regression", train_steps=300,
                          learning_rate=0.05, eval_interval=100)  # devices="gpu:0,gpu:1", ...
result = tfloop.run(config, task=Regression(x, y, w))
print(f"step {result['step']}: eval loss {result['eval/loss']:.4f}, mae {result['eval/mae']:.3f}")
for entry in result.history:                    # every loop and evaluation, in order
    print(entry["kind"], entry["step"], round(entry["loss"], 4))
predictions = result.model.predict(x[:4], verbose=0)   # the trained model
