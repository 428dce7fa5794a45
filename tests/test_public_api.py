"""`import tfloop` is the whole API: its names, its cost, RunConfig's documentation."""

import dataclasses
import pydoc
import subprocess
import sys

import tfloop


def test_every_public_name_resolves_to_the_engine_object():
    from tfloop.engine.config import RunConfig
    from tfloop.engine.assembly.run import run
    from tfloop.engine.task import Task

    for name in tfloop.__all__:
        assert getattr(tfloop, name) is not None, name
    assert tfloop.run is run and tfloop.RunConfig is RunConfig and tfloop.Task is Task
    assert {"run", "RunConfig", "RunResult", "Task", "Objective", "LossOutput", "Gradients",
            "ReplicaStep", "ArrayData", "from_npz", "RecordData", "InputContext",
            "ConfigError", "RunFailure", "StopTraining"} <= set(tfloop.__all__)


def test_only_the_public_names_and_the_packages_show():
    shown = set(dir(tfloop))
    assert shown == set(tfloop.__all__) | {"engine", "inputs", "models", "collectives",
                                           "launch", "bench", "bin"}
    assert not [name for name in vars(tfloop) if not name.startswith("_")
                and name not in tfloop.__all__ and name not in shown]


def test_import_tfloop_loads_nothing_and_run_config_no_tensorflow():
    """`import tfloop` imports no module of the engine; `tfloop.RunConfig` (bin/
    builds its flags from it) loads no TensorFlow."""
    code = ("import sys, tfloop; loaded = sorted(m for m in sys.modules if m.startswith('tfloop'));"
            "tfloop.RunConfig; print(loaded, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "['tfloop'] False", out.stdout + out.stderr[-2000:]


def _words(text):
    return " ".join(word for word in text.split() if word != "|")  # pydoc's margin too


def test_every_run_config_field_is_documented_from_its_flag_help():
    text = _words(pydoc.render_doc(tfloop.RunConfig, renderer=pydoc.plaintext))
    for field in dataclasses.fields(tfloop.RunConfig):
        assert f"{field.name}: {field.type} = {field.default!r}" in text, field.name
        assert _words(field.metadata["help"]) in text, field.name
