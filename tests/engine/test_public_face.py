"""`tfloop.engine` answers `tfloop`'s one public face, and lists the rooms that exist."""

import os
import re
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


def test_the_engine_answers_the_one_face():
    import tfloop

    assert engine.__all__ == tfloop.__all__
    assert all(getattr(engine, name) is getattr(tfloop, name) for name in engine.__all__)


def test_the_rooms_listed_are_the_rooms_that_exist():
    """engine/__init__.py's list of rooms went stale once (issue 41): it is
    held here against the packages on disk."""
    root = os.path.dirname(engine.__file__)
    on_disk = {name for name in os.listdir(root)
               if os.path.isfile(os.path.join(root, name, "__init__.py"))}
    listed = set(re.findall(r"^    (\w+)/ ", engine.__doc__, re.MULTILINE))
    assert listed == on_disk
