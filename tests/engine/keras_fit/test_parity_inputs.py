"""The user's pipeline as written and Keras's input knobs, against Keras's own
`fit` under MirroredStrategy on the same logical CPUs (parity.py) (issue 39,
items 8, 9, 10, 12):

- the engine's dataset options never loosen the user's: a parallel `map`
  before a seeded `shuffle` comes out in its own order, as in Keras;
- `verbose=0` prints nothing, as Keras's `fit(verbose=0)`;
"""

import logging
import subprocess
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging as absl_logging

import parity
from helpers import bin_env
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
#: finds the run finished: the engine warns that it trains nothing), with a
#: marker on stderr once TensorFlow, Keras and tfloop are imported (what
#: `import tensorflow` prints is TensorFlow's, with or without fit).
_QUIET_SCRIPT = """
import sys
import tfloop
tfloop.use_devices("cpu:0,cpu:1")
import keras, numpy as np, tensorflow as tf
from tfloop.engine import RunConfig, fit

def build():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer="sgd", metrics=["accuracy"])
    return model

x = np.random.RandomState(0).rand(64, 6).astype("float32")
y = (x.sum(1) > 3).astype("int64")
print("-- fit --", file=sys.stderr, flush=True)
for _ in range(2):
    fit(build, tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, verbose=0,
        config=RunConfig(model_dir=sys.argv[1]))
"""


def test_verbose_0_prints_nothing(tmp_path):
    """`fit(verbose=0)` in a script writes nothing on stdout or stderr, as
    Keras's `fit(verbose=0)`: the engine's lines (its input-bound notice, the
    second call's "nothing to train") go to Python logging only, and
    TensorFlow's checkpoint saver no longer leaves a stderr handler on the
    root logger. TensorFlow's C++ lines follow TF_CPP_MIN_LOG_LEVEL as for
    Keras (3 here, as the suite's binaries run)."""
    done = subprocess.run([sys.executable, "-c", _QUIET_SCRIPT, str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, env=bin_env())
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
