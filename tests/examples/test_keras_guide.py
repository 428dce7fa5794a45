"""examples/keras_multi_gpu_guide.py: Keras's multi-GPU guide with two changed lines
(`tfloop.use_devices` at the top, `tfloop.fit` for `model.fit`) runs on two logical
CPUs, its fault-tolerance section included (issue 31 items 8 and 12).

It runs as a script in a process of its own, as a user runs it (`python
script.py`; a fork of the binary server, whose TensorFlow runtime has not
started, as in a fresh interpreter; `TFLOOP_TEST_FRESH=1` runs it fresh): its
dataset is built before `fit`, so the devices must be set before (`use_devices`). A `train.lock`
and a checkpoint index planted in its `./ckpt` (what a tfloop `model_dir` there
would hold) are not taken for models.
"""

import os

from helpers import REPO, bin_env, run_python
from tutorials import changed_lines

SCRIPT = os.path.join(REPO, "examples", "keras_multi_gpu_guide.py")


def test_the_guide_runs_with_two_changed_lines_and_resumes_from_its_keras_checkpoint(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "tmp").mkdir()
    (tmp_path / "ckpt" / "train.lock").write_text("")
    (tmp_path / "ckpt" / "ckpt-3.index").write_bytes(b"\0")
    result = run_python([SCRIPT], cwd=str(tmp_path), timeout=400,
                        env=bin_env({"TMPDIR": str(tmp_path / "tmp")}))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "Number of devices: 2" in out
    assert out.index("Creating a new model") < out.index("Restoring from ./ckpt/ckpt-1.keras")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["ckpt-1.keras", "ckpt-3.index",
                                                     "train.lock"]
    assert os.listdir(tmp_path / "tmp") == []  # fit's temporary run folders are gone
    lines = [line for line in out.splitlines() if line.startswith("12/12 - ")]
    assert len(lines) == 2 and all("val_loss" in line for line in lines)  # verbose=2


def test_the_changed_lines_are_two_and_marked():
    changed = changed_lines(SCRIPT)
    assert len(changed) == 3  # use_devices, fit in the guide, fit in its fault-tolerance part
    assert changed[0].startswith("import tfloop; tfloop.use_devices(")
    assert all("tfloop.fit(" in line for line in changed[1:])
