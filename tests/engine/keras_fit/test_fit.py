"""`engine.keras_fit.fit`: a compiled Keras model and its callbacks through the engine, in-process."""

import csv

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfloop.engine import ConfigError, RunConfig, fit
from tfloop.engine.keras_fit.fit_task import CompiledModelTask
from tfloop.engine.keras_fit import epochs
from tfloop.engine.loop import task_inputs
from tfloop.inputs import InputContext

EXAMPLES, BATCH = 150, 32  # 4 full batches and one of 22 per epoch


def _data(n=EXAMPLES, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, 8).astype("float32")
    return x, (x.sum(1) > 4).astype("int64")


def _dataset(batch=BATCH, **kwargs):
    return tf.data.Dataset.from_tensor_slices(_data(**kwargs)).batch(batch)


def build_and_compile():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"])
    return model


def _config(tmp_path, devices="cpu:0,cpu:1,cpu:2,cpu:3", **overrides):
    return RunConfig(strategy="mirrored" if "," in devices else "one_device", devices=devices,
                     model_dir=str(tmp_path), seed=3, steps_per_loop=2,
                     collective="reduce_to_one_device", **overrides)


def test_a_compiled_model_on_four_replicas_equals_one_device(tmp_path):
    """On full batches (128 examples at 32): the same weights and the same
    per-epoch history. (A partial last batch is split over the replicas and
    each replica's mean weighs the same, as Keras's fit under MirroredStrategy
    trains it, which is not one device's mean: test_parity_*.py.)"""
    one = fit(build_and_compile, _dataset(n=128), epochs=2,
              config=_config(tmp_path / "one", "cpu:0"), verbose=False)
    four = fit(build_and_compile, _dataset(n=128), epochs=2, config=_config(tmp_path / "four"),
               verbose=False)
    assert one.run_result["step"] == four.run_result["step"] == 8  # 2 x 128 / 32
    assert four.run_result["num_replicas"] == 4
    for a, b in zip(one.model.get_weights(), four.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one.history["loss"], four.history["loss"], rtol=1e-5)
    assert one.epoch == four.epoch == [0, 1]


def _keras_reference_weights():
    """Keras's own fit on one device: the same batches, the partial one a smaller step."""
    keras.utils.set_random_seed(3)
    model = build_and_compile()
    model.fit(_dataset(), epochs=2, verbose=0, shuffle=False)
    return model.get_weights()


def test_the_partial_last_batch_is_trained_as_keras_fit_trains_it(tmp_path):
    ours = fit(build_and_compile, _dataset(), epochs=2, config=_config(tmp_path, "cpu:0"),
               verbose=False)
    for a, b in zip(ours.model.get_weights(), _keras_reference_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _ids_trained(n, batch, epochs_, *, start_step=0):
    """The example ids (x) of the real rows of the global batches the
    engine's pipeline feeds the step, from `start_step`."""
    ids = tf.data.Dataset.range(n)
    data = tf.data.Dataset.zip((ids, ids)).shuffle(n, seed=1).batch(batch)
    task = CompiledModelTask(build_and_compile, data, global_batch_size=batch)
    context = InputContext.create(start_step=start_step, global_batch_size=batch, num_replicas=1,
                                  num_input_pipelines=1, input_pipeline_id=0, seed=1,
                                  shard_policy="data", deterministic=True)
    stream = task_inputs.train_dataset(task, context)
    steps = epochs_ * -(-n // batch) - start_step
    seen = []
    for x, _, _, real in stream.take(steps):
        seen.append(x.numpy()[real.numpy() > 0])
    return seen


def test_two_epochs_over_1500_examples_at_batch_64_see_each_example_exactly_twice():
    batches = _ids_trained(1500, 64, 2)
    assert len(batches) == 48  # 2 x ceil(1500 / 64): each epoch ends with a batch of 28
    assert [len(b) for b in batches[:24]] == [64] * 23 + [28]
    counts = np.bincount(np.concatenate(batches), minlength=1500)
    assert counts.min() == counts.max() == 2
    first_epoch = np.concatenate(batches[:24])
    assert sorted(first_epoch) == list(range(1500))  # each epoch one pass
    # Resumed mid-epoch (step 30 of 48): the very batches an uninterrupted run trains on next.
    resumed = _ids_trained(1500, 64, 2, start_step=30)
    for a, b in zip(resumed, batches[30:], strict=True):
        np.testing.assert_array_equal(a, b)


class _StopInSecondEpoch(keras.callbacks.Callback):
    """Stops after the second epoch's first loop, as a preemption would stop
    mid-epoch: the step reached is checkpointed."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1:
            self.model.stop_training = True


def test_a_run_stopped_mid_epoch_resumes_exactly(tmp_path):
    # A dataset's shuffle takes the global seed in force when it is made, and
    # the first one is made before any fit set it (RunConfig.seed=3): the
    # three streams are made alike only once it is set. (Alone in its
    # process, this test's straight run shuffled with TensorFlow's default
    # global seed; after another test's fit it had seed 3, as here.)
    tf.random.set_seed(3)
    data = lambda: tf.data.Dataset.from_tensor_slices(_data()).shuffle(  # noqa: E731
        EXAMPLES, seed=5).batch(BATCH)  # reshuffled each epoch, seeded: a deterministic stream
    straight = fit(build_and_compile, data(), epochs=2, config=_config(tmp_path / "straight"),
                   verbose=False)
    # Loops of 2 steps cut at epoch ends (5 steps): 2, 4, 5, 7, 9, 10.
    stopped = fit(build_and_compile, data(), epochs=2, callbacks=[_StopInSecondEpoch()],
                  config=_config(tmp_path / "resumed"), verbose=False)
    assert stopped.run_result["status"] == "stopped_early"
    assert stopped.run_result["step"] == 7
    resumed = fit(build_and_compile, data(), epochs=2, config=_config(tmp_path / "resumed"),
                  verbose=False)
    assert resumed.run_result["start_step"] == 7 and resumed.run_result["step"] == 10
    for a, b in zip(straight.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class _Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_begin(self, logs=None):
        self.calls.append(("train_begin",))

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(("epoch_begin", epoch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("batch_end", batch, sorted(logs)))

    def on_test_end(self, logs=None):
        self.calls.append(("test_end", sorted(logs)))

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(("epoch_end", epoch, dict(logs)))

    def on_train_end(self, logs=None):
        self.calls.append(("train_end",))


def test_csv_logger_early_stopping_and_a_custom_callback_under_mirrored(tmp_path):
    recorder, log = _Recorder(), tmp_path / "log.csv"
    # min_delta 10: no epoch improves on the first, so patience 1 stops after the second.
    early = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=10)
    history = fit(build_and_compile, _dataset(), epochs=5, validation_data=_dataset(),
                  callbacks=[keras.callbacks.CSVLogger(str(log)), early, recorder],
                  config=_config(tmp_path / "run"), verbose=False)
    assert history.epoch == [0, 1]
    assert history.run_result["status"] == "stopped_early" and history.run_result["step"] == 10
    rows = list(csv.DictReader(log.open()))
    assert [row["epoch"] for row in rows] == ["0", "1"]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(rows[0])
    np.testing.assert_allclose([float(r["val_loss"]) for r in rows], history.history["val_loss"],
                               rtol=1e-6)
    kinds = [c[0] for c in recorder.calls]
    assert kinds[:2] == ["train_begin", "epoch_begin"] and kinds[-1] == "train_end"
    # Loops of 2 steps, cut at the epoch's end (5 steps): batches 1, 3, 4, one call each.
    assert [c[1] for c in recorder.calls if c[0] == "batch_end"][:3] == [1, 3, 4]
    assert kinds[:7] == ["train_begin", "epoch_begin", "batch_end", "batch_end", "batch_end",
                         "test_end", "epoch_end"]
    epoch_logs = [c[2] for c in recorder.calls if c[0] == "epoch_end"]
    assert epoch_logs[0]["val_loss"] == history.history["val_loss"][0]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(epoch_logs[0])


def test_an_endless_dataset_needs_steps_per_epoch(tmp_path):
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        fit(build_and_compile, _dataset().repeat(), config=_config(tmp_path), verbose=False)


def build_and_compile_flat_classifier():
    """For `--task=test_fit:build_and_compile_flat_classifier` (no keras.Input: built
    from --dataset's image shape)."""
    model = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(0.05), metrics=["accuracy"])
    return model


def test_bin_train_task_names_a_function_that_builds_and_compiles_a_model(tmp_path):
    """`--task=module:function`: the compiled model, loss, metrics and optimizer
    on the built-in --dataset, in exact epochs (8192 examples at 1000: 9 steps)."""
    from tfloop.engine import run

    result = run(RunConfig(task="test_fit:build_and_compile_flat_classifier", epochs=1,
                           global_batch_size=1000, devices="cpu:0,cpu:1", steps_per_loop=5,
                           model_dir=str(tmp_path), mode="train", export=False, seed=2))
    assert result["step"] == 9 and result["status"] == "finished"
    assert result.task.exact_epochs and "train/accuracy" in result
    optimizer = result.model.optimizer
    assert isinstance(optimizer, keras.optimizers.SGD) and int(optimizer.iterations.numpy()) == 9
    np.testing.assert_allclose(optimizer.learning_rate.numpy(), 0.05)
