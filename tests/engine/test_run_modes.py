"""Each run mode is one function of engine.run, selected once from the plan's mode."""

import sys

import tfloop.engine.assembly.run  # noqa: F401  (the module; `tfloop.engine.assembly.run` the name is the function)
from tfloop.engine import config


def test_every_mode_a_run_can_be_in_has_its_function():
    modes = sys.modules["tfloop.engine.assembly.run"]._MODES
    assert set(modes) == set(config.RUN_MODES)
    assert set(config.MODES) < set(config.RUN_MODES)  # the evaluator's mode is no --mode value
    assert modes["train"] is modes["train_and_evaluate"]
