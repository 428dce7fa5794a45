"""The TFRecord converter (`inputs.convert`, `bin/convert_to_tfrecord`): its
mistakes are one line and leave nothing behind. The round trip (written
records read back equal the source) is in test_tfrecord.py and
test_image_folder.py."""

import json
import os
import stat
import time

import pytest

from helpers import assert_one_line_error, run_bin, write_tfrecord_dir
from tfloop.inputs import InputError, convert, synthetic


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return write_tfrecord_dir(str(tmp_path_factory.mktemp("records") / "synthetic"),
                              num_train=64, num_eval=16)


def test_converter_refuses_to_overwrite_and_writes_nothing_half_done(records, tmp_path):
    before = sorted(os.listdir(records))
    result = run_bin("convert_to_tfrecord", "--source=synthetic", f"--output_dir={records}",
                     timeout=120)
    assert_one_line_error(result, contains="is not empty; name a new or empty directory")
    assert sorted(os.listdir(records)) == before
    with pytest.raises(InputError, match="--source='cifar' is not a source"):
        convert.convert("cifar", output_dir=str(tmp_path / "out"), num_shards=2)
    with pytest.raises(InputError, match="--num_shards=9 is more than the 8 train examples"):
        convert.write(synthetic.load(seed=0, num_train=8, num_eval=2), str(tmp_path / "out"),
                      num_shards=9)
    assert sorted(os.listdir(tmp_path)) == []  # no output, no temporary left behind


def test_a_parent_that_refuses_a_new_folder_is_one_line():
    """/proc passes the writability check as root, then refuses the staging folder."""
    result = run_bin("convert_to_tfrecord", "--source=synthetic", "--output_dir=/proc/records",
                     timeout=120)
    assert result.returncode == 2
    assert_one_line_error(result, contains="--output_dir=/proc/records cannot be")


def test_a_killed_conversions_staging_folder_is_removed_by_the_next_one(tmp_path):
    output = tmp_path / "records"
    # What a converter killed mid-write leaves: its staging folder, the lock
    # file in it no longer held. The kernel drops a flock when its file is
    # closed as when its process dies: closing it here leaves the same state
    # as a killed converter, without starting one.
    left_by_kill, killed_lock = convert._make_staging(str(output))
    open(os.path.join(left_by_kill, "train-00000-of-00004.tfrecord"), "w").write("half")
    killed_lock.close()
    # An older converter's (no lock file), last written to an hour ago.
    old = tmp_path / ".records.tmp-old12345"
    old.mkdir()
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    # One a converter is writing right now (its lock held): left alone.
    writing, lock = convert._make_staging(str(tmp_path / "records"))

    result = run_bin("convert_to_tfrecord", "--source=synthetic", f"--output_dir={output}",
                     "--num_shards=2", timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"removed {left_by_kill}, left by an interrupted conversion" in result.stdout
    assert f"removed {old}, left by an interrupted conversion" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["records", os.path.basename(writing)])
    assert ".writing" not in os.listdir(output)  # the lock file is no part of the dataset
    lock.close()
    # --source=synthetic with no --image_size writes `--dataset=synthetic`'s data:
    # MNIST-shaped digits (it once took --image_size's image_folder default, 224,
    # and wrote 300 MB of RGB images).
    with open(output / "metadata.json") as file:
        meta = json.load(file)
    default = synthetic.load(seed=0)
    assert meta["image_shape"] == list(synthetic.SHAPE) == list(default.input_shape)
    assert (meta["splits"]["train"]["count"], meta["splits"]["eval"]["count"]) == (
        len(default.train), len(default.eval))


def test_a_staging_name_that_is_a_link_is_left_alone_and_staging_is_at_most_0755(tmp_path):
    """The engine's rule (engine/runtime/files.py) in this library's own two
    lines: a link planted at a staging name is neither followed nor counted as
    removed, and a staging folder is at most 0755 whatever the umask."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_bytes(b"precious\n")
    os.utime(victim, (time.time() - 3600, time.time() - 3600))  # older than the grace
    planted = tmp_path / ".records.tmp-link1234"
    planted.symlink_to(victim)
    assert convert.remove_stale_staging(str(tmp_path / "records")) == []
    assert planted.is_symlink() and sorted(os.listdir(victim)) == ["thesis.tex"]
    assert (victim / "thesis.tex").read_bytes() == b"precious\n"
    umask = os.umask(0)
    try:
        staging, lock = convert._make_staging(str(tmp_path / "records"))
    finally:
        os.umask(umask)
    lock.close()
    assert stat.S_IMODE(os.stat(staging).st_mode) == 0o755
