"""The README's tour, lines run as written, from a fresh folder (as in a fresh clone).

Only the cheap lines run here: the converter into `data/` (a folder a fresh
clone does not have) and the `--strategy=tpu` refusal (no TPU, and a
`gs://` model_dir this machine cannot reach: the refusal is the TPU's, exit
2, before the storage is asked). The lines are read from README.md, so a
changed line is the line tested.
"""

import os
import re
import subprocess

import pytest

from helpers import REPO, bin_env, write_digits_npz


def _tour_line(start: str) -> str:
    """The README tour's command that starts with `start`, joined across `\\` lines."""
    text = open(os.path.join(REPO, "README.md")).read()
    tour = text.split("## A short tour", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = re.sub(r"\\\n\s*", " ", tour).splitlines()
    found = [line.split("  #")[0].strip() for line in commands if line.startswith(start)]
    assert len(found) == 1, (start, found)
    return found[0]


def _run_as_written(line: str, cwd, home) -> subprocess.CompletedProcess:
    """`line` through bash in `cwd`, `bin/` meaning the checkout's, `$HOME` = `home`."""
    command = re.sub(r"^bin/", os.path.join(REPO, "bin") + "/", line)
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env=bin_env({"HOME": str(home)}))


def test_the_converter_line_writes_into_data_of_a_fresh_folder(tmp_path):
    home, fresh = tmp_path / "home", tmp_path / "clone"
    (home / "data").mkdir(parents=True)
    fresh.mkdir()
    write_digits_npz(str(home / "data"))  # the Keras-layout mnist.npz the line reads
    line = _tour_line("bin/convert_to_tfrecord --source=mnist")
    assert "--output_dir=data/mnist_tfr" in line
    result = _run_as_written(line, fresh, home)
    assert result.returncode == 0, result.stderr
    written = sorted(os.listdir(fresh / "data" / "mnist_tfr"))
    assert "metadata.json" in written and len([n for n in written if "train-" in n]) == 8
    assert os.listdir(fresh / "data") == ["mnist_tfr"]  # no staging folder left


def test_a_converter_output_under_a_file_is_still_refused_in_one_line(tmp_path):
    (tmp_path / "data").write_text("a file")
    result = _run_as_written("bin/convert_to_tfrecord --source=synthetic "
                             "--output_dir=data/x/records", tmp_path, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{tmp_path}/data is not a writable directory" in result.stderr


@pytest.mark.parametrize("model_dir", ["as written", "local"])
def test_the_tpu_line_is_the_no_tpu_refusal_before_any_storage(tmp_path, model_dir):
    line = _tour_line("bin/train --strategy=tpu")
    if model_dir == "local":
        line = line.replace("gs://bucket/run", "runs/tpu")
    result = _run_as_written(line, tmp_path, tmp_path)
    errors = [l for l in result.stderr.splitlines() if "error:" in l]
    assert result.returncode == 2, result.stderr
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert "--strategy=tpu found no TPU" in errors[0] and "use --strategy=mirrored" in errors[0]
    assert "cannot be reached" not in result.stderr
    assert not (tmp_path / "runs").exists()
