"""The model's own metric objects and steps under the engine, against Keras's
own `fit` under MirroredStrategy on the same logical CPUs (parity.py: every
log per epoch and every weight within 1e-6) (issue 39, items 3 and 4):

- a metric object keeps its arguments (`SparseTopKCategoricalAccuracy(k=2)`,
  `BinaryAccuracy(threshold=0.7)`), and a metric that is not a mean (AUC,
  Precision, Recall) is computed by its own object, train and validation,
  its state in the run's checkpoints (a resume inside an epoch logs what the
  uninterrupted run logs);
- a model that overrides `train_step` (and `test_step`) has them run by the
  engine, its update all-reduced once through the run's collective;
- both on `multi_worker` (two workers under bin/launch: the one test here
  that starts processes).

Metric objects are named here (`AUC(name="auc")`): both sides build the model
in one process, and Keras numbers a second unnamed `AUC()` `auc_1`.
"""

import dataclasses
import json
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import metrics_steps_cluster as cluster_script
import parity
from helpers import REPO, run_bin
from tfloop.engine.errors import ConfigError, TaskError

CLUSTER = os.path.join(os.path.dirname(__file__), "metrics_steps_cluster.py")

EXAMPLES, BATCH = 88, 16  # the last batch partial: 8 rows, 4 per replica


def _binary(n=EXAMPLES, seed=0, weighted=False):
    """`parity.data` centred and batched (learnt in a few steps: no metric
    stays at 0); with `weighted`, a sample weight per example."""
    x, y = parity.data(n, seed)
    parts = (2 * x - 1, y.astype("float32"))
    if weighted:
        parts += (np.linspace(0.5, 2.0, n).astype("float32"),)
    return tf.data.Dataset.from_tensor_slices(parts).batch(BATCH)


def _classes(n=EXAMPLES, seed=0):
    """Four classes: the first feature's quarter."""
    x, _ = parity.data(n, seed)
    return tf.data.Dataset.from_tensor_slices((x, (x[:, 0] * 4).astype("int64"))).batch(BATCH)


def top_k_classifier():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.Adam(0.02),
                  metrics=[keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2"),
                           keras.metrics.SparseTopKCategoricalAccuracy(name="top5")])
    return model


def test_top_k_with_k_2_is_computed_with_k_2_as_keras(tmp_path):
    """`SparseTopKCategoricalAccuracy(k=2)` was computed with the function's
    default k=5 (1.0 on four classes): its `k` is kept."""
    theirs, _ = parity.compare(top_k_classifier, _classes(), replicas=2, model_dir=tmp_path,
                               epochs=2, validation_data=_classes(40, seed=1))
    assert theirs.history["top5"] == [1.0, 1.0]  # what k=5 gives
    assert max(theirs.history["top2"] + theirs.history["val_top2"]) < 0.95


def binary_with_stateful_metrics():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(loss="binary_crossentropy", optimizer=keras.optimizers.Adam(0.05),
                  metrics=[keras.metrics.AUC(name="auc"), "precision",
                           keras.metrics.Recall(name="recall"),
                           keras.metrics.BinaryAccuracy(threshold=0.7, name="acc_at_07"),
                           keras.metrics.BinaryAccuracy(name="acc")],
                  weighted_metrics=[keras.metrics.AUC(name="weighted_auc")])
    return model


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """`compared(build)`: Keras's `fit` and `tfloop.fit` of `build`
    ("compiled": `binary_with_stateful_metrics`; "train_step": `penalized`) on
    2 replicas, the weighted binary data, 2 epochs, validated each epoch: one
    pair per module, trained on first use. Read by the parity tests of both
    models (which assert `parity.assert_same` on it) and, as the uninterrupted
    run, by the stop-and-resume test (its runs are its own). Nobody mutates
    the sides or the tfloop side's model_dir."""
    sides = {}

    def get(build):
        if build not in sides:
            function = {"compiled": binary_with_stateful_metrics, "train_step": penalized}[build]
            data, validation = _binary(weighted=True), _binary(40, seed=1)
            theirs = parity.run_keras(function, data, replicas=2, epochs=2,
                                      validation_data=validation)
            ours = parity.run_tfloop(function, data, replicas=2, epochs=2,
                                     validation_data=validation,
                                     model_dir=tmp_path_factory.mktemp(f"compared_{build}"))
            sides[build] = theirs, ours
        return sides[build]

    return get


#: The tests reading `compared`: one worker trains each pair once (`--dist loadgroup`).
STATEFUL = pytest.mark.xdist_group("test_parity_metrics_and_steps_stateful")


@STATEFUL
def test_auc_precision_recall_and_a_threshold_as_keras_train_and_validation(compared):
    """AUC, Precision, Recall (and a weighted AUC) computed by their own
    objects on each replica's rows, summed over the replicas as Keras reads
    them, reset at each epoch and around each validation: the same logs as
    Keras, train and `val_`; `BinaryAccuracy(threshold=0.7)` keeps its
    threshold. After `fit`, `model.metrics` holds what Keras's holds (the
    last validation's running values)."""
    theirs, ours = compared("compiled")
    parity.assert_same(theirs, ours)
    history = theirs.history
    assert history["acc_at_07"] != history["acc"]  # the threshold matters here
    assert all(0.0 < v <= 1.0 for name in ("auc", "precision", "recall", "val_auc",
                                          "val_precision", "val_recall")
               for v in history[name]), history

    def held(model):
        return {name: float(value) for name, value in model.get_metrics_result().items()}

    np.testing.assert_allclose(list(held(ours.model).values()),
                               list(held(theirs.model).values()), rtol=parity.RTOL)
    assert held(ours.model).keys() == held(theirs.model).keys()
    assert held(ours.model)["auc"] == ours.history["val_auc"][-1]


class _Interrupt(keras.callbacks.Callback):
    """Raises as the second epoch's fourth batch begins (after step 9's
    checkpoint): the run stops inside an epoch."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == 1 and batch == 3:
            raise RuntimeError("interrupted")


@STATEFUL
@pytest.mark.parametrize("build", ["compiled", "train_step"])
def test_a_stateful_metric_resumed_inside_an_epoch_logs_what_the_uninterrupted_run_logs(
        tmp_path, compared, build):
    """AUC's counts are in the run's checkpoints: a run stopped inside its
    second epoch and resumed logs that epoch's AUC over all its steps, as the
    run that was never stopped (without them: over the steps after the
    resume); the same for a model's own `train_step` (its metrics, and the
    weights it trains). The uninterrupted run is `compared`'s tfloop side (the
    same model, data, seed and epochs; its validation trains nothing, so its
    weights and train logs are those of a run without it, and its `val_` logs
    are not compared here: the stopped and resumed runs are not validated)."""
    straight = compared(build)[1]
    build = {"compiled": binary_with_stateful_metrics, "train_step": penalized}[build]
    overrides = {"checkpoint_interval": 3}
    with pytest.raises(RuntimeError, match="interrupted"):
        parity.run_tfloop(build, _binary(weighted=True), model_dir=tmp_path / "resumed",
                          epochs=2, config_overrides=overrides,
                          callbacks=lambda: [_Interrupt()])
    resumed = parity.run_tfloop(build, _binary(weighted=True), model_dir=tmp_path / "resumed",
                                epochs=2, config_overrides=overrides)
    assert resumed.returned.run_result["start_step"] == 9  # inside epoch 2 (steps 6..11)
    assert resumed.epoch == [1] and "auc" in straight.history
    trained = {name: values for name, values in straight.history.items()
               if not name.startswith("val_")}
    assert set(resumed.history) == set(trained), (sorted(resumed.history), sorted(trained))
    for name, values in trained.items():
        np.testing.assert_allclose(resumed.history[name], values[1:], rtol=parity.RTOL,
                                   err_msg=name)
    assert len(resumed.weights) == len(straight.weights)
    for (name, a), (_, b) in zip(resumed.weights, straight.weights):
        np.testing.assert_allclose(a, b, rtol=parity.RTOL, atol=parity.ATOL, err_msg=name)


# --- a model's own train_step and test_step ---------------------------------------------------

def _regression(n=EXAMPLES, seed=0):
    """`parity.data` with its sum as a (batch, 1) target."""
    x, _ = parity.data(n, seed)
    return tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True) / 3)).batch(BATCH)


class GuideModel(keras.Model):
    """The Keras guide "Customizing what happens in fit()", its first
    example: `compute_loss`, every metric of `self.metrics` updated, and
    `{m.name: m.result() ...}` returned (a nested `compile_metrics` dict,
    whose names are not `get_metrics_result()`'s: Keras logs the last
    step's dict, averaged over the replicas); and its `test_step`."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def guide_model():
    inputs = keras.Input(shape=(6,))
    model = GuideModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    return model


def test_the_guides_train_step_and_test_step_run_as_keras_runs_them(tmp_path):
    """The guide's higher-level `train_step` and its `test_step`, with
    validation: the engine runs them on each replica (its all-reduce in the
    optimizer's), and logs what Keras logs (the last step's dict here)."""
    theirs, _ = parity.compare(guide_model, _regression(), replicas=2, model_dir=tmp_path,
                               epochs=2, validation_data=_regression(40, seed=1))
    assert set(theirs.history) == {"loss", "mae", "val_loss", "val_mae"}


class LowerLevel(keras.Model):
    """The guide's lower-level example: `compile(optimizer=...)` alone, its
    own loss and `Mean(name="loss")` tracker, the `metrics` property listing
    the trackers (so Keras resets them each epoch)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.loss_fn(y, y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


def lower_level():
    inputs = keras.Input(shape=(6,))
    model = LowerLevel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=keras.optimizers.Adam(0.05))
    return model


def test_the_guides_lower_level_train_step_without_a_compiled_loss_as_keras(tmp_path):
    """No compiled loss (was refused: "compile(loss=...)"): the model's own
    loss and trackers, logged as Keras logs them (the trackers read across
    the replicas)."""
    theirs, ours = parity.compare(lower_level, _regression(), replicas=2, model_dir=tmp_path,
                                  epochs=2)
    assert set(theirs.history) == {"loss", "mae"}
    assert float(ours.model.loss_tracker.result()) == ours.history["loss"][-1]
    # The engine's records: the step's `loss`, and the norm of what its all-reduce summed.
    record = ours.returned.run_result
    assert record["train/grad_norm"] > 0 and 0 < record["train/loss"] < 10


class Penalized(keras.Sequential):
    """A step that trains something else than the compiled loss: an L2
    penalty on the weights added to it, `compute_metrics` for the logs, the
    sample weights when the data has them."""

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
            loss += 0.05 * tf.add_n([tf.reduce_sum(tf.square(w))
                                     for w in self.trainable_weights])
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def penalized():
    model = Penalized([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                       keras.layers.Dense(1, activation="sigmoid")])
    model.compile(loss="binary_crossentropy", optimizer=keras.optimizers.SGD(0.5),
                  metrics=["accuracy", keras.metrics.AUC(name="auc")])
    return model


@STATEFUL
def test_a_train_step_with_a_penalty_trains_what_keras_trains(compared):
    """The penalty is in the weights (was: the compiled loss alone, weights
    3.6 relative apart); validation runs Keras's own `test_step`."""
    parity.assert_same(*compared("train_step"))


class Raising(keras.Sequential):
    def train_step(self, data):
        raise ValueError("this step refuses to train")


def raising():
    model = Raising([keras.Input((6,)), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")
    return model


def test_a_train_step_that_raises_stops_fit_naming_it_in_one_line(tmp_path):
    """Keras's `fit` raises the step's own error; `fit` says it in one line
    naming the method, before anything is trained."""
    with pytest.raises(ValueError, match="refuses to train"):
        parity.run_keras(raising, _regression(), replicas=2, epochs=1)
    with pytest.raises(TaskError) as error:
        parity.run_tfloop(raising, _regression(), replicas=2, epochs=1, model_dir=tmp_path)
    message = str(error.value)
    assert "Raising.train_step raised ValueError: this step refuses to train" in message
    assert "\n" not in message
    assert not list(tmp_path.glob("ckpt-*"))


def test_what_the_engine_does_inside_its_own_step_is_refused_with_a_train_step(tmp_path):
    """The NaN-skip policy and XLA act inside the engine's step, which the
    model's `train_step` replaces: one line each, nothing trained."""
    with pytest.raises(ConfigError) as error:
        parity.run_tfloop(lower_level, _regression(), replicas=2, epochs=1,
                          model_dir=tmp_path / "skip",
                          config_overrides={"nan_policy": "skip_step"})
    assert "--nan_policy=skip_step" in str(error.value) and "\n" not in str(error.value)

    def compiled_with_xla():
        model = lower_level()
        model.compile(optimizer=keras.optimizers.Adam(0.05), jit_compile=True)
        return model

    with pytest.raises(ConfigError) as error:
        parity.run_tfloop(compiled_with_xla, _regression(), replicas=2, epochs=1,
                          model_dir=tmp_path / "xla")
    assert "jit_compile=True" in str(error.value) and "\n" not in str(error.value)


def test_own_steps_and_stateful_metrics_on_two_workers_as_on_two_replicas_of_one(tmp_path):
    """`multi_worker`, two workers under bin/launch: a model's own
    `train_step` (its update through the cluster's all-reduce) with AUC and
    Precision, validated each epoch. Every worker reads the metrics at the
    same points (a SyncOnRead read is a collective there) and logs the same
    History; it is the History and the weights of the same fit on two
    logical CPUs of one process (the same global batches, split otherwise:
    float sums in another order)."""
    worker_tmp = tmp_path / "worker_tmp"
    worker_tmp.mkdir()
    result = run_bin("launch", "--num_workers=2", "--grace_period=5", "--",
                     sys.executable, CLUSTER, str(tmp_path),
                     env={"TMPDIR": str(worker_tmp), "PYTHONPATH": REPO}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    chief, other = (json.loads((tmp_path / f"worker{i}.json").read_text()) for i in (0, 1))
    assert chief == other
    assert set(chief["history"]) == {"loss", "auc", "precision", "val_loss", "val_auc",
                                     "val_precision"}
    here = cluster_script.train(dataclasses.replace(
        parity.config(tmp_path / "here", seed=1), steps_per_loop=2))
    for name, values in here["history"].items():
        np.testing.assert_allclose(chief["history"][name], values, rtol=1e-5, err_msg=name)
    for a, b in zip(chief["weights"], here["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
