"""The TFRecord converter (`inputs.convert`, `bin/convert_to_tfrecord`): its
mistakes are one line and leave nothing behind. The round trip (written
records read back equal the source) is in test_tfrecord.py and
test_image_folder.py."""

import os

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
