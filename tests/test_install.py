"""The installed package: one namespace, every package in it, nothing a user's
own files can shadow, and `import tfloop` its whole API.

`pip install .` (no extras) into a fresh folder, then a user's script that sits
beside a `models.py` and an `engine.py` of its own trains through the Python
API, and the console entry point answers `--help`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "collectives", "models", "inputs", "launch", "bench", "bin")


def test_pyproject_installs_every_package_under_the_namespace():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    on_disk = {
        "tfloop." + str(init.parent.relative_to(REPO)).replace(os.sep, ".")
        for top in PACKAGES for init in (REPO / top).rglob("__init__.py")
    }
    assert on_disk | {"tfloop"} == listed, "pyproject.toml's packages must list every package folder"
    assert "tfloop" in listed  # the public face, tfloop/__init__.py
    assert ({f"tfloop.{top}": top for top in PACKAGES} | {"tfloop": "tfloop"}
            == setuptools["package-dir"])
    assert [p.name for p in (REPO / "tfloop").iterdir() if p.name != "__pycache__"] == [
        "__init__.py"]  # the folder holds the face only


USER_MODELS = "def check(*args):\n    raise SystemExit('the user models.py was imported')\n"
USER_ENGINE = "raise SystemExit('the user engine.py was imported')\n"
USER_SCRIPT = """
import json, sys
import tfloop

assert tfloop.__file__.startswith(sys.argv[1]), tfloop.__file__
assert tfloop.engine.__file__.startswith(sys.argv[1]), tfloop.engine.__file__
result = tfloop.run(tfloop.RunConfig(strategy="mirrored", devices="cpu:0,cpu:1", global_batch_size=64,
                       train_steps=20, steps_per_loop=10, checkpoint_interval=0,
                       summary_interval=0, mode="train", model_dir="run"))
print(json.dumps({"step": result["step"], "loss": result["train/loss"]}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """`pip install --no-deps .` into a folder of its own (the dependencies come
    from the test interpreter's environment)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(REPO)], check=True, timeout=300,
                   capture_output=True)
    return target


def test_a_user_script_beside_its_own_models_and_engine_trains(installed, tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "models.py").write_text(USER_MODELS)
    (user / "engine.py").write_text(USER_ENGINE)
    (user / "train_mine.py").write_text(textwrap.dedent(USER_SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(installed), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "train_mine.py", str(installed)], cwd=user,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    last = result.stdout.strip().splitlines()[-1]
    assert '"step": 20' in last
    assert (user / "run" / "ckpt-20.index").exists()


def test_the_console_entry_point_runs_the_installed_binary(installed, tmp_path):
    script = installed / "bin" / "tfloop-train"  # what pip put on PATH
    env = {**os.environ, "PYTHONPATH": str(installed)}

    def run(*args):
        return subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    helped = run("--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "--strategy" in helped.stdout and "--collective" in helped.stdout
    mistaken = run("--strategi=mirrored")
    assert mistaken.returncode == 2
    assert mistaken.stderr.strip().splitlines()[-1].startswith(
        "tfloop-train: error: Unknown command line flag 'strategi'")
    assert "see tfloop-train --help" in mistaken.stderr


def test_the_installed_packages_serve_a_script_run_from_a_checkout(installed):
    """The checkout's tfloop/ (the face's one file) comes first on sys.path when
    run from its root; the installed tfloop/engine, ... are found beside it."""
    code = ("import tfloop, tfloop.engine.config; "
            "print(tfloop.__file__); print(tfloop.engine.config.__file__)")
    env = {**os.environ, "PYTHONPATH": str(installed)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    face, config = out.stdout.split()
    assert face == str(REPO / "tfloop" / "__init__.py")
    assert config.startswith(str(installed)), config
