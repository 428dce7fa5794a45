"""The parity matrix: Keras's `fit` under MirroredStrategy against `tfloop.fit`
on the same logical CPUs (parity.py), one case per thing a Keras user writes.
Each agrees within parity.RTOL (1e-6 relative) on every log per epoch and on
every weight, BatchNormalization's moving statistics included, unless the
case says otherwise and why (issue 31)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import parity
from tfloop.engine import ConfigError, fit
from test_parity_basics import BATCH, EXAMPLES, data, dataset, dense

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _compiled(model, metrics=("accuracy",), optimizer=None):
    model.compile(loss=LOSS, optimizer=optimizer or keras.optimizers.SGD(0.1),
                  metrics=list(metrics))
    return model


def batch_normalized_and_dropped_out():
    """BatchNormalization, then a seeded Dropout (was two models: BN's
    `Dense(8), BN, relu, Dense(2)` and Dropout's `Dense(8, relu), Dropout(0.5,
    seed=11), Dense(2)`)."""
    return _compiled(keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(8), keras.layers.BatchNormalization(),
        keras.layers.Activation("relu"), keras.layers.Dropout(0.5, seed=11),
        keras.layers.Dense(2)]))


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_batch_normalization_and_seeded_dropout_with_a_partial_last_batch(tmp_path, replicas):
    """88 examples at 16: the last batch holds 8 (2 per replica on 4), on 1,
    2 and 4 replicas, 2 epochs; logs and every weight within 1e-6. Two former
    cases of the same data, replicas and epochs on one model (each layer's
    behaviour is checked by the same comparison: a wrong BN statistic or a
    different mask moves the logs and weights as it did alone):

    - (was test_batch_normalization_with_a_partial_last_batch[1, 2, 4]) the
      padding that fills the engine's static step must not enter BN's batch
      statistics, nor its moving mean and variance (compared as weights);
    - (was test_dropout_seeded[1, 2]) Dropout with a seed draws the same
      masks on both sides (each replica's batch, the partial last one
      included); now on 4 replicas too."""
    parity.compare(batch_normalized_and_dropped_out, dataset(), replicas=replicas,
                   model_dir=tmp_path, epochs=2)


def test_a_replica_left_empty_by_the_partial_batch_adds_nothing(tmp_path):
    """86 examples at 16 on 4 replicas: the last 6 split 2, 2, 2, 0 as
    tf.distribute splits them; the empty replica's mean is 0 (Keras's divide_no_nan)."""
    parity.compare(dense, dataset(n=86), replicas=4, model_dir=tmp_path, epochs=2)


def _weighted(n=EXAMPLES, seed=0, weight=3.0):
    """Weights `weight`, and 1 on every third example (so a mean over the
    summed weights and one over the examples differ)."""
    x, y = data(n, seed)
    weights = np.where(np.arange(n) % 3 == 0, 1.0, weight).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(BATCH)


def weighted_and_unweighted_metrics():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    model.compile(loss=LOSS, optimizer=keras.optimizers.SGD(0.1),
                  metrics=["accuracy", keras.metrics.SparseCategoricalAccuracy(name="acc2")],
                  weighted_metrics=["accuracy"])
    return model


def test_sample_weighted_metrics_as_keras_weighs_them(tmp_path):
    """Weights 3 (1 on every third example): the loss is sum(w * loss) /
    examples; `metrics` are not weighted (a fraction of the examples), and
    `weighted_metrics` are sum(w * correct) / sum(w), logged as
    `weighted_accuracy` beside `accuracy`, in training and in validation."""
    theirs, ours = parity.compare(weighted_and_unweighted_metrics, _weighted(),
                                  model_dir=tmp_path, epochs=2,
                                  validation_data=_weighted(n=40, seed=1))
    assert {"accuracy", "acc2", "weighted_accuracy", "val_weighted_accuracy"} <= set(ours.history)
    assert max(ours.history["weighted_accuracy"]) <= 1.0
    assert ours.history["weighted_accuracy"] != ours.history["accuracy"]


def mean_logit(y_true, y_pred):
    """A plain function metric of the user's own."""
    return keras.ops.mean(y_pred, axis=-1)


#: "accuracy" (the subclassed cases' own), then
#: `metrics=[keras.metrics.sparse_categorical_accuracy]` as the
#: MirroredStrategy note writes it, and a function of the user's own.
METRIC_FUNCTIONS = ("accuracy", keras.metrics.sparse_categorical_accuracy, mean_logit)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(4, activation="relu")
        self.out = keras.layers.Dense(2)

    def call(self, x, training=False):
        return self.out(self.hidden(x))


def subclassed():
    return _compiled(Subclassed(), metrics=METRIC_FUNCTIONS)


def subclassed_built():
    model = Subclassed()
    model.build((None, 6))
    return _compiled(model, metrics=METRIC_FUNCTIONS)


@pytest.mark.parametrize("build", [subclassed, subclassed_built], ids=["unbuilt", "built"])
def test_a_subclassed_model_with_metric_functions(tmp_path, build):
    """Two former cases of the same data, replicas (2) and epochs (2) on one
    model, compiled with metric functions (how a model is defined and which
    metrics it compiles are independent: the metrics run on the outputs
    whatever made them):

    - (was test_a_subclassed_model[unbuilt, built]) a subclassed
      `keras.Model`, built by its first call or before `compile`: logs and
      weights within 1e-6;
    - (was test_metric_functions, on a `Dense(2)` model, now on both of these)
      `metrics=[keras.metrics.sparse_categorical_accuracy]` as the
      MirroredStrategy note writes it, and a function of the user's own:
      logged under their names, within 1e-6 of Keras's ("accuracy" too)."""
    theirs, ours = parity.compare(build, dataset(), model_dir=tmp_path, epochs=2)
    assert {"sparse_categorical_accuracy", "mean_logit"} <= set(ours.history)


def test_class_weight_validation_freq_and_initial_epoch(tmp_path):
    """Epochs 1 and 2 of 3 (initial_epoch=1), validated after epoch 1 only
    ((epoch + 1) % 2 == 0), class 1 weighing 3."""
    theirs, ours = parity.compare(dense, dataset(), model_dir=tmp_path, epochs=3,
                                  initial_epoch=1, validation_freq=2,
                                  class_weight={0: 1.0, 1: 3.0},
                                  validation_data=dataset(n=40, seed=1))
    assert ours.epoch == [1, 2]
    assert len(ours.history["val_loss"]) == 1


def test_numpy_arrays_with_batch_size_and_a_validation_tuple(tmp_path):
    x, y = data()
    parity.compare(dense, x, y=y, batch_size=BATCH, shuffle=False, model_dir=tmp_path, epochs=2,
                   validation_data=data(n=40, seed=1))


def test_validation_split_of_numpy_arrays(tmp_path):
    """The last 25% (22 of 88) held out before training, as Keras holds them out."""
    x, y = data()
    theirs, ours = parity.compare(dense, x, y=y, batch_size=BATCH, shuffle=False,
                                  validation_split=0.25, model_dir=tmp_path, epochs=2)
    assert ours.returned.run_result["step"] == 2 * -(-66 // BATCH)


def test_numpy_arrays_shuffled_see_every_example_once_per_epoch(tmp_path):
    """`shuffle=True` (Keras's default for arrays) shuffles each epoch with the
    run's seed, not Keras's own random stream: one pass per epoch (the
    example count), a new order each epoch, not Keras's order; nothing to
    compare exactly but the steps."""
    x, y = data()
    ours = parity.run_tfloop(dense, x, y=y, batch_size=BATCH, model_dir=tmp_path, epochs=2)
    assert ours.returned.run_result["step"] == 2 * -(-EXAMPLES // BATCH)
    assert len(ours.history["loss"]) == 2


def two_inputs():
    a, b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
    joined = keras.layers.Concatenate()([keras.layers.Dense(4)(a), b])
    return _compiled(keras.Model({"a": a, "b": b}, keras.layers.Dense(2)(joined)))


def _two_input_arrays(n=EXAMPLES, seed=0):
    x, y = data(n, seed)
    return {"a": x, "b": x[:, :3] * 2}, y


def test_dict_inputs_from_a_dataset(tmp_path):
    x, y = _two_input_arrays()
    parity.compare(two_inputs, tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),
                   model_dir=tmp_path, epochs=2)


def two_positional_inputs():
    a, b = keras.Input((6,)), keras.Input((3,))
    joined = keras.layers.Concatenate()([keras.layers.Dense(4)(a), b])
    return _compiled(keras.Model([a, b], keras.layers.Dense(2)(joined)))


def test_two_inputs_as_a_list_of_arrays(tmp_path):
    x, y = _two_input_arrays()
    parity.compare(two_positional_inputs, [x["a"], x["b"]], y=y, batch_size=BATCH,
                   shuffle=False, model_dir=tmp_path, epochs=2)


def test_validation_steps(tmp_path):
    parity.compare(dense, dataset(), model_dir=tmp_path, epochs=2,
                   validation_data=dataset(n=80, seed=1), validation_steps=2)


def _shuffled():
    x, y = data()
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(EXAMPLES, seed=7).batch(BATCH)


def test_a_seeded_shuffled_dataset(tmp_path):
    """Each side gets its own dataset object (iterating one draws its next
    order). The first epoch trains on the same order, exactly; after it, the
    orders differ: Keras's fit under MirroredStrategy makes an iterator per
    epoch boundary that it never reads, which draws an order of its own, and
    the engine's pass after pass does not (docs/keras.md). Every epoch is
    still one pass over a new order on both sides."""
    keras.utils.set_random_seed(3)  # the dataset's seeds are fixed when it is made
    theirs = parity.run_keras(dense, _shuffled(), epochs=2)
    keras.utils.set_random_seed(3)
    ours = parity.run_tfloop(dense, _shuffled(), model_dir=tmp_path, epochs=2)
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose(ours.history[name][0], theirs.history[name][0],
                                   rtol=parity.RTOL)
    assert ours.returned.run_result["step"] == theirs.returned.params["steps"] * 2


class KernelSums(keras.callbacks.Callback):
    """Reads `self.model` at each epoch's end and puts it in the logs."""

    def on_epoch_end(self, epoch, logs=None):
        logs["kernel_sum"] = float(sum(np.sum(w) for w in self.model.get_weights()))
        logs["learning_rate_seen"] = float(self.model.optimizer.learning_rate.numpy())


def test_learning_rate_scheduler(tmp_path):
    parity.compare(dense, dataset(), model_dir=tmp_path, epochs=3, callbacks=lambda: [
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.2 / (epoch + 1)),
        KernelSums()])


def test_reduce_lr_on_plateau(tmp_path):
    """min_delta 1: no epoch improves, so the rate halves after every second epoch."""
    theirs, ours = parity.compare(dense, dataset(), model_dir=tmp_path, epochs=4,
                                  validation_data=dataset(n=40, seed=1),
                                  callbacks=lambda: [keras.callbacks.ReduceLROnPlateau(
                                      "val_loss", factor=0.5, patience=1, min_delta=1.0),
                                      KernelSums()])
    assert ours.history["learning_rate_seen"][-1] < ours.history["learning_rate_seen"][0]


def test_early_stopping_restores_the_best_weights(tmp_path):
    """min_delta 10: no epoch improves on the first, so patience 1 stops
    after the second and puts the first epoch's weights back."""
    theirs, ours = parity.compare(dense, dataset(), model_dir=tmp_path, epochs=4,
                                  validation_data=dataset(n=40, seed=1),
                                  callbacks=lambda: [keras.callbacks.EarlyStopping(
                                      "val_loss", patience=1, min_delta=10,
                                      restore_best_weights=True)])
    assert ours.epoch == [0, 1]


def test_a_callback_that_reads_self_model_then_a_second_fit_on_the_same_model(tmp_path):
    """Two former cases on one pair of first fits (the second case's first
    fits were not compared; the first case's were exactly these, callback
    included, and a callback that only reads the model changes no weight):

    - (was test_a_callback_that_reads_self_model) `KernelSums`, a callback
      reading `self.model` (its weights and optimizer) at each epoch's end
      and putting it in the logs: the first fits (dense, 88 examples at 16,
      2 replicas, 2 epochs) agree on every log, the callback's included, and
      every weight (parity.assert_same, as parity.compare asserts);
    - (was test_a_second_fit_on_the_same_model) Keras: `model.fit(epochs=2)`
      twice trains four epochs. tfloop: the model_dir resumes, so the second
      call names the total (epochs=4); it trains the same two more epochs,
      numbered 2 and 3 (Keras numbers them 0, 1)."""
    first = parity.run_keras(dense, dataset(), epochs=2, callbacks=lambda: [KernelSums()])
    first_ours = parity.run_tfloop(dense, dataset(), model_dir=tmp_path, epochs=2,
                                   callbacks=lambda: [KernelSums()])
    # The callback that reads self.model: the first fits agree, its logs included.
    assert {"kernel_sum", "learning_rate_seen"} <= set(first_ours.history)
    parity.assert_same(first, first_ours)
    # The second fit on the same model: two more epochs, the same as Keras's.
    theirs = parity.run_keras(dense, dataset(), epochs=2, model=first.model)
    ours = parity.run_tfloop(dense, dataset(), model_dir=tmp_path, epochs=4)
    assert theirs.epoch == [0, 1] and ours.epoch == [2, 3]
    ours.epoch = theirs.epoch
    parity.assert_same(theirs, ours)


def two_outputs():
    x = keras.Input((6,))
    model = keras.Model(x, {"a": keras.layers.Dense(2)(x), "b": keras.layers.Dense(1)(x)})
    model.compile(loss={"a": LOSS, "b": "mse"}, optimizer="sgd")
    return model


def test_a_loss_per_output_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="a loss per output") as error:
        fit(two_outputs, dataset(), config=parity.config(tmp_path), verbose=False)
    assert "\n" not in str(error.value)
