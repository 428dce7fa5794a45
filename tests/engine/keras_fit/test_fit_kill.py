"""`fit` killed with SIGKILL and run again (issue 31 item 11, issue 29 item 9).

The script (kill_fit.py) kills itself as its third epoch begins: after the
second epoch's end was told to the callbacks (CSVLogger wrote its row).
With fit's default (a checkpoint at least every epoch) the run again resumes
at that epoch's end, not at step 0; with checkpoints every 3 steps the last
one is inside the second epoch (step 6), so the run again retrains steps 6-8
and must not write that epoch's row a second time, nor drop the rows before
(CSVLogger's default `append=False`). Every row is the uninterrupted run's.
"""

import csv
import json
import os

import numpy as np
import pytest

from helpers import bin_env, run_python
from kill_fit import config, dataset, dense
from tfloop.engine import fit

SCRIPT = os.path.join(os.path.dirname(__file__), "kill_fit.py")


def _run(model_dir, log, kill_at, interval):
    return run_python([SCRIPT, str(model_dir), str(log), str(kill_at), str(interval)],
                      timeout=300, env=bin_env(), cwd=os.getcwd())


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run both cases' rows must be: the script's `fit` in
    this process, to its end (fit's default checkpoints: how often it saves
    changes no step it trains, so it is the run of either interval). Read only."""
    return fit(dense, dataset(), epochs=3, verbose=0,
               config=config(str(tmp_path_factory.mktemp("straight")), 0))


@pytest.mark.xdist_group("test_fit_kill_straight")  # `straight` trained once (--dist loadgroup)
@pytest.mark.parametrize("interval, resumes_at", [(0, 8), (3, 6)])
def test_a_killed_fit_resumes_and_logs_each_epoch_once(tmp_path, straight, interval, resumes_at):
    model_dir, log = tmp_path / "run", tmp_path / "log.csv"
    killed = _run(model_dir, log, 2, interval)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert [row["epoch"] for row in csv.DictReader(log.open())] == ["0", "1"]
    again = _run(model_dir, log, -1, interval)
    assert again.returncode == 0, again.stderr[-2000:]
    result = json.loads(again.stdout.strip().splitlines()[-1])
    assert result["start_step"] == resumes_at  # not step 0
    rows = list(csv.DictReader(log.open()))
    assert [row["epoch"] for row in rows] == ["0", "1", "2"]  # each once, none lost
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose([float(row[name]) for row in rows],
                                   straight.history[name], rtol=1e-6, err_msg=name)
