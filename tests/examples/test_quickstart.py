"""examples/quickstart.py, README's first Python example, runs as written
(`import tfloop` only); run again, it says it trains nothing and how to go on."""

import logging
import os
import runpy

import numpy as np

from helpers import REPO


def test_the_quickstart_runs_as_written_and_a_second_run_says_it_trains_nothing(
        tmp_path, monkeypatch, caplog, capsys):
    monkeypatch.chdir(tmp_path)  # it writes runs/quickstart_regression/ where it runs
    script = os.path.join(REPO, "examples", "quickstart.py")
    first = runpy.run_path(script, run_name="__main__")["result"]
    assert first["step"] == 300 and first["status"] == "finished"
    assert first["eval/loss"] < 0.1  # it learned the linear map
    kinds = [(entry["kind"], entry["step"]) for entry in first.history]
    assert kinds.count(("eval", 300)) == 1 and ("eval", 100) in kinds
    train = [entry for entry in first.history if entry["kind"] == "train"]
    assert train[-1]["step"] == 300 and len(train) >= 3
    assert train[0]["loss"] > train[-1]["loss"] and "mae" in train[-1]
    assert first.model.predict(np.zeros((2, 8), "float32"), verbose=0).shape == (2, 1)
    assert "step 300: eval loss" in capsys.readouterr().out

    with caplog.at_level(logging.WARNING, logger="tfloop.engine.assembly.run"):
        again = runpy.run_path(script, run_name="__main__")["result"]
    assert again["step"] == 300 and [e["kind"] for e in again.history] == ["eval"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and r.name == "tfloop.engine.assembly.run"]
    assert len(warned) == 1, warned
    assert warned[0].startswith("runs/quickstart_regression already holds step 300 "
                                "(train_steps=300): nothing to train; to train more raise "
                                "train_steps"), warned[0]
    assert "to start fresh give another model_dir" in warned[0]


def test_readme_shows_the_quickstart_as_it_is():
    """README's first Python block is examples/quickstart.py's code, so the
    example a reader copies is the one this file runs."""
    readme = open(os.path.join(REPO, "README.md")).read()
    block = readme.split("```python\n", 1)[1].split("```\n", 1)[0]
    code = open(os.path.join(REPO, "examples", "quickstart.py")).read()
    assert block == code[code.index("import keras"):]
