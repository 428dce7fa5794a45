"""`tfloop.engine`'s public face: what a user's script imports, and only that."""

import subprocess
import sys

import tfloop.engine as engine
import tfloop.engine.assembly.run  # noqa: F401  (the module of the same name as the function)


def test_every_public_name_resolves():
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
    assert {"run", "RunConfig", "Task", "LossOutput", "Objective", "RunResult",
            "ClassificationTask", "export_checkpoint", "Controller", "Trainer",
            "Evaluator", "StopTraining", "ConfigError", "RunFailure"} <= set(engine.__all__)


def test_run_is_the_function_even_after_its_module_was_imported():
    from tfloop.engine import run
    from tfloop.engine.assembly.run import run as the_function

    assert run is the_function and callable(run)
    assert sys.modules["tfloop.engine.assembly.run"].run is run


def test_importing_the_config_does_not_load_tensorflow():
    """bin/ builds its flags from RunConfig before TensorFlow loads (it takes seconds)."""
    code = ("import sys, tfloop.engine, tfloop.engine.config; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
