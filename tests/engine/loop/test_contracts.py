"""The runner contract: each runner declares it, and an incomplete one cannot be built."""

import pytest

from tfloop.engine.loop.evaluator import Evaluator
from tfloop.engine.loop.ps_trainer import ParameterServerTrainer
from tfloop.engine.loop.contracts import AbstractEvaluator, AbstractTrainer
from tfloop.engine.loop.trainer import Trainer


def test_the_engines_runners_declare_the_contract():
    assert issubclass(Trainer, AbstractTrainer)
    assert issubclass(ParameterServerTrainer, AbstractTrainer)
    assert issubclass(Evaluator, AbstractEvaluator)


def test_a_runner_without_its_method_cannot_be_built():
    class NoTrain(AbstractTrainer):
        def evaluate(self, num_steps=-1):
            return {}

    class NoEvaluate(AbstractEvaluator):
        def train(self, num_steps):
            return {}

    for incomplete in (NoTrain, NoEvaluate):
        with pytest.raises(TypeError, match="abstract"):
            incomplete()
