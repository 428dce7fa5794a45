"""`fit`'s callbacks, checkpoints and output as Keras's (issue 31 items 3, 8-12; issue 29
items 7, 9): Keras's own `fit` under MirroredStrategy is the reference where it can be
run (parity.py); the engine's own guarantees (resume, clean-up) are checked on their own.
"""

import csv
import glob
import json
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import parity
from tfloop.engine import ConfigError, RunConfig, fit
from tfloop.engine.strategies import spec as spec_lib

EXAMPLES, BATCH = 64, 16  # 4 full batches per epoch


def data(n=EXAMPLES, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, 6).astype("float32")
    return x, (x.sum(1) > 3).astype("int64")


def dataset(n=EXAMPLES, seed=0, nan_at=None):
    x, y = data(n, seed)
    if nan_at is not None:
        x[nan_at] = np.nan
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def dense(**compile_kwargs):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"], **compile_kwargs)
    return model


def linear():
    """No ReLU: a NaN in the input reaches the loss (ReLU on this CPU turns NaN into 0)."""
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"])
    return model


def one_device(model_dir, **overrides):
    overrides.setdefault("steps_per_loop", 2)
    return RunConfig(strategy="one_device", devices="cpu:0", model_dir=str(model_dir), seed=3,
                     **overrides)


# --- item 3: a second fit on a finished run ------------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished `fit` of `dense`: one device, 2 epochs, validated each epoch:
    (its History, its model_dir). Read by the second-fit test (which fits
    again in its model_dir: nothing trains there, and no other test reads the
    folder) and, as the uninterrupted run, by the BackupAndRestore test (its
    weights and train logs: the validation trains nothing)."""
    model_dir = tmp_path_factory.mktemp("finished")
    history = fit(dense, dataset(), epochs=2, validation_data=dataset(32, seed=1),
                  config=one_device(model_dir), verbose=0)
    return history, model_dir


#: The tests reading `finished`: one worker trains it once (`--dist loadgroup`).
FINISHED = pytest.mark.xdist_group("test_fit_callbacks_finished")


@FINISHED
def test_a_second_fit_of_a_finished_run_with_validation_trains_nothing_as_keras_initial_epoch(
        finished):
    """The same call again resumes; the run is done, so nothing trains: an empty
    History, as Keras's `fit(epochs=2, initial_epoch=2)` returns (no exception)."""
    first, model_dir = finished
    again = fit(dense, dataset(), epochs=2, validation_data=dataset(32, seed=1),
                config=one_device(model_dir), verbose=0)
    keras_side = dense().fit(dataset(), epochs=2, initial_epoch=2,
                             validation_data=dataset(32, seed=1), verbose=0)
    assert first.epoch == [0, 1] and "val_loss" in first.history
    assert again.history == keras_side.history == {} and again.epoch == keras_side.epoch == []
    assert again.run_result["start_step"] == again.run_result["step"] == 8
    for a, b in zip(first.model.get_weights(), again.model.get_weights()):
        np.testing.assert_array_equal(a, b)  # the finished run's weights, restored


# --- item 8: ModelCheckpoint and BackupAndRestore; item 10: LearningRateScheduler -------------

@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """One parity run of `dense` on 2 replicas, 2 epochs, with the callbacks of
    two former tests: ModelCheckpoint of the whole model each epoch and of the
    best weights (each side into its own folder) and a LearningRateScheduler
    halving the rate each epoch: (folder, keras's side, tfloop's side).
    `parity.compare` asserted the sides agree (epochs, every log, every
    weight). Read by the ModelCheckpoint and the History tests; nobody writes."""
    folder = tmp_path_factory.mktemp("checkpointed")
    sides = iter(["keras", "tfloop"])

    def callbacks():
        directory = folder / next(sides)
        return [keras.callbacks.ModelCheckpoint(str(directory / "ckpt-{epoch}.keras")),
                keras.callbacks.ModelCheckpoint(str(directory / "best.weights.h5"),
                                                monitor="loss", save_best_only=True,
                                                save_weights_only=True),
                keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5)]

    theirs, ours = parity.compare(dense, dataset(), replicas=2, model_dir=folder / "run",
                                  epochs=2, callbacks=callbacks)
    return folder, theirs, ours


#: The tests reading `checkpointed`: one worker trains it once (`--dist loadgroup`).
CHECKPOINTED = pytest.mark.xdist_group("test_fit_callbacks_checkpointed")


@CHECKPOINTED
def test_model_checkpoint_writes_what_keras_writes(checkpointed):
    """Both ModelCheckpoints write the same files as Keras's, the whole-model
    ones with the same weights, apart from the engine's own checkpoints
    (in the run of `checkpointed`, with its LearningRateScheduler)."""
    folder, _, _ = checkpointed
    names = sorted(os.listdir(folder / "keras"))
    assert names == sorted(os.listdir(folder / "tfloop")) == [
        "best.weights.h5", "ckpt-1.keras", "ckpt-2.keras"]
    for name in ("ckpt-1.keras", "ckpt-2.keras"):
        a = keras.models.load_model(folder / "keras" / name)
        b = keras.models.load_model(folder / "tfloop" / name)
        for x, y in zip(a.get_weights(), b.get_weights()):
            np.testing.assert_allclose(y, x, rtol=parity.RTOL, atol=parity.ATOL)
    assert "ckpt-2.keras" not in os.listdir(folder / "run")  # the engine's own are apart


class _Interrupt(keras.callbacks.Callback):
    """Raises as the second epoch's third batch begins (after step 6's
    checkpoint): the run is interrupted mid-epoch, as Keras's own tests of
    BackupAndRestore interrupt it."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == 1 and batch == 2:
            raise RuntimeError("interrupted")


@FINISHED
def test_backup_and_restore_is_the_engines_exact_resume_and_is_deleted_when_done(
        tmp_path, finished):
    """Interrupted mid-epoch and fitted again with BackupAndRestore: it resumes
    from the backup at step 6 and trains the weights and the epoch's logs of
    the uninterrupted run (`finished`: the same model, data, seed and
    config, validated besides), then deletes its backup."""
    backup_dir = tmp_path / "backup"
    straight, _ = finished
    config = RunConfig(strategy="one_device", devices="cpu:0", seed=3, steps_per_loop=2)
    backup = lambda: keras.callbacks.BackupAndRestore(str(backup_dir), save_freq=2)  # noqa
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(dense, dataset(), epochs=2, config=config, verbose=0,
            callbacks=[backup(), _Interrupt()])
    assert os.path.exists(backup_dir / "ckpt-6.index")  # kept: the run did not finish
    resumed = fit(dense, dataset(), epochs=2, config=config, verbose=0, callbacks=[backup()])
    assert resumed.run_result["start_step"] == 6 and resumed.run_result["step"] == 8
    for a, b in zip(straight.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # The epoch resumed inside logs the means of all its steps (issue 29 item 9).
    assert resumed.epoch == [1]
    np.testing.assert_allclose(resumed.history["loss"], straight.history["loss"][1:],
                               rtol=1e-6)
    np.testing.assert_allclose(resumed.history["accuracy"], straight.history["accuracy"][1:],
                               rtol=1e-6)
    assert not backup_dir.exists()  # delete_checkpoint=True, as Keras deletes its backup


def test_backup_and_restore_beside_another_model_dir_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as error:
        fit(dense, dataset(), config=one_device(tmp_path / "run"), verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))])
    assert "two places to resume from" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists() and not (tmp_path / "backup").exists()


# --- item 9: TerminateOnNaN -----------------------------------------------------------------

def test_terminate_on_nan_stops_the_keras_way(tmp_path):
    """A NaN in the third batch: Keras's TerminateOnNaN stops there, the History
    has the epoch (loss nan, the accuracy of the three batches), fit returns."""
    callbacks = lambda: [keras.callbacks.TerminateOnNaN()]  # noqa: E731
    theirs = parity.run_keras(linear, dataset(nan_at=40), replicas=2, epochs=2,
                              callbacks=callbacks)
    ours = parity.run_tfloop(linear, dataset(nan_at=40), replicas=2, epochs=2,
                             callbacks=callbacks, model_dir=tmp_path)
    assert ours.epoch == theirs.epoch == [0]
    assert set(ours.history) == set(theirs.history) == {"loss", "accuracy"}
    assert np.isnan(ours.history["loss"][0]) and np.isnan(theirs.history["loss"][0])
    np.testing.assert_allclose(ours.history["accuracy"], theirs.history["accuracy"],
                               rtol=parity.RTOL)
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["status"] == "failed" and record["step"] == 0  # nothing non-finite saved


def test_without_terminate_on_nan_the_engine_still_stops_with_its_error(tmp_path):
    from tfloop.engine.errors import NonFinite

    with pytest.raises(NonFinite, match="the numbers diverged"):
        fit(linear, dataset(nan_at=40), epochs=2, config=one_device(tmp_path), verbose=0)


# --- item 10: jit_compile, verbose, History ---------------------------------------------------

@CHECKPOINTED
def test_history_has_what_keras_logs_learning_rate_included_and_no_grad_norm(checkpointed):
    """With a LearningRateScheduler halving the rate (`checkpointed`'s run):
    the same log names as Keras's History, the rate among them, no grad_norm."""
    _, theirs, ours = checkpointed
    assert set(ours.history) == set(theirs.history)
    assert "learning_rate" in ours.history and "grad_norm" not in ours.history
    np.testing.assert_allclose(ours.history["learning_rate"], [0.05, 0.025])


def test_compile_jit_compile_true_trains_with_xla(tmp_path, monkeypatch):
    asked = []
    real = spec_lib.Trainer
    monkeypatch.setattr(spec_lib, "Trainer",
                        lambda **kwargs: asked.append(kwargs["options"].jit_compile)
                        or real(**kwargs))
    fit(lambda: dense(jit_compile=True), dataset(), config=one_device(tmp_path / "xla"),
        verbose=0)
    fit(dense, dataset(), config=one_device(tmp_path / "plain"), verbose=0)
    assert asked == [True, False]


def _keras_lines(text):
    """What a terminal shows at the end: each line's last redraw (after its last
    carriage return), colours and trailing blanks dropped."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return [line.split("\r")[-1].rstrip() for line in text.split("\n")
            if line.strip() and not _ENGINE_LINE.match(line)]


#: The engine's own lines (`HH:MM:SS  message`: its set-up, checkpoints).
_ENGINE_LINE = re.compile(r"\d\d:\d\d:\d\d  ")


def _shape(lines):
    """The lines with every token holding a digit (counts, times, values) as N;
    the bar's intermediate redraws depend on time and are not compared."""
    return [re.sub(r"\S*\d\S*", "N", line) for line in lines]


@pytest.mark.parametrize("verbose", [1, 2])
def test_verbose_prints_what_keras_prints(tmp_path, capsys, verbose):
    dense().fit(dataset(), epochs=2, verbose=verbose)
    theirs = _keras_lines(capsys.readouterr().out)
    fit(dense, dataset(), epochs=2, config=one_device(tmp_path), verbose=verbose)
    out = capsys.readouterr().out
    ours = _keras_lines(out)
    assert "train step" not in out  # Keras's lines replace the engine's progress lines
    # verbose=2 adds the engine's other lines (line by line, as Keras's own): none at 1,
    # where they would break the bar.
    assert ("saved checkpoint" in out) == (verbose == 2)
    assert _shape(ours) == _shape(theirs), (ours, theirs)
    assert ours[0] == "Epoch 1/2" and len(ours) == 4
    if verbose == 2:  # one line per epoch
        assert re.match(r"4/4 - .*accuracy: [\d.]+ - loss: [\d.]+$", ours[1])
    else:  # the bar, at its end
        assert ours[1].startswith("4/4 ━━━━━━━━━━━━━━━━━━━━ ")
    assert "━" not in "".join(_keras_lines(capsys.readouterr().out))


# --- item 11: a checkpoint per epoch by default; no folder left behind -----------------------

def test_fit_checkpoints_every_epoch_by_default(tmp_path):
    fit(dense, dataset(), epochs=3,
        config=RunConfig(strategy="one_device", devices="cpu:0", model_dir=str(tmp_path)),
        verbose=0)
    steps = sorted(int(re.search(r"ckpt-(\d+)\.index", p).group(1))
                   for p in glob.glob(str(tmp_path / "ckpt-*.index")))
    assert steps == [4, 8, 12]


def test_a_fit_without_model_dir_leaves_no_folder_behind(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    history = fit(dense, dataset(), config=RunConfig(strategy="one_device", devices="cpu:0"),
                  verbose=0)
    assert history.epoch == [0] and history.model is not None
    assert os.listdir(tmp_path) == []
    with pytest.raises(Exception, match="the user's model function failed"):  # a failure too
        fit(_raises, dataset(), config=RunConfig(strategy="one_device", devices="cpu:0"),
            verbose=0)
    assert os.listdir(tmp_path) == []


def _raises():
    raise NotImplementedError("the user's model function failed")


# --- item 12: devices set too late ---------------------------------------------------------

def test_devices_after_tensorflow_started_name_use_devices_in_one_line(tmp_path):
    """This process started TensorFlow with 4 logical CPUs (conftest.py)."""
    devices = ",".join(f"cpu:{i}" for i in range(8))
    with pytest.raises(ConfigError) as error:
        fit(dense, dataset(), config=RunConfig(devices=devices, model_dir=str(tmp_path)),
            verbose=0)
    message = str(error.value)
    assert "\n" not in message and f"tfloop.use_devices({devices!r})" in message
    assert not tmp_path.exists() or os.listdir(tmp_path) == []


# --- issue 29 item 7: an empty validation is no result ---------------------------------------

def test_an_empty_validation_passes_and_records_no_result(tmp_path):
    early = keras.callbacks.EarlyStopping(monitor="val_loss", patience=0)
    history = fit(dense, dataset(), epochs=3, validation_data=dataset().take(0),
                  callbacks=[early], config=one_device(tmp_path), verbose=0)
    assert history.epoch == [0, 1, 2]  # EarlyStopping saw no val_loss, so did not stop
    assert "val_loss" not in history.history and "val_accuracy" not in history.history
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert not [k for k in record if k.startswith("eval/") and k != "eval/examples"]
    assert record["eval/examples"] == 0
    tags = set()
    for path in glob.glob(str(tmp_path / "summaries" / "**" / "events.*"), recursive=True):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(value.tag for value in event.summary.value)
    assert "loss" in tags or "final/train/loss" in tags  # train summaries are there
    assert not [t for t in tags if "eval/" in t], tags
    assert not [p for p in glob.glob(str(tmp_path / "summaries" / "eval" / "*"))
                if _scalars(p)]


def _scalars(path):
    return [v for e in tf.compat.v1.train.summary_iterator(path) for v in e.summary.value]
