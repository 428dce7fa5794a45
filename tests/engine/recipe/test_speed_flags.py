"""Speed flags train correctly: XLA, mixed precision, tf.data options, profiler.

Correctness only; their speed is measured by bin/bench_train.
"""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfloop import collectives
from tfloop import inputs
from tfloop import models
from tfloop.engine.recipe import precision
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.run import run
from tfloop.engine.loop.settings import Step
from tfloop.engine.loop.trainer import Trainer

GLOBAL_BATCH = 64


def _trainer(devices, *, jit_compile=False, policy="float32", optimizer=None,
             batch=GLOBAL_BATCH):
    splits = inputs.load("synthetic", seed=3)
    keras.utils.set_random_seed(3)
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        with precision.model_policy(policy):
            net = models.build("mlp")
        opt = precision.wrap_optimizer((optimizer or (lambda: keras.optimizers.SGD(0.1)))(), policy)
        step = tf.Variable(0, dtype=tf.int64, trainable=False,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    trainer = Trainer(
        strategy=strategy, model=net, optimizer=opt,
        collective=collectives.create("reduce_to_one_device", devices=devices),
        train_dataset=inputs.train_batches(splits.train, global_batch_size=batch, seed=3),
        global_batch_size=batch, global_step=step, options=Step(jit_compile=jit_compile),
    )
    return trainer, net, opt


@pytest.mark.compares  # two trainers trained to compare (tests/tiers.py)
def test_xla_agrees_with_the_plain_step(cpu_devices):
    plain, plain_net, _ = _trainer(cpu_devices[:2])
    xla, xla_net, _ = _trainer(cpu_devices[:2], jit_compile=True)
    initial = [v.numpy() for v in xla_net.trainable_variables]
    plain_losses = [plain.train(3)["loss"] for _ in range(2)]
    xla_losses = [xla.train(3)["loss"] for _ in range(2)]
    assert xla_losses[1] < xla_losses[0]
    np.testing.assert_allclose(xla_losses, plain_losses, rtol=1e-5)
    # Stated tolerance: 1e-4 of each variable's largest magnitude after 6 SGD
    # steps (measured ~1e-6: XLA fuses and reorders float32 sums); training
    # moved the weights by far more than that.
    for a, b, start in zip(plain_net.trainable_variables, xla_net.trainable_variables, initial):
        a, b = a.numpy(), b.numpy()
        assert np.max(np.abs(a - b)) <= 1e-4 * np.max(np.abs(a))
    moved = max(np.max(np.abs(v.numpy() - s)) for v, s in zip(xla_net.trainable_variables, initial))
    assert moved > 1e-3


@pytest.mark.parametrize("policy,compute", [("mixed_float16", "float16"),
                                            ("mixed_bfloat16", "bfloat16")])
def test_mixed_precision_keeps_float32_master_weights_and_trains(cpu_devices, policy, compute):
    # float16 arithmetic is emulated on CPUs (~100x slower than float32 here):
    # a small batch keeps this test quick; GPUs are where mixed_float16 pays.
    trainer, net, opt = _trainer(cpu_devices[:2], policy=policy, batch=16,
                                 optimizer=lambda: keras.optimizers.Adam(1e-2))
    assert keras.config.dtype_policy().name == "float32"  # the policy did not leak
    assert all(layer.compute_dtype == compute for layer in net.layers)
    assert net.outputs[0].dtype == compute  # the logits; the loss casts them to float32
    assert all(v.dtype == "float32" for v in net.trainable_variables)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer) == (policy == "mixed_float16")
    losses = [trainer.train(4)["loss"] for _ in range(3)]
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(v.dtype == "float32" for v in net.trainable_variables)
    applied = int(opt.iterations.numpy())  # one update per step, not per replica
    if policy == "mixed_float16":
        # The dynamic scale starts at 2**15; a step whose scaled gradients
        # overflow is skipped and the scale halved, on every replica alike.
        skipped = 12 - applied
        assert 0 <= skipped <= 3
        assert float(opt.dynamic_scale.numpy()) == 2.0 ** (15 - skipped)
    else:
        assert applied == 12


def test_mixed_float16_run_checkpoints_the_loss_scale_and_resumes(tmp_path):
    config = dict(devices="cpu:0,cpu:1", collective="reduce_to_one_device", model_dir=str(tmp_path),
                  global_batch_size=8, steps_per_loop=3, checkpoint_interval=0, learning_rate=1e-2,
                  summary_interval=0, mode="train", mixed_precision="mixed_float16", seed=1)
    first = run(RunConfig(train_steps=6, **config))
    reader = tf.train.load_checkpoint(str(tmp_path))
    assert any("dynamic_scale" in name for name in reader.get_variable_to_shape_map())
    assert all(reader.get_variable_to_dtype_map()[n] == tf.float32
               for n in reader.get_variable_to_shape_map() if n.startswith("model_weights/"))
    second = run(RunConfig(train_steps=9, **config))
    assert second["resumed_from"].endswith("ckpt-6") and second["step"] == 9
    assert np.isfinite(second["train/loss"])


def test_profile_steps_cut_loops_and_write_a_trace(tmp_path):
    loops = []
    run(RunConfig(devices="cpu:0", strategy="one_device", model_dir=str(tmp_path),
                  global_batch_size=32, train_steps=9, steps_per_loop=100,
                  checkpoint_interval=0, summary_interval=0, mode="train",
                  profile_steps="3,6"),
        on_loop_end=lambda step, metrics: loops.append(step))
    assert loops == [3, 6, 9]
    traces = glob.glob(str(tmp_path / "summaries" / "train" / "plugins" / "profile" / "*" /
                           "*.xplane.pb"))
    assert len(traces) == 1 and os.path.getsize(traces[0]) > 0


@pytest.mark.parametrize("field,value,says", [
    ("profile_steps", "10", "two integers"),
    ("profile_steps", "a,b", "two integers"),
    ("profile_steps", "20,10", "0 <= A < B"),
    ("profile_steps", "5,5", "0 <= A < B"),
    ("mixed_precision", "float16", "mixed_float16"),
])
def test_bad_speed_flag_values_are_one_line_errors(field, value, says):
    with pytest.raises(ConfigError, match=says) as error:
        RunConfig(**{field: value})
    assert "\n" not in str(error.value)


def test_non_deterministic_pipeline_keeps_the_batch_order():
    """Exact resume needs the step → batch mapping fixed even when
    `--deterministic` is off and stages may run out of order."""
    splits = inputs.load("synthetic", seed=0)

    def first_batches(deterministic):
        ds = inputs.train_batches(splits.train, global_batch_size=128, seed=0,
                                  deterministic=deterministic)
        return [y.numpy() for _, y in ds.take(8)]

    fast, ordered = first_batches(False), first_batches(True)
    assert all(np.array_equal(a, b) for a, b in zip(fast, ordered))
    assert first_batches(False)[0].shape == (128,)
