"""tfloop.bench.training and bench.sweep: what bin/bench_train refuses before timing
anything, and the arguments a device-count sweep passes on. The end-to-end run
of the binary is tests/bin/test_bench_train.py."""

import pytest

from tfloop.bench import sweep, training
from tfloop.bench.variants import VARIANTS
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
    assert training.TrainBenchConfig().variants == VARIANTS


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
