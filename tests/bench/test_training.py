"""tfloop.bench.training and bench.sweep: what bin/bench_train refuses before timing
anything, and the arguments a device-count sweep passes on. The end-to-end run
of the binary is tests/bin/test_bench_train.py."""

import numpy as np
import pytest
import tensorflow as tf

from tfloop import inputs
from tfloop.bench import input_pipeline, sweep, training
from tfloop.bench.variants import DEFAULT_VARIANTS, VARIANTS
from tfloop.engine.errors import ConfigError

NAMES = dict(variants=VARIANTS, mixed_precision="float32", model="mlp", optimizer="adam")


@pytest.mark.parametrize("override, message", [
    (dict(variants=("engine", "fitt")), "--variants: fitt is not a variant; choose from: engine"),
    (dict(mixed_precision="float8"), "--mixed_precision='float8' is not a policy"),
    (dict(model="resnet"), "--model='resnet' is not a model"),
    (dict(optimizer="adagrad"), "is not an optimizer"),
])
def test_unknown_names_are_refused(override, message):
    with pytest.raises(ValueError) as error:  # each package's own user error
        training.check_names(**{**NAMES, **override})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_config_refuses_non_positive_counts():
    with pytest.raises(ConfigError, match="--steps=0 must be a positive integer"):
        training.TrainBenchConfig(steps=0)


def test_device_counts():
    assert sweep.parse_device_counts(["1", "2", "4"], global_batch_size=32) == [1, 2, 4]
    with pytest.raises(ConfigError, match="--device_counts=1,x is not a list of integers"):
        sweep.parse_device_counts(["1", "x"], global_batch_size=32)
    with pytest.raises(ConfigError, match="--device_counts: 3 must be positive and divide "
                                          "--global_batch_size=32"):
        sweep.parse_device_counts(["1", "3"], global_batch_size=32)


def test_each_sweep_run_sets_its_own_devices_and_output_dir():
    argv = ["--devices=cpu:0,cpu:1", "--device_counts=1,2", "--steps=3", "--output_dir=x",
            "--model=cnn"]
    assert sweep.child_args(argv) == ["--steps=3", "--model=cnn"]


def test_of_measured_matmul_is_left_out_for_a_row_in_another_dtype():
    """The measured rate is float32's: a mixed_float16 row over it read 356%
    on an H200, so that row gets none; a float32 row keeps its fraction."""
    config = training.TrainBenchConfig(mixed_precision="mixed_float16")
    plain = training.VariantRow("engine", "engine", seconds=[1.0], examples_per_rep=100)
    mixed = training.VariantRow("engine+features", "engine + mixed", seconds=[0.5],
                                examples_per_rep=100)
    result = training.TrainBenchResult(config=config, rows=[plain, mixed], matmul_gflops=1.0,
                                       train_flops_per_example=1e6, machine="test")
    assert result.peak_fraction(plain) == pytest.approx(0.1)
    assert result.peak_fraction(mixed) is None


def test_the_default_variants_are_the_loops_side_by_side():
    """`input` and `step` are asked for (`--variants=input,step,engine`), not timed by default."""
    assert training.TrainBenchConfig().variants == DEFAULT_VARIANTS
    assert set(DEFAULT_VARIANTS) < set(VARIANTS) and {"input", "step"} <= set(VARIANTS)


@pytest.mark.parametrize("input_rate, step_rate, bound, says", [
    (300.0, 1000.0, "input", "the INPUT bounds this run (0.30x the step). Feeding the step "
                             "takes about 7 cores at this rate per core (this machine gives 2)"),
    (1050.0, 1000.0, "neither", "within 10% (1.05x)"),
    (4000.0, 1000.0, "step", "the STEP bounds this run (the pipeline keeps up 4.0x over)"),
])
def test_the_verdict_names_what_bounds_the_run(input_rate, step_rate, bound, says):
    rows = [training.VariantRow("input", "input", seconds=[100 / input_rate], examples_per_rep=100),
            training.VariantRow("step", "step", seconds=[100 / step_rate], examples_per_rep=100),
            training.VariantRow("engine", "engine", seconds=[1.0], examples_per_rep=100)]
    verdict = input_pipeline.verdict(rows, cores_used=2)
    assert verdict.bound == bound and says in verdict.line()
    assert verdict.per_core == pytest.approx(input_rate / 2)
    assert "\n" not in verdict.line()
    # Without both rows there is nothing to compare (the engine row is the two together).
    assert input_pipeline.verdict(rows[1:], cores_used=2) is None
    assert input_pipeline.verdict([r.__dict__ for r in rows[::2]], cores_used=2) is None
    # The engine row (1 s for 100: 100/s) under either alone: they share the cores.
    assert "together 100 examples/s, under either alone" in verdict.line()
    faster = [rows[0], rows[1], training.VariantRow("engine", "engine", seconds=[100 / min(
        input_rate, step_rate)], examples_per_rep=100)]
    assert "together" not in input_pipeline.verdict(faster, cores_used=2).line()


def test_the_input_variant_pulls_the_runs_own_pipeline(tmp_path):
    """What `input` times is the pipeline bin/train builds for the same flags:
    uint8 global batches in the order the run with that seed trains on, read
    from a pipeline of its own (two builds give the same batches)."""
    config = training.TrainBenchConfig(devices=("/cpu:0", "/cpu:1"), global_batch_size=16,
                                       dataset="synthetic", seed=3)
    benched = input_pipeline.run_pipeline(training.run_config(config, str(tmp_path)))
    again = input_pipeline.run_pipeline(training.run_config(config, str(tmp_path)))
    splits = inputs.load("synthetic", seed=3)
    run_own = inputs.train_batches(splits.train, global_batch_size=16, seed=3,
                                   image_dtype="uint8")
    for ours, twin, theirs in zip(benched.take(3), again.take(3), run_own.take(3)):
        assert ours[0].dtype == tf.uint8 and ours[0].shape[0] == 16
        for a, b, c in zip(ours, twin, theirs):
            np.testing.assert_array_equal(a.numpy(), c.numpy())
            np.testing.assert_array_equal(b.numpy(), c.numpy())
    assert len(input_pipeline.time_batches(benched, steps=2, repetitions=2, warmup=1)) == 2
