"""NaN and Inf never reach a checkpoint: a non-finite loss, gradient norm or
weight stops the run at the end of its loop, naming the steps, before any
save, evaluation or export; `--nan_policy=skip_step` skips such steps
instead (every replica alike) and stops after `--nan_max_skips` in a row."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from fakes import FakeTrainer, step_variable
from helpers import REPO, assert_one_line_error, run_bin
from tfloop import collectives
from tfloop.engine.run_dir import checkpointing
from tfloop.engine.loop.actions import StopOnSignal
from tfloop.engine.config import RunConfig
from tfloop.engine.loop.controller import Controller
from tfloop.engine.errors import ConfigError, NonFinite
from tfloop.engine.task.losses import LossOutput
from tfloop.engine.loop.preemption import StopRequest
from tfloop.engine.assembly.run import run
from tfloop.engine.assembly.plan import spec_sections
from tfloop.engine.task import Task
from tfloop.engine.loop.settings import Step
from tfloop.engine.loop.trainer import Trainer

BATCH = 8
FEATURES = 4


def _batches(num, bad=(), value=np.nan):
    """`num` global batches of a linear regression; the batches in `bad` hold `value`."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num, BATCH, FEATURES)).astype(np.float32)
    y = x.sum(axis=-1)
    for index in bad:
        x[index, 0, 0] = value
    return x, y


def _loss(model, batch, *, training):
    x, y = batch
    return LossOutput(per_example_loss=(model(x, training=training)[:, 0] - y) ** 2)


def _trainer(devices, x, y, *, nan_policy="stop", max_skips=10, accumulation_steps=1,
             clip_norm=0.0, learning_rate=0.05):
    keras.utils.set_random_seed(1)
    strategy = (tf.distribute.MirroredStrategy(devices) if len(devices) > 1
                else tf.distribute.OneDeviceStrategy(devices[0]))
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(learning_rate)
        step = tf.Variable(0, dtype=tf.int64, trainable=False,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    trainer = Trainer(
        strategy=strategy, model=model, optimizer=optimizer, loss_fn=_loss,
        collective=collectives.create("reduce_to_one_device", devices=devices),
        train_dataset=dataset, global_batch_size=BATCH, global_step=step,
        options=Step(nan_policy=nan_policy, nan_max_skips=max_skips,
                     accumulation_steps=accumulation_steps, clip_norm=clip_norm))
    return trainer, model, optimizer, strategy


def _replica_copies(strategy, model):
    return [[c.numpy() for c in strategy.experimental_local_results(v)]
            for v in model.trainable_variables]


def test_a_nan_loop_raises_naming_its_steps_before_returning(cpu_devices):
    x, y = _batches(6, bad=[4])
    trainer, model, _, _ = _trainer(cpu_devices[:2], x, y)
    trainer.train(3)
    with pytest.raises(NonFinite, match=r"loss nan, grad_norm nan in steps 4\.\.6") as error:
        trainer.train(3)
    assert "--nan_policy=skip_step" in str(error.value) and "\n" not in str(error.value)


def test_an_update_that_overflows_the_weights_is_caught_at_the_loop_end(cpu_devices):
    x, y = _batches(2)
    # Gradients of about 1e4 (finite, as is the loss) times the rate: beyond float32.
    trainer, model, _, _ = _trainer(cpu_devices[:1], x * 100, y * 100, learning_rate=1e38)
    with pytest.raises(NonFinite, match="weights became non-finite in step 1 while the loss"):
        trainer.train(1)


@pytest.mark.parametrize("accumulation_steps, clip_norm", [(1, 0.0), (2, 0.5)],
                         ids=["plain", "accumulation_and_clipping"])
def test_skip_step_applies_every_finite_step_and_no_other(cpu_devices, accumulation_steps,
                                                          clip_norm):
    """SGD over batches 0,1,(NaN),3,4 with the NaN step skipped = SGD over 0,1,3,4."""
    x, y = _batches(5, bad=[2])
    skipping, model, optimizer, strategy = _trainer(
        cpu_devices, x, y, nan_policy="skip_step", accumulation_steps=accumulation_steps,
        clip_norm=clip_norm)
    metrics = skipping.train(5)
    assert metrics["skipped_steps"] == 1 and np.isfinite(metrics["loss"])
    assert int(optimizer.iterations.numpy()) == 4 and int(skipping.global_step.numpy()) == 5
    keep = [0, 1, 3, 4]
    reference, reference_model, _, _ = _trainer(
        cpu_devices, x[keep], y[keep], accumulation_steps=accumulation_steps,
        clip_norm=clip_norm)
    reference.train(4)
    for copies, expected in zip(_replica_copies(strategy, model),
                                reference_model.trainable_variables):
        for copy in copies:  # every replica skipped alike
            np.testing.assert_allclose(copy, expected.numpy(), rtol=1e-6)


def test_skip_step_stops_after_max_skips_in_a_row(cpu_devices):
    x, y = _batches(12, bad=[1, 4, 5, 6, 7, 8, 9, 10, 11])
    trainer, model, _, _ = _trainer(cpu_devices[:2], x, y, nan_policy="skip_step", max_skips=3)
    metrics = trainer.train(4)  # step 2 skipped, then a finite one: the count starts again
    assert metrics["skipped_steps"] == 1
    with pytest.raises(NonFinite, match=r"3 steps in a row had non-finite gradients "
                                        r"\(steps 5\.\.7"):
        trainer.train(6)
    assert int(trainer.global_step.numpy()) == 7  # the loop ended at the third
    assert all(np.isfinite(v.numpy()).all() for v in model.trainable_variables)


class _Diverging(FakeTrainer):
    def train(self, num_steps):
        metrics = super().train(num_steps)
        return {**metrics, "gen/grad_norm": float("inf")} if self.step.numpy() > 4 else metrics


def test_the_controller_saves_nothing_after_a_non_finite_loop(tmp_path):
    """Not the stop request's save, not the final one: ckpt-4 stays the newest."""
    step = step_variable()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), str(tmp_path),
                                         max_to_keep=1)
    request = StopRequest()
    request.requested = True  # a SIGTERM arrived during the bad loop
    controller = Controller(global_step=step, trainer=_Diverging(step), steps_per_loop=2,
                            checkpoint_manager=manager, checkpoint_interval=4,
                            train_actions=[StopOnSignal(request=StopRequest(),
                                                        checkpoint_manager=manager)])
    controller.train(4)
    controller.train_actions = (StopOnSignal(request=request, checkpoint_manager=manager),)
    with pytest.raises(NonFinite, match=r"gen/grad_norm inf in steps 5\.\.6: .*stopped without "
                                        r"saving: the newest checkpoint, ckpt-4, is the last good"):
        controller.train(8)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-4")


class _TurnsNaN(Task):
    """A linear regression whose features hold a NaN from step `bad_from` on."""

    def __init__(self, bad_from=6):
        self.bad_from = bad_from

    def build_model(self):
        return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])

    def train_dataset(self, context):
        x, y = _batches(12, bad=range(self.bad_from, 12))
        return tf.data.Dataset.from_tensor_slices((x, y)).skip(context.start_step).repeat()

    def loss(self, model, batch, *, training):
        return _loss(model, batch, training=training)


def test_a_run_that_diverges_keeps_its_last_good_checkpoint_and_exports_nothing(tmp_path):
    model_dir = tmp_path / "run"
    config = RunConfig(strategy="mirrored", devices="cpu:0,cpu:1", model_dir=str(model_dir),
                       global_batch_size=BATCH, train_steps=10, steps_per_loop=2,
                       checkpoint_interval=2, max_checkpoints=1, mode="train",
                       summary_interval=0)
    with pytest.raises(NonFinite, match=r"in steps 7\.\.8: .*the newest checkpoint, ckpt-6, is "
                                        "the last good one"):
        run(config, task=_TurnsNaN(bad_from=6))
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-6")
    reader = tf.train.load_checkpoint(str(model_dir / "ckpt-6"))
    assert all(np.isfinite(reader.get_tensor(name)).all()
               for name in reader.get_variable_to_shape_map() if name.startswith("model_weights"))
    assert not (model_dir / "export").exists()
    assert json.loads((model_dir / "metrics.json").read_text())["interrupted"] is True


def test_bin_train_exits_1_with_one_line_and_the_good_checkpoints_stay(tmp_path):
    model_dir = tmp_path / "run"
    # A rate that is fine for 10 steps, then explodes (x 1e20 at step 10).
    result = run_bin("train", f"--model_dir={model_dir}", "--devices=cpu:0", "--strategy=default",
                     "--optimizer=sgd", "--learning_rate=0.01", "--lr_schedule=step",
                     "--lr_decay_steps=10", "--lr_decay_rate=1e20", "--train_steps=30",
                     "--steps_per_loop=5", "--checkpoint_interval=5", "--max_checkpoints=1",
                     "--global_batch_size=32", "--mode=train")
    assert_one_line_error(result, contains="stopped without saving: the newest checkpoint, "
                                           "ckpt-10, is the last good one")
    assert result.returncode == 1  # permanent: a restart would resume into the same NaN
    assert "in steps 11..15" in result.stderr
    # The last line names the class (launch/exit_codes.py; bin/cli.with_class).
    assert result.stderr.rstrip().endswith("(exit 1: failed: a restart cannot fix it)")
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-10")
    assert not (model_dir / "export").exists()


@pytest.mark.parametrize("overrides, message", [
    (dict(nan_policy="ignore"), "--nan_policy='ignore' is not a policy"),
    (dict(nan_max_skips=5), "--nan_max_skips=5 applies to --nan_policy=skip_step"),
    (dict(nan_policy="skip_step", nan_max_skips=0), "--nan_max_skips=0 must be a positive"),
])
def test_nan_flag_mistakes_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        RunConfig(**overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_skip_step_under_parameter_servers_is_refused_by_their_spec():
    """A strategy's rule lives in its spec, checked by the plan before anything is built."""
    from tfloop.engine import strategies
    from tfloop.launch.tf_config import Role

    config = RunConfig(nan_policy="skip_step", strategy="parameter_server")
    role = Role("chief", 0, {"chief": ("localhost:1",), "worker": ("localhost:2",),
                             "ps": ("localhost:3",)})
    with pytest.raises(ConfigError) as error:
        strategies.get("parameter_server").check(spec_sections(config), role)
    assert "does not apply to --strategy=parameter_server" in str(error.value)
