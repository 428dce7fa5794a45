"""The user's pipeline as written and Keras's input knobs, against Keras's own
`fit` under MirroredStrategy on the same logical CPUs (parity.py) (issue 39,
items 8, 9, 10, 12; docs/keras.md, its section of that name):

- the engine's dataset options never loosen the user's: a parallel `map`
  before a seeded `shuffle` comes out in its own order, as in Keras;
- `verbose=0` prints nothing, as Keras's `fit(verbose=0)`;
- a `keras.utils.PyDataset` trains and validates as Keras's fit reads it;
- `compile(steps_per_execution=N)` is the loop length: the batch callbacks
  are called as Keras's fit calls them;
"""

import logging
import os
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import logging as absl_logging

import parity
from helpers import bin_env, run_python
from tfloop.engine import RunConfig, fit
from tfloop.engine.errors import ConfigError
from tfloop.engine.runtime import logs

EXAMPLES, BATCH = 88, 16


def classifier():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(0.5), metrics=["accuracy"])
    return model


def _slow_on_some(index):
    """Every eighth example takes 10 ms: a parallel map that may yield out of
    order then does (the bug: the engine set `deterministic=False` on it)."""
    if int(index) % 8 == 0:
        time.sleep(0.01)
    return index


def parallel_map_then_seeded_shuffle():
    """The same order every epoch (Keras's fit under MirroredStrategy draws an
    order of its own at each epoch boundary from a reshuffling one:
    test_parity_matrix.py::test_a_seeded_shuffled_dataset), from seeds fixed alike."""
    keras.utils.set_random_seed(3)  # the shuffle's seeds are fixed when it is made
    x, y = parity.data(EXAMPLES)
    indices = tf.data.Dataset.range(EXAMPLES).map(
        lambda i: tf.ensure_shape(tf.py_function(_slow_on_some, [i], tf.int64), []),
        num_parallel_calls=tf.data.AUTOTUNE)
    examples = indices.map(lambda i: (tf.gather(x, i), tf.gather(y, i)))
    return examples.shuffle(EXAMPLES, seed=1, reshuffle_each_iteration=False).batch(BATCH)


def test_a_parallel_map_before_a_seeded_shuffle_keeps_its_order_as_keras(tmp_path):
    """The user's dataset leaves `deterministic` unset (TensorFlow: in order);
    the engine adds its shard policy and keeps that: the same batches as
    Keras's fit (History and weights within 1e-6), and two tfloop runs are
    bit-identical."""
    _, ours = parity.compare(classifier, parallel_map_then_seeded_shuffle(), replicas=2,
                             model_dir=tmp_path / "first", epochs=2)
    again = parity.run_tfloop(classifier, parallel_map_then_seeded_shuffle(), replicas=2,
                              model_dir=tmp_path / "second", epochs=2)
    assert again.history == ours.history
    for (name, a), (_, b) in zip(ours.weights, again.weights):
        assert np.array_equal(a, b), name


#: A user's script: two `fit(verbose=0)` calls on one model_dir (the second
#: finds the run finished: the engine warns that it trains nothing) of a
#: PyDataset read on two threads, with a marker on stderr once TensorFlow,
#: Keras and tfloop are imported (what `import tensorflow` prints is
#: TensorFlow's, with or without fit).
_QUIET_SCRIPT = """
import sys
import tfloop
tfloop.use_devices("cpu:0,cpu:1")
import keras, numpy as np
from tfloop.engine import RunConfig, fit

class Batches(keras.utils.PyDataset):
    def __init__(self):
        super().__init__(workers=2)
        self.x = np.random.RandomState(0).rand(64, 6).astype("float32")
        self.y = (self.x.sum(1) > 3).astype("int64")

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return self.x[index * 16:(index + 1) * 16], self.y[index * 16:(index + 1) * 16]

def build():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer="sgd", metrics=["accuracy"])
    return model

print("-- fit --", file=sys.stderr, flush=True)
for _ in range(2):
    fit(build, Batches(), epochs=2, verbose=0, config=RunConfig(model_dir=sys.argv[1]))
"""


def test_a_script_fitting_a_py_dataset_with_verbose_0_prints_nothing_and_exits(tmp_path):
    """`fit(verbose=0)` in a script writes nothing on stdout or stderr, as
    Keras's `fit(verbose=0)`: the engine's lines (its input-bound notice, the
    second call's "nothing to train") go to Python logging only, and
    TensorFlow's checkpoint saver no longer leaves a stderr handler on the
    root logger. TensorFlow's C++ lines follow TF_CPP_MIN_LOG_LEVEL as for
    Keras (3 here, as the suite's binaries run). The script ends: the
    PyDataset's generator pipeline and its reading threads do not hold the
    interpreter's exit."""
    done = run_python(["-c", _QUIET_SCRIPT, str(tmp_path / "run")], timeout=300,
                      env=bin_env(), cwd=os.getcwd())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == ""
    assert done.stderr.split("-- fit --\n", 1)[1] == ""


def test_verbose_0_after_a_verbose_run_sends_the_engines_lines_to_logging_only(capsys):
    """`configure_logging` (what a `verbose=2` fit sets up) prints on stdout;
    inside `to_logging_only` (a `verbose=0` fit) a line reaches only the
    handlers the program added, and the stdout handler is back after."""
    log, root = logging.getLogger("tfloop"), logging.getLogger()
    saved = (list(log.handlers), log.level, log.propagate, list(root.handlers))
    try:
        root.handlers[:] = []
        logs.configure_logging()
        with logs.to_logging_only():
            logging.getLogger("tfloop.engine.test").warning("input-bound")
            absl_logging.info("what TensorFlow's checkpoint saver logs")
        assert capsys.readouterr() == ("", "")
        assert root.handlers == []  # absl's basicConfig() did not run
        logging.getLogger("tfloop.engine.test").warning("after")
        assert capsys.readouterr().out.endswith("  after\n")
    finally:
        log.handlers[:], log.level, log.propagate = saved[0], saved[1], saved[2]
        root.handlers[:] = saved[3]


class BatchRecord(keras.callbacks.Callback):
    """Records what Keras's batch hooks are told: ("begin", batch) and ("end", batch, logs)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(("begin", batch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("end", batch, {k: float(v) for k, v in (logs or {}).items()}))


def every_fourth_step():
    model = classifier()
    model.compile(loss=model.loss, optimizer=keras.optimizers.SGD(0.5), metrics=["accuracy"],
                  steps_per_execution=4)
    return model


def _fit_without_steps_per_loop(build, model_dir, data, callbacks, replicas=1, **fit_kwargs):
    """tfloop's side with `RunConfig.steps_per_loop` left unset (parity.config
    sets it to 1), so the compiled model's steps_per_execution sets the loops."""
    config = RunConfig(strategy="mirrored", devices=",".join(f"cpu:{i}" for i in range(replicas)),
                       collective="reduce_to_one_device", model_dir=str(model_dir), seed=3)
    history = fit(build, data, callbacks=callbacks, config=config, verbose=0, **fit_kwargs)
    return parity.Side(dict(history.history), list(history.epoch),
                       parity._weights(history.model), history.model, history)


def _assert_same_batch_calls(ours, theirs):
    """The same batch hooks at the same `batch`, the logs within 1e-6."""
    assert [call[:2] for call in ours] == [call[:2] for call in theirs], (ours, theirs)
    for mine, keras_call in zip(ours, theirs):
        if mine[0] == "end":
            assert mine[2].keys() == keras_call[2].keys()
            for name, value in keras_call[2].items():
                np.testing.assert_allclose(mine[2][name], value, rtol=parity.RTOL,
                                           atol=parity.ATOL, err_msg=name)


def test_steps_per_execution_sets_the_loops_and_the_batch_callbacks_as_keras(tmp_path):
    """`compile(steps_per_execution=4)` over 11 batches an epoch: Keras's fit
    calls the batch hooks at batches 0, 4, 8 (begin) and 3, 7, 11 (end: the
    last, shorter execution numbered as a whole one) with the epoch's logs so
    far; tfloop's loops are those executions, with the same calls and logs
    (1e-6). On one replica: Keras's fit with steps_per_execution > 1 under a
    MirroredStrategy of two replicas fails (TF 2.21, Keras 3.15: "You must
    feed a value for placeholder tensor", keras-team/keras#19246)."""
    data = parity.dataset(EXAMPLES, 8)
    keras_record, ours_record = BatchRecord(), BatchRecord()
    theirs = parity.run_keras(every_fourth_step, data, replicas=1, epochs=2,
                              callbacks=lambda: [keras_record])
    ours = _fit_without_steps_per_loop(every_fourth_step, tmp_path / "run", data,
                                       [ours_record], epochs=2)
    parity.assert_same(theirs, ours)
    begins = [call[1] for call in keras_record.calls if call[0] == "begin"]
    ends = [call[1] for call in keras_record.calls if call[0] == "end"]
    assert begins == [0, 4, 8] * 2 and ends == [3, 7, 11] * 2, keras_record.calls
    _assert_same_batch_calls(ours_record.calls, keras_record.calls)


def test_steps_per_execution_beside_another_steps_per_loop_is_refused_in_one_line(tmp_path):
    """Two settings of one loop's length: refused, naming both; and a
    `steps_per_epoch` that is not whole executions (Keras's fit trains
    ceil(5 / 4) * 4 = 8 steps an epoch then) too."""
    data = parity.dataset(EXAMPLES, 8)
    config = parity.config(tmp_path / "a", replicas=1)  # steps_per_loop=1
    with pytest.raises(ConfigError, match=r"^fit: compile\(steps_per_execution=4\) and "
                       r"RunConfig\(steps_per_loop=1\) both set"):
        fit(every_fourth_step, data, epochs=1, verbose=0, config=config)
    with pytest.raises(ConfigError, match=r"^fit: steps_per_epoch=5 is not a multiple of "
                       r"compile\(steps_per_execution=4\); Keras's fit would train 8 steps"):
        _fit_without_steps_per_loop(every_fourth_step, tmp_path / "b", data.repeat(), [],
                                    epochs=1, steps_per_epoch=5)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing written


class Batches(keras.utils.PyDataset):
    """`parity.data` in batches of `batch` (the last one partial). Its
    `on_epoch_end` rotates the batch order by one, so the batches an epoch
    reads depend on when the hooks ran; every hook is recorded in `calls`,
    the indices read after each `on_epoch_begin` in `passes`."""

    def __init__(self, n=EXAMPLES, batch=BATCH, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = parity.data(n, seed)
        self.batch = batch
        self.order = list(range(-(-n // batch)))
        self.calls, self.passes = [], []

    def __len__(self):
        return len(self.order)

    def __getitem__(self, index):
        if self.passes:
            self.passes[-1].append(index)
        rows = slice(self.order[index] * self.batch, (self.order[index] + 1) * self.batch)
        return self.x[rows], self.y[rows]

    def on_epoch_begin(self):
        self.calls.append("begin")
        self.passes.append([])

    def on_epoch_end(self):
        self.calls.append("end")
        self.order = self.order[1:] + self.order[:1]


def test_a_py_dataset_for_training_and_validation_as_keras(tmp_path):
    """`keras.utils.PyDataset` (`keras.utils.Sequence`) as Keras's fit takes
    it, with `shuffle=False`: each epoch its `len()` batches in index order
    between `on_epoch_begin()` and `on_epoch_end()`, a begin and end pair
    when fit (and each validation) starts, as Keras under a strategy peeks;
    the partial batch wherever it falls (here mid-epoch, rotated there by the
    hook): the same History and weights as Keras's fit (1e-6) and the same
    hook calls. `steps_per_execution` left at Keras's 1 and no
    `RunConfig.steps_per_loop`: the batch callbacks every batch, as Keras's."""
    keras_record, ours_record = BatchRecord(), BatchRecord()
    train, val = Batches(), Batches(32, seed=1)
    theirs = parity.run_keras(classifier, train, epochs=2, validation_data=val, shuffle=False,
                              callbacks=lambda: [keras_record])
    keras_train, keras_val = train.calls, val.calls
    train, val = Batches(), Batches(32, seed=1)
    ours = _fit_without_steps_per_loop(classifier, tmp_path / "run", train, [ours_record],
                                       replicas=2, epochs=2, validation_data=val,
                                       shuffle=False)
    our_train, our_val = train.calls, val.calls
    parity.assert_same(theirs, ours)
    assert len(keras_record.calls) == 2 * 2 * 6  # begin and end, every batch of 2 epochs
    _assert_same_batch_calls(ours_record.calls, keras_record.calls)
    assert keras_train == ["begin", "end"] * 3, keras_train
    # The engine's pipeline reads on across the end of the last epoch (up to
    # a whole pass ahead, its hooks with it) before fit returns.
    assert our_train[:6] == keras_train and our_train[6:] in ([], ["begin"], ["begin", "end"])
    assert our_val == keras_val == ["begin", "end"] * 4, (our_val, keras_val)


class Crash(keras.callbacks.Callback):
    """Raises after `at` batches of the second epoch: the process's end, as a kill."""

    def __init__(self, at):
        super().__init__()
        self.at, self.epoch = at, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch + 1 == self.at:
            raise RuntimeError("crash")


def test_a_shuffled_py_dataset_resumes_mid_epoch_exactly(tmp_path):
    """`shuffle=True` (Keras's default) shuffles a PyDataset's batch order
    each epoch; here from the run's seed (Keras draws it from Python's
    `random`, so not Keras's order): every batch once an epoch, and a run
    stopped inside its second epoch resumes from its checkpoint (step 8 of
    12) to the uninterrupted run's weights, bit for bit, its hooks replayed
    as the resumed run reads the batches before step 8 again."""
    data = Batches()
    whole = parity.run_tfloop(classifier, data, model_dir=tmp_path / "whole", epochs=2)
    assert whole.returned.run_result["step"] == 12
    first, second = data.passes[1:3]  # after the pass Keras opens to peek: empty
    assert sorted(first) == sorted(second) == list(range(6)) and first != second, data.passes
    config = {"checkpoint_interval": 2}
    with pytest.raises(RuntimeError, match="crash"):
        parity.run_tfloop(classifier, Batches(), model_dir=tmp_path / "cut", epochs=2,
                          callbacks=lambda: [Crash(at=3)], config_overrides=config)
    resumed = parity.run_tfloop(classifier, Batches(), model_dir=tmp_path / "cut", epochs=2,
                                config_overrides=config)
    assert resumed.returned.run_result["start_step"] == 8
    for (name, a), (_, b) in zip(whole.weights, resumed.weights):
        assert np.array_equal(a, b), name
    assert resumed.history["loss"] == whole.history["loss"][1:]


class Unbatched(Batches):
    def __getitem__(self, index):
        return self.x[index * self.batch:(index + 1) * self.batch]


class Endless(Batches):
    @property
    def num_batches(self):
        return None

    def __getitem__(self, index):
        return super().__getitem__(index % len(self.order))


def test_what_a_py_dataset_cannot_be_is_refused_in_one_line(tmp_path):
    """Refused before anything runs, each naming what to change: processes
    (the engine reads on threads), a batch that is not (x, y[, w]), an
    endless PyDataset without steps_per_epoch or as validation, and a
    PyDataset under parameter_server (its workers run the pipeline as a graph)."""
    config = parity.config(tmp_path / "run")
    cases = [
        (dict(train_data=Batches(use_multiprocessing=True, workers=2)),
         r"^fit: the training data is a PyDataset with use_multiprocessing=True; .* threads"),
        (dict(train_data=Unbatched()),
         r"^fit: the training data\[0\] is ndarray; a PyDataset for fit returns \(x, y\)"),
        (dict(train_data=Endless()),
         r"^fit: the training data is a PyDataset with no end .* give steps_per_epoch="),
        (dict(train_data=Batches(), validation_data=Endless()),
         r"^fit: validation_data is a PyDataset with no end .* a validation is one pass"),
        (dict(train_data=Batches(), config=RunConfig(strategy="parameter_server")),
         r"^fit: a PyDataset under parameter_server: .* give train_data as a function"),
    ]
    for arguments, says in cases:
        arguments = {"config": config, **arguments}
        with pytest.raises(ConfigError, match=says):
            fit(classifier, arguments.pop("train_data"), epochs=1, verbose=0, **arguments)
    assert not (tmp_path / "run").exists()
