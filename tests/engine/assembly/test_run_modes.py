"""Each run mode is one method of the runner, selected once from the plan's mode."""

from tfloop.engine import config
from tfloop.engine.assembly import runner


def test_every_mode_a_run_can_be_in_has_its_method():
    modes = runner.MODES
    assert set(modes) == set(config.RUN_MODES)
    assert set(config.MODES) < set(config.RUN_MODES)  # the evaluator's mode is no --mode value
    assert modes["train"] is modes["train_and_evaluate"] is runner.Runner.train
