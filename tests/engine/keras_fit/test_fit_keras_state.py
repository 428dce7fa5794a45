"""What Keras's own `fit` builds before the first epoch and does at the end,
and the names it logs, against Keras's `fit` under MirroredStrategy (parity.py)
(issue 39, items 1 and 7):

- `model.metrics` is built before `on_train_begin`, so a `mode="auto"` monitor
  of a compiled metric (`val_accuracy`) finds its direction, as in Keras;
- `fit` ends with `optimizer.finalize_variable_values` (Adam's `use_ema=True`
  puts the moving average into the weights);
- a string metric is logged under the string written (`"mae"` -> `mae`), a
  metric object under its `name`.
"""

import csv
import os

import keras
import numpy as np
import pytest

import parity

EXAMPLES, BATCH = 64, 16


def _data(n=EXAMPLES, seed=0):
    return parity.data(n, seed)


def _dataset(n=EXAMPLES, seed=0):
    return parity.dataset(n, BATCH, seed)


def classifier():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(0.5), metrics=["accuracy"])
    return model


class _Look(keras.callbacks.Callback):
    """Records what a callback may read at `on_train_begin`: the compiled
    metrics (names and classes) and how many variables the optimizer has."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def on_train_begin(self, logs=None):
        metrics = [m for m in self.model.metrics if hasattr(m, "metrics")]
        self.seen.setdefault("metrics", []).append(
            [(m.name, type(m).__name__) for c in metrics for m in c.metrics])
        self.seen.setdefault("slots", []).append(len(self.model.optimizer.variables))


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    """One parity run of `classifier` (4 epochs, validated) with
    ReduceLROnPlateau, ModelCheckpoint(save_best_only) and EarlyStopping
    watching `val_accuracy` (mode auto), and `_Look` (first) recording what
    each side showed at `on_train_begin`: (folder, keras's side, tfloop's
    side, seen).
    `parity.compare` asserted the two sides agree. Read by the two tests
    below; nobody writes to it."""
    folder = tmp_path_factory.mktemp("monitored")
    sides, seen = iter(["keras", "tfloop"]), {}

    def callbacks():
        side = folder / next(sides)
        # `_Look` first: it sees what a lone callback sees, before the others begin.
        return [_Look(seen),
                keras.callbacks.ReduceLROnPlateau(monitor="val_accuracy", factor=0.5,
                                                  patience=0),
                keras.callbacks.ModelCheckpoint(str(side / "best.weights.h5"),
                                                monitor="val_accuracy", save_best_only=True,
                                                save_weights_only=True),
                keras.callbacks.EarlyStopping(monitor="val_accuracy", patience=2)]

    theirs, ours = parity.compare(classifier, _dataset(), replicas=2,
                                  model_dir=folder / "run", epochs=4,
                                  validation_data=_dataset(32, seed=1), callbacks=callbacks)
    return folder, theirs, ours, seen


#: The tests reading `monitored`: one worker trains it once (`--dist loadgroup`).
MONITORED = pytest.mark.xdist_group("test_fit_keras_state_monitored")


@MONITORED
def test_auto_mode_monitors_of_val_accuracy_decide_as_keras(monitored):
    """EarlyStopping, ReduceLROnPlateau and ModelCheckpoint(save_best_only)
    watching `val_accuracy` with `mode="auto"` (Keras finds "max" in
    `model.metrics`): no error, and the same decisions as Keras's fit: the
    epoch it stops at, the reduced learning rates, the best checkpoint."""
    folder, theirs, ours, _ = monitored
    # Decisions were taken (else this would prove nothing): Keras stopped before
    # the fourth epoch and halved the rate; tfloop the same (compare: epochs, logs).
    assert len(theirs.epoch) < 4 and min(theirs.history["learning_rate"]) < 0.5, theirs.history
    assert ours.epoch == theirs.epoch
    assert ours.history["learning_rate"] == theirs.history["learning_rate"]
    for side in ("keras", "tfloop"):
        assert os.listdir(folder / side) == ["best.weights.h5"]
    best = [keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), keras.layers.Dense(2)])
            for _ in range(2)]
    for model, side in zip(best, ("keras", "tfloop")):
        model.load_weights(folder / side / "best.weights.h5")
    for a, b in zip(best[0].get_weights(), best[1].get_weights()):
        np.testing.assert_allclose(b, a, rtol=parity.RTOL, atol=parity.ATOL)


@MONITORED
def test_model_metrics_are_built_when_training_begins(monitored):
    """What a callback may read at `on_train_begin`: the compiled metrics
    (Keras's names and classes) and the optimizer's variables, as in Keras.
    Read from `monitored`'s parity run of `classifier` (this test trained a
    1-epoch run of its own before; `on_train_begin` comes before any epoch,
    so the epochs, validation and other callbacks there change nothing of
    what it sees)."""
    _, _, _, seen = monitored
    keras_side, ours = seen["metrics"]
    assert ours == keras_side == [("accuracy", "SparseCategoricalAccuracy")]
    assert len(seen["slots"]) == 2
    assert seen["slots"][0] == seen["slots"][1]  # the optimizer built: its variables made


def regression_metrics():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(loss="binary_crossentropy", optimizer=keras.optimizers.SGD(0.5),
                  metrics=["mae", "mse", "accuracy",
                           keras.metrics.MeanSquaredError(name="my_mse")])
    return model


def test_string_metrics_are_logged_under_the_names_written_as_keras_logs_them(tmp_path):
    """`metrics=["mae", "mse", "accuracy", MeanSquaredError(name="my_mse")]`:
    History keys, CSVLogger columns and `monitor="val_mae"` (mode auto) are
    Keras's (`mae`, not `mean_absolute_error`)."""
    sides = iter(["keras", "tfloop"])

    def callbacks():
        folder = tmp_path / next(sides)
        folder.mkdir()
        return [keras.callbacks.CSVLogger(str(folder / "log.csv")),
                keras.callbacks.EarlyStopping(monitor="val_mae", patience=5)]

    x, y = _data()
    vx, vy = _data(32, seed=1)
    theirs, ours = parity.compare(regression_metrics, x, y=y.astype("float32"), replicas=2,
                                  model_dir=tmp_path / "run", epochs=2, batch_size=BATCH,
                                  shuffle=False, validation_data=(vx, vy.astype("float32")),
                                  callbacks=callbacks)
    names = {"loss", "mae", "mse", "accuracy", "my_mse"}
    assert set(theirs.history) == names | {f"val_{n}" for n in names}
    assert set(ours.history) == set(theirs.history)
    columns = []
    for side in ("keras", "tfloop"):
        with open(tmp_path / side / "log.csv") as handle:
            columns.append(next(csv.reader(handle)))
    assert columns[1] == columns[0]


def averaged():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.9),
                  metrics=["accuracy"])
    return model


def test_adam_with_use_ema_ends_with_the_average_in_the_weights_as_keras(tmp_path):
    """Keras's fit ends with `optimizer.finalize_variable_values`: with
    `use_ema=True` the final weights are the moving average (every weight
    within parity.RTOL of Keras's), not the last step's."""
    parity.compare(averaged, _dataset(), replicas=2, model_dir=tmp_path, epochs=2)
