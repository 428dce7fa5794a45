"""The model's own metric objects under the engine, against Keras's own
`fit` under MirroredStrategy on the same logical CPUs (parity.py: every log
per epoch and every weight within 1e-6) (issue 39, item 4): a metric object
keeps its arguments (`SparseTopKCategoricalAccuracy(k=2)`,
`BinaryAccuracy(threshold=0.7)`), and a metric that is not a mean (AUC,
Precision, Recall) is computed by its own object, train and validation, its
state in the run's checkpoints (a resume inside an epoch logs what the
uninterrupted run logs).

Metric objects are named here (`AUC(name="auc")`): both sides build the model
in one process, and Keras numbers a second unnamed `AUC()` `auc_1`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import parity

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


def test_auc_precision_recall_and_a_threshold_as_keras_train_and_validation(tmp_path):
    """AUC, Precision, Recall (and a weighted AUC) computed by their own
    objects on each replica's rows, summed over the replicas as Keras reads
    them, reset at each epoch and around each validation: the same logs as
    Keras, train and `val_`; `BinaryAccuracy(threshold=0.7)` keeps its
    threshold. After `fit`, `model.metrics` holds what Keras's holds (the
    last validation's running values)."""
    theirs, ours = parity.compare(binary_with_stateful_metrics, _binary(weighted=True),
                                  replicas=2, model_dir=tmp_path, epochs=2,
                                  validation_data=_binary(40, seed=1))
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


def test_a_stateful_metric_resumed_inside_an_epoch_logs_what_the_uninterrupted_run_logs(
        tmp_path):
    """AUC's counts are in the run's checkpoints: a run stopped inside its
    second epoch and resumed logs that epoch's AUC over all its steps, as the
    run that was never stopped (without them: over the steps after the
    resume)."""
    build = binary_with_stateful_metrics
    straight = parity.run_tfloop(build, _binary(weighted=True),
                                 model_dir=tmp_path / "straight", epochs=2)
    overrides = {"checkpoint_interval": 3}
    with pytest.raises(RuntimeError, match="interrupted"):
        parity.run_tfloop(build, _binary(weighted=True), model_dir=tmp_path / "resumed",
                          epochs=2, config_overrides=overrides,
                          callbacks=lambda: [_Interrupt()])
    resumed = parity.run_tfloop(build, _binary(weighted=True), model_dir=tmp_path / "resumed",
                                epochs=2, config_overrides=overrides)
    assert resumed.returned.run_result["start_step"] == 9  # inside epoch 2 (steps 6..11)
    assert resumed.epoch == [1] and "auc" in straight.history
    for name, values in straight.history.items():
        np.testing.assert_allclose(resumed.history[name], values[1:], rtol=parity.RTOL,
                                   err_msg=name)
    for (name, a), (_, b) in zip(resumed.weights, straight.weights):
        np.testing.assert_allclose(a, b, rtol=parity.RTOL, atol=parity.ATOL, err_msg=name)

