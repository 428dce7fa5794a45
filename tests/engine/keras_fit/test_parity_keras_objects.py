"""The compiled optimizer, loss and dtype policy as the user gave them,
against Keras's `fit` under MirroredStrategy (parity.py) (issue 39, items
2, 5, 6, 11):

- the compiled optimizer instance trains, not a copy from its config:
  `AdamW.exclude_from_weight_decay`, a `LearningRateSchedule` without
  `get_config` (the shape of its own docstring's example);
- a compiled loss's `reduction` trains and logs as Keras's;
- a global dtype policy set with Keras's API is the model's, and
  mixed_float16 trains with Keras's `LossScaleOptimizer` (float16: 1e-3);
- `clipnorm` clips the all-reduced gradient: tfloop equals one device,
  where Keras clips each replica's gradient before their sum.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import parity
import tfloop

EXAMPLES, BATCH = 88, 16  # the last batch partial: 8 rows, 4 per replica


def _dataset(n=EXAMPLES, seed=0, weights=False):
    x, y = parity.data(n, seed)
    parts = (x, y)
    if weights:
        parts = (x, y, np.random.RandomState(seed + 7).uniform(0.5, 2.0, n).astype("float32"))
    return tf.data.Dataset.from_tensor_slices(parts).batch(BATCH)


def normed_model():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                             keras.layers.LayerNormalization(), keras.layers.Dense(2)])


def _normed(optimizer, made=None):
    """A compiled `normed_model()` whose optimizer is `optimizer(model)`
    (each one made is appended to `made`)."""
    def build():
        model = normed_model()
        compiled = optimizer(model)
        if made is not None:
            made.append(compiled)
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=compiled, metrics=["accuracy"])
        return model
    return build


def adamw_excluding_the_norm(model):
    optimizer = keras.optimizers.AdamW(0.05, weight_decay=0.5)
    optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
    return optimizer


def test_adamw_weight_decay_exclusions_are_kept_as_keras(tmp_path):
    """`AdamW.exclude_from_weight_decay(var_names=...)`, which `get_config()`
    does not carry: LayerNormalization's gamma and beta do not decay, as in
    Keras (a copy decayed them: 4.6e-2 apart). The compiled instance is the
    one that trained, and `model.optimizer` after `fit`."""
    made = []
    _, ours = parity.compare(_normed(adamw_excluding_the_norm, made), _dataset(), replicas=2,
                             model_dir=tmp_path, epochs=2)
    assert ours.model.optimizer is made[-1]
    assert int(made[-1].iterations.numpy()) == 2 * 6  # 88 examples in batches of 16


class Halving(keras.optimizers.schedules.LearningRateSchedule):
    """The shape of LearningRateSchedule's own docstring example: no get_config."""

    def __init__(self, initial_learning_rate):
        self.initial_learning_rate = initial_learning_rate

    def __call__(self, step):
        return self.initial_learning_rate / (1.0 + keras.ops.cast(step, "float32") / 3.0)


def test_a_learning_rate_schedule_without_get_config_trains_as_keras(tmp_path):
    parity.compare(_normed(lambda model: keras.optimizers.SGD(Halving(0.5), momentum=0.5)),
                   _dataset(), replicas=2, model_dir=tmp_path, epochs=2)



def _regression(reduction):
    def build():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(loss=keras.losses.MeanSquaredError(reduction=reduction),
                      optimizer=keras.optimizers.SGD(0.02), metrics=["mae"])
        return model
    return build


def _weighted(n, seed):
    """(x, y as floats, sample weights in [0.5, 2)) in batches of BATCH, the last partial."""
    x, y = parity.data(n, seed)
    w = np.random.RandomState(seed + 7).uniform(0.5, 2.0, n).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y.astype("float32"), w)).batch(BATCH)


@pytest.mark.parametrize("reduction", ["sum", "mean_with_sample_weight", None])
def test_a_loss_reduction_trains_and_logs_as_keras(tmp_path, reduction):
    """`MeanSquaredError(reduction=...)` with sample weights and a partial
    last batch split unevenly over the replicas (5 rows: 3 and 2; validation
    the same): the weights and every log
    (`loss`, `val_loss`) within 1e-6 of Keras's fit on 2 replicas. "sum"
    differentiates the sum (no division by the batch), "mean_with_sample_weight"
    divides by the summed weights, None trains as "sum" and logs what Keras
    logs (its mean, times the replicas)."""
    parity.compare(_regression(reduction), _weighted(5 * BATCH + 5, 0), replicas=2,
                   model_dir=tmp_path, epochs=2, validation_data=_weighted(2 * BATCH + 5, 1))


def test_reduction_none_with_model_losses_is_refused_in_one_line(tmp_path):
    """Keras adds the model losses to every value of an unreduced loss (a
    gradient `held` times the regularizer's): refused, naming the way out."""
    def build():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(
            1, kernel_regularizer=keras.regularizers.L2(0.01))])
        model.compile(loss=keras.losses.MeanSquaredError(reduction=None), optimizer="sgd")
        return model

    with pytest.raises(tfloop.ConfigError, match=r"^fit: the compiled loss has reduction=None "
                       r"and the model has model losses .*reduction=\"sum\""):
        parity.run_tfloop(build, _weighted(EXAMPLES, 0), model_dir=tmp_path, epochs=1)


@pytest.fixture
def global_policy():
    """Sets Keras's global dtype policy for one test, float32 again after it."""
    try:
        yield keras.mixed_precision.set_global_policy
    finally:
        keras.config.set_dtype_policy("float32")


def _mixed():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2),
                              keras.layers.Activation("linear", dtype="float32")])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(0.5), metrics=["accuracy"])
    return model


@pytest.fixture(scope="module")
def keras_mixed_float16():
    """Keras's fit of `_mixed` under a global mixed_float16 policy (2
    replicas, 2 epochs, `_dataset()`), made once per module and worker: the
    Keras side of both mixed_float16 cases below, which only read it (its
    History, weights and model's optimizer). The policy is restored after it."""
    previous = keras.config.dtype_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        return parity.run_keras(_mixed, _dataset(), replicas=2, epochs=2)
    finally:
        keras.config.set_dtype_policy(previous)


@pytest.mark.xdist_group("keras_objects_keras_mixed_float16")
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_a_global_dtype_policy_is_the_runs_as_keras_honours_it(tmp_path, global_policy, policy,
                                                                keras_mixed_float16):
    """`keras.mixed_precision.set_global_policy(...)` at the top of the
    script (Keras's mixed precision guide): the model computes in float16
    (bfloat16), under mixed_float16 with the LossScaleOptimizer Keras's
    `compile` made (not wrapped twice), as Keras's fit trains it: logs and
    weights within 1e-3; run.json's range says the precision. Keras's side
    under mixed_float16 is the module's `keras_mixed_float16` (the same fit
    as test_run_config_mixed_precision_wins_over_the_global_policy's)."""
    global_policy(policy)
    if policy == "mixed_float16":
        theirs = keras_mixed_float16
    else:
        theirs = parity.run_keras(_mixed, _dataset(), replicas=2, epochs=2)
    ours = parity.run_tfloop(_mixed, _dataset(), model_dir=tmp_path, replicas=2, epochs=2)
    parity.assert_same(theirs, ours, rtol=1e-3, atol=1e-4)  # as parity.compare asserts
    assert ours.model.layers[0].compute_dtype == policy.split("_")[1]
    optimizer = ours.model.optimizer
    if policy == "mixed_float16":
        assert isinstance(theirs.model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        assert isinstance(optimizer.inner_optimizer, keras.optimizers.SGD)
    else:
        assert isinstance(optimizer, keras.optimizers.SGD)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["ranges"][-1]["mixed_precision"] == policy


@pytest.mark.xdist_group("keras_objects_keras_mixed_float16")
def test_run_config_mixed_precision_wins_over_the_global_policy(tmp_path, global_policy,
                                                                keras_mixed_float16):
    """`RunConfig(mixed_precision="mixed_float16")` (`bin/train
    --mixed_precision`) over a global mixed_bfloat16: float16 with one
    LossScaleOptimizer (Keras's `compile`, under the policy the engine sets
    for the model, made it; the engine does not wrap it again), as Keras's
    fit under mixed_float16 (the module's `keras_mixed_float16`), within 1e-3."""
    theirs = keras_mixed_float16
    global_policy("mixed_bfloat16")
    ours = parity.run_tfloop(_mixed, _dataset(), model_dir=tmp_path, replicas=2, epochs=2,
                             config_overrides={"mixed_precision": "mixed_float16"})
    parity.assert_same(theirs, ours, rtol=1e-3, atol=1e-4)
    assert ours.model.layers[0].compute_dtype == "float16"
    assert isinstance(ours.model.optimizer.inner_optimizer, keras.optimizers.SGD)
    assert keras.config.dtype_policy().name == "mixed_bfloat16"  # the script's, restored


def test_clipnorm_clips_the_all_reduced_gradient_as_one_device(tmp_path):
    """`SGD(clipnorm=...)`: the engine hands the optimizer the all-reduced
    gradient, so tfloop on 2 replicas trains as Keras's fit on one device
    (within 1e-6); Keras's fit on 2 replicas clips each replica's gradient
    before their sum, and ends elsewhere (a documented difference)."""
    clipped = _normed(lambda model: keras.optimizers.SGD(0.5, clipnorm=0.1))
    one_device = parity.run_keras(clipped, _dataset(), replicas=1, epochs=2)
    ours = parity.run_tfloop(clipped, _dataset(), model_dir=tmp_path, replicas=2, epochs=2)
    parity.assert_same(one_device, ours)
    per_replica = parity.run_keras(clipped, _dataset(), replicas=2, epochs=2)
    apart = max(float(np.max(np.abs(a - b))) for (_, a), (_, b)
                in zip(per_replica.weights, ours.weights))
    assert apart > 1e-2, apart


@pytest.mark.parametrize("setting", [dict(gradient_accumulation_steps=2),
                                     dict(use_ema=True, ema_overwrite_frequency=3)])
def test_optimizer_updates_inside_a_cond_are_refused_under_mirrored_in_one_line(tmp_path,
                                                                                setting):
    """Keras puts these updates in a `tf.cond` whose branches `merge_call`:
    Keras's own fit under MirroredStrategy fails there (measured, 1 and 2
    replicas) with a long traceback; tfloop names the setting in one line
    (the default and one-device strategies train them)."""
    name = next(iter(setting)) if len(setting) == 1 else "ema_overwrite_frequency"
    build = _normed(lambda model: keras.optimizers.SGD(0.5, **setting))
    with pytest.raises(tfloop.ConfigError, match=rf"^the optimizer's {name}=\d+ updates inside "
                       r"a tf.cond, which MirroredStrategy cannot run"):
        parity.run_tfloop(build, _dataset(), model_dir=tmp_path, replicas=2, epochs=1)

class Classify(tfloop.Task):
    """`normed_model()` on the first 64 examples of `parity.data`, in global
    batches, its loss Keras's SparseCategoricalCrossentropy per example."""

    def build_model(self):
        return normed_model()

    def train_dataset(self, context):
        return tf.data.Dataset.from_tensor_slices(parity.data(64)).batch(
            context.global_batch_size, drop_remainder=True).repeat()

    def loss(self, model, batch, *, training):
        x, y = batch
        return tfloop.LossOutput(per_example_loss=keras.losses.sparse_categorical_crossentropy(
            y, model(x, training=training), from_logits=True))


def adamw_on_a_schedule(model=None):
    optimizer = keras.optimizers.AdamW(Halving(0.05), weight_decay=0.5)
    optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
    return optimizer


def test_run_trains_the_optimizer_object_made_outside_the_scope_as_given(tmp_path):
    """`run(config, optimizer=...)` with an optimizer made outside any
    strategy scope (its step counter and rate already made): that instance
    trains on 2 replicas, its schedule object (no get_config) and its
    weight-decay exclusions kept: the weights of Keras's fit with the same
    optimizer made in its scope, within 1e-6."""
    optimizer = adamw_on_a_schedule()
    config = parity.config(tmp_path, replicas=2, global_batch_size=16, train_steps=8,
                           mode="train", export=False)
    result = tfloop.run(config, task=Classify(), optimizer=optimizer)
    assert int(optimizer.iterations.numpy()) == 8
    theirs = parity.run_keras(_normed(adamw_on_a_schedule), parity.dataset(64, 16), replicas=2,
                              epochs=2)
    ours = [np.asarray(v.numpy()) for v in result.model.weights]
    assert len(ours) == len(theirs.weights)
    for a, (name, b) in zip(ours, theirs.weights):
        np.testing.assert_allclose(a, b, rtol=parity.RTOL, atol=parity.ATOL, err_msg=name)


def test_run_refuses_an_optimizer_built_for_other_variables_in_one_line(tmp_path):
    """A built optimizer has slots for the variables it was built for: it
    cannot train the run's model, and no copy would keep its state."""
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build([keras.Variable(np.zeros(3, "float32"))])
    config = parity.config(tmp_path, replicas=2, global_batch_size=16, train_steps=1,
                           mode="train", export=False)
    with pytest.raises(tfloop.ConfigError, match=r"^the optimizer 'adam(_\d+)?' \(Adam\) was built for "
                       r"other variables under another strategy .*pass a new, unbuilt one"):
        tfloop.run(config, task=Classify(), optimizer=optimizer)
