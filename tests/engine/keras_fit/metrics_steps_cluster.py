"""A model with its own `train_step` and stateful compiled metrics (AUC,
Precision) through `fit` on the workers of a cluster: what
test_parity_metrics_and_steps.py runs on two workers under bin/launch, and
in one process on two logical CPUs to compare.

    python metrics_steps_cluster.py OUT        # under bin/launch: one history per worker
"""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

from tfloop.engine import RunConfig, fit

GLOBAL_BATCH, STEPS, EPOCHS = 16, 4, 2


class Penalized(keras.Sequential):
    """Its own step: the compiled loss plus an L2 penalty, `compute_metrics`."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            loss += 0.05 * tf.add_n([tf.reduce_sum(tf.square(w))
                                     for w in self.trainable_weights])
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
        return self.compute_metrics(x, y, y_pred)


def build():
    model = Penalized([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                       keras.layers.Dense(1, activation="sigmoid")])
    model.compile(loss="binary_crossentropy", optimizer=keras.optimizers.SGD(0.5),
                  metrics=[keras.metrics.AUC(name="auc"), "precision"])
    return model


def _examples(n, seed):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, 6).astype("float32") * 2 - 1
    return x, (x.sum(1) > 0).astype("float32")


def train_data(context):
    return tf.data.Dataset.from_tensor_slices(_examples(64, 0)).repeat().batch(GLOBAL_BATCH)


def validation_data(context):
    return tf.data.Dataset.from_tensor_slices(_examples(40, 1)).batch(GLOBAL_BATCH)


def train(config: RunConfig) -> dict:
    history = fit(build, train_data, batch_size=GLOBAL_BATCH, epochs=EPOCHS,
                  steps_per_epoch=STEPS, validation_data=validation_data, verbose=0,
                  config=config)
    return {"history": history.history, "weights": [w.tolist() for w in
                                                    history.model.get_weights()]}


if __name__ == "__main__":
    out = sys.argv[1]
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    result = train(RunConfig(model_dir=os.path.join(out, "model"), steps_per_loop=2, seed=1))
    with open(os.path.join(out, f"{task['type']}{task['index']}.json"), "w") as f:
        json.dump(result, f)
