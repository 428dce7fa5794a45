"""`engine.recipe.schedules`: the learning rate of each global step, in the formula and
in real runs (the rate each step used, exact resume, linear scaling, a changed
flag on resume), and the recipe flags' refusals."""

import logging
import math

import numpy as np
import pytest
import tensorflow as tf

from tfloop.engine.recipe import schedules
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.run import run

PEAK, END, TOTAL = 0.5, 0.01, 100
BOUNDARIES, RATE, POWER = (30, 60), 0.1, 2.0


def reference(schedule, step, *, warmup):
    """The documented formulas, in plain Python."""
    if step < warmup:
        return PEAK * step / warmup
    done = min(step - warmup, TOTAL - warmup) / (TOTAL - warmup)
    if schedule == "constant":
        return PEAK
    if schedule == "cosine":
        return END + (PEAK - END) * 0.5 * (1 + math.cos(math.pi * done))
    if schedule == "polynomial":
        return END + (PEAK - END) * (1 - done) ** POWER
    return PEAK * RATE ** sum(1 for b in BOUNDARIES if b <= step)


def _schedule(name, warmup):
    return schedules.LearningRate(
        schedule=name, peak=PEAK, end=END, warmup_steps=warmup, total_steps=TOTAL,
        boundaries=BOUNDARIES if name == "step" else (), decay_rate=RATE, power=POWER,
        base=PEAK)


@pytest.mark.parametrize("warmup", [0, 10])
@pytest.mark.parametrize("name", ["constant", "cosine", "polynomial", "step"])
def test_each_schedule_follows_its_formula(name, warmup):
    schedule = _schedule(name, warmup)
    steps = [0, 5, 10, 29, 30, 55, 60, 99, 100, 150]
    want = [reference(name, s, warmup=warmup) for s in steps]
    eager = [schedule.value(s) for s in steps]
    graph = tf.function(lambda s: tf.map_fn(schedule, s, fn_output_signature=tf.float32))(
        tf.constant(steps, tf.int64)).numpy()
    np.testing.assert_allclose(eager, want, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(graph, eager, rtol=1e-6, atol=1e-9)
    if warmup:
        assert eager[0] == 0.0 and eager[2] == pytest.approx(PEAK)
    assert eager[-1] == pytest.approx(eager[-2])  # beyond the last step: the last step's rate


def test_describe_says_the_schedule_in_one_line():
    assert _schedule("constant", 0).describe() == "learning rate: 0.5"
    assert _schedule("cosine", 10).describe() == (
        "learning rate: warmup 0 -> 0.5 over 10 steps, then cosine to 0.01 at step 100")
    assert _schedule("step", 0).describe() == (
        "learning rate: 0.5, times 0.1 at step(s) 30, 60")
    config = RunConfig(learning_rate=0.1, lr_schedule="cosine", warmup_steps=500,
                       scale_learning_rate="linear", train_steps=10000)
    schedule = schedules.from_config(config.recipe, num_replicas=4, total_steps=10000)
    assert schedule.describe() == (
        "learning rate: warmup 0 -> 0.4 over 500 steps, then cosine to 0 at step 10000 "
        "(0.1 x 4 replicas, --scale_learning_rate=linear)")


def test_linear_scaling_multiplies_peak_and_end_by_the_replicas():
    config = RunConfig(learning_rate=0.1, end_learning_rate=0.01, lr_schedule="polynomial",
                       scale_learning_rate="linear")
    scaled = schedules.from_config(config.recipe, num_replicas=8, total_steps=50)
    assert (scaled.peak, scaled.end) == (pytest.approx(0.8), pytest.approx(0.08))
    assert scaled.value(0) == pytest.approx(0.8) and scaled.value(50) == pytest.approx(0.08)
    plain = schedules.from_config(RunConfig(learning_rate=0.1).recipe, num_replicas=8,
                                  total_steps=50)
    assert plain.peak == pytest.approx(0.1) and "replicas" not in plain.describe()


def test_warmup_that_outlasts_the_run_is_refused():
    with pytest.raises(ConfigError) as caught:
        schedules.from_config(RunConfig(warmup_steps=50).recipe, num_replicas=1, total_steps=50)
    assert "--warmup_steps=50 must be below the run's last step (50)" in str(caught.value)


@pytest.mark.parametrize("flags, message", [
    (dict(lr_schedule="exp"), "--lr_schedule='exp' is not a schedule"),
    (dict(lr_schedule="step"), "--lr_schedule=step needs --lr_decay_steps"),
    (dict(lr_decay_steps="60,30", lr_schedule="step"), "increasing order"),
    (dict(lr_decay_steps="30"), "applies to --lr_schedule=step"),
    (dict(scale_learning_rate="sqrt"), "--scale_learning_rate='sqrt' is not a rule"),
    (dict(warmup_steps=-1), "--warmup_steps=-1 must be 0 or more"),
    (dict(weight_decay=-0.1), "--weight_decay=-0.1 must be 0 or a positive number"),
    (dict(lr_schedule="cosine", end_learning_rate=0.1, learning_rate=0.01),
     "--end_learning_rate=0.1 must be below --learning_rate=0.01"),
])
def test_bad_recipe_flags_are_one_line(flags, message):
    with pytest.raises(ConfigError) as caught:
        RunConfig(**flags)
    assert message in str(caught.value) and "\n" not in str(caught.value)


# --- real runs --------------------------------------------------------------------------


def _config(model_dir, **overrides):
    settings = dict(
        strategy="mirrored", devices="cpu:0,cpu:1,cpu:2,cpu:3", collective="reduce_to_one_device",
        model="mlp", dataset="synthetic", model_dir=str(model_dir), global_batch_size=32,
        train_steps=12, steps_per_loop=4, checkpoint_interval=4, summary_interval=0,
        optimizer="momentum", learning_rate=0.05, lr_schedule="cosine", warmup_steps=6,
        weight_decay=0.01, mode="train", export=False, seed=3,
    )
    settings.update(overrides)
    return RunConfig(**settings)


def _weights(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    names = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith("model_weights/"))
    return {n: reader.get_tensor(n) for n in names}


class _Stop(Exception):
    pass


def _stop_at(step):
    def hook(at, metrics):
        if at >= step:
            raise _Stop()
    return hook


@pytest.mark.compares  # stopped and resumed against uninterrupted (tests/tiers.py)
def test_a_stopped_run_resumes_on_the_schedule_and_a_changed_flag_takes_effect(tmp_path,
                                                                             caplog):
    """Stopped at step 8 (the last checkpoint is ckpt-4, inside the warmup),
    resumed, it ends with the weights of an uninterrupted run: the rate is the
    global step's, restored or not. Then a new --learning_rate takes effect
    from the step the run resumes at, and says so."""
    caplog.set_level(logging.INFO)
    with pytest.raises(_Stop):
        run(_config(tmp_path / "resumed"), on_loop_end=_stop_at(8))
    rates = []
    resumed = run(_config(tmp_path / "resumed"),
                  on_loop_end=lambda at, metrics: rates.append((at, metrics["learning_rate"])))
    assert resumed["start_step"] == 4 and resumed["step"] == 12
    assert "(the flags changed)" not in caplog.text
    run(_config(tmp_path / "straight"))
    got, want = _weights(tmp_path / "resumed"), _weights(tmp_path / "straight")
    assert len(want) == 6
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7)
    schedule = schedules.from_config(_config("x").recipe, num_replicas=4, total_steps=12)
    # Each loop's learning_rate is the rate its last step (global step - 1) used.
    assert rates == [(8, pytest.approx(schedule.value(7))), (12, pytest.approx(schedule.value(11)))]

    caplog.clear()
    changed = run(_config(tmp_path / "resumed", train_steps=14, learning_rate=0.2))
    new = schedules.from_config(_config("x", learning_rate=0.2).recipe, num_replicas=4,
                                total_steps=14)
    assert (f"learning rate {schedule.value(11):g} -> {new.value(12):g} from step 12 "
            "(the flags changed)") in caplog.text
    assert changed["train/learning_rate"] == pytest.approx(new.value(13))


def test_each_step_uses_the_scheduled_rate_under_mixed_float16_and_linear_scaling(tmp_path,
                                                                                caplog):
    """One step per loop: each loop's learning_rate is the rate of that step,
    set on the LossScaleOptimizer's inner optimizer, scaled by the 4 replicas."""
    caplog.set_level(logging.INFO)
    rates = []
    config = _config(tmp_path, train_steps=5, steps_per_loop=1, checkpoint_interval=0,
                     warmup_steps=2, lr_schedule="polynomial", lr_power=2.0,
                     end_learning_rate=0.001, scale_learning_rate="linear",
                     mixed_precision="mixed_float16", weight_decay=0.0)
    result = run(config, on_loop_end=lambda at, metrics: rates.append(metrics["learning_rate"]))
    want = [0.0, 0.1, 0.2, 0.2 * (1 - 1 / 3) ** 2 + 0.004 * (1 - (1 - 1 / 3) ** 2),
            0.2 * (1 / 3) ** 2 + 0.004 * (1 - (1 / 3) ** 2)]
    np.testing.assert_allclose(rates, want, rtol=1e-6)
    assert result["train/learning_rate"] == pytest.approx(want[-1])
    assert ("learning rate: warmup 0 -> 0.2 over 2 steps, then polynomial (power 2) to 0.004 "
            "at step 5 (0.05 x 4 replicas, --scale_learning_rate=linear)") in caplog.text


def test_recipe_flags_with_only_caller_optimizers_are_refused(tmp_path):
    """An optimizer object sets its own rate and decay: flags that would be
    ignored are one line, and nothing is written."""
    import keras

    config = _config(tmp_path / "run", weight_decay=0.0)
    with pytest.raises(ConfigError) as caught:
        run(config, optimizer=keras.optimizers.SGD(0.1))
    assert str(caught.value).startswith("--lr_schedule=cosine, --warmup_steps=6: every "
                                        "objective of ClassificationTask trains with an "
                                        "optimizer object")
    assert not (tmp_path / "run").exists()
