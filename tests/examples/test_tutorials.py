"""The tutorials' scripts run on two logical CPUs with at most two changed
lines (issue 31 item 12): TF's "Multi-worker training with Keras" single-worker
cells (examples/mwms_tutorial/) and TF's MirroredStrategy note
(examples/mirrored_strategy_note.py). Keras's multi-GPU guide:
test_keras_guide.py.

Each runs as its user runs it, in a fresh process and its own folder; the
engine's start-up line says what `fit` trained on.
"""

import os

from helpers import REPO, write_digits_npz
from tutorials import changed_lines, run_script

MWMS = os.path.join(REPO, "examples", "mwms_tutorial")
NOTE = os.path.join(REPO, "examples", "mirrored_strategy_note.py")


def _assert_two_changed_lines(script):
    changed = changed_lines(script)
    assert len(changed) == 2, changed
    assert changed[0].startswith("import tfloop; tfloop.use_devices(\"cpu:0,cpu:1\")")
    assert "tfloop.fit(" in changed[1]


def test_mwms_tutorial_single_worker_cells_train_on_two_logical_cpus(tmp_path):
    script = os.path.join(MWMS, "single_worker.py")
    _assert_two_changed_lines(script)
    assert changed_lines(os.path.join(MWMS, "mnist_setup.py")) == []
    write_digits_npz(str(tmp_path))  # the tutorial's mnist.npz, made locally
    (tmp_path / "tmp").mkdir()
    # TUTORIAL_STEPS: the script's steps_per_epoch (70, the tutorial's, unset).
    result = run_script(script, tmp_path, env={"TUTORIAL_STEPS": "3",
                                               "TMPDIR": str(tmp_path / "tmp")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mirrored over 2 replica(s) [cpu:0,cpu:1]" in result.stderr
    assert "global batch 64 (32 per replica)" in result.stderr  # the tutorial's batch_size
    assert [result.stdout.count(f"Epoch {e}/3") for e in (1, 2, 3)] == [1, 1, 1]
    assert "3/3" in result.stdout and "accuracy:" in result.stdout
    assert os.listdir(tmp_path / "tmp") == []  # fit's temporary run folder is gone


def test_mirrored_strategy_note_trains_on_two_logical_cpus(tmp_path):
    _assert_two_changed_lines(NOTE)
    result = run_script(NOTE, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Number of devices: 2" in result.stdout
    assert "mirrored over 2 replica(s) [cpu:0,cpu:1]" in result.stderr
    assert [result.stdout.count(f"Epoch {e}/2") for e in (1, 2)] == [1, 1]
    assert "sparse_categorical_accuracy:" in result.stdout
