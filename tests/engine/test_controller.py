"""The Controller: arguments checked at once."""

import pytest

from engine.controller import Controller
from fakes import FakeEvaluator, FakeTrainer, step_variable


def test_what_a_controller_lacks_is_named_when_asked_for():
    step = step_variable()
    evaluate_only = Controller(global_step=step, evaluator=FakeEvaluator(step))
    with pytest.raises(ValueError, match="`trainer` is None"):
        evaluate_only.train(5)
    train_only = Controller(global_step=step, trainer=FakeTrainer(step))
    with pytest.raises(ValueError, match="`evaluator` is None"):
        train_only.evaluate()
    with pytest.raises(ValueError, match="`eval_interval` needs an `evaluator`"):
        train_only.train(5, eval_interval=2)


def _hook(step, metrics):
    pass


@pytest.mark.parametrize("overrides,says", [
    (dict(global_step=5), "`global_step` (5) must be a tf.Variable"),
    (dict(trainer="fit"), "`trainer` ('fit') must be an engine.runner.AbstractTrainer"),
    (dict(evaluator=object), "`evaluator` (<class 'object'>) must be an"),
    (dict(trainer=None), "`trainer` and `evaluator` are both None"),
    (dict(steps_per_loop=0), "`steps_per_loop` (0) must be a positive integer"),
    (dict(steps_per_loop=2.5), "`steps_per_loop` (2.5) must be a positive integer"),
    (dict(checkpoint_interval=-1), "`checkpoint_interval` (-1) must be an integer >= 0"),
    (dict(checkpoint_manager="runs/x"), "`checkpoint_manager` ('runs/x') must be a"),
    (dict(train_actions=[_hook]), "`train_actions` holds <function _hook"),
    (dict(eval_actions=[print]), "`eval_actions` holds <built-in function print>"),
])
def test_bad_arguments_are_refused_at_construction_naming_them(overrides, says):
    step = step_variable()
    arguments = dict(global_step=step, trainer=FakeTrainer(step))
    arguments.update(overrides)
    with pytest.raises(ValueError) as error:
        Controller(**arguments)
    assert says in str(error.value)
    assert "\n" not in str(error.value)
