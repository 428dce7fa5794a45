"""mnist.npz as users have it: uint8 as Keras writes it, or float pixels in [0, 1]
as the multi-worker tutorial preprocesses it; never silently truncated."""

import logging

import numpy as np
import pytest

from tfloop.inputs import InputError, mnist
from helpers import write_digits_npz


def _rewrite(path, **changes):
    with np.load(path) as npz:
        arrays = {key: npz[key] for key in npz.files}
    arrays.update(changes)
    np.savez(path, **arrays)
    return arrays


def test_float_pixels_in_0_1_are_scaled_not_truncated(tmp_path, caplog):
    path = write_digits_npz(str(tmp_path))
    original = mnist.load(data_dir=str(tmp_path))
    with np.load(path) as npz:
        as_floats = {k: npz[k].astype(np.float32) / 255.0 for k in ("x_train", "x_test")}
    _rewrite(path, **as_floats)
    with caplog.at_level(logging.INFO, logger="tfloop"):
        scaled = mnist.load(data_dir=str(tmp_path))
    assert scaled.train.x.dtype == np.uint8
    np.testing.assert_array_equal(scaled.train.x, original.train.x)
    np.testing.assert_array_equal(scaled.eval.x, original.eval.x)
    assert "x_train holds float pixels in [0, 1]; scaling them to 0..255" in caplog.text


def test_float_pixels_in_0_255_are_kept(tmp_path):
    path = write_digits_npz(str(tmp_path))
    original = mnist.load(data_dir=str(tmp_path))
    with np.load(path) as npz:
        _rewrite(path, x_train=npz["x_train"].astype(np.float64))
    np.testing.assert_array_equal(mnist.load(data_dir=str(tmp_path)).train.x, original.train.x)


@pytest.mark.parametrize("damage, says", [
    (lambda x: np.where(np.arange(x.size).reshape(x.shape) == 7, np.nan, x),
     "x_train holds 1 NaN or infinite pixel(s)"),
    (lambda x: x - 1.0, "x_train pixels lie in -1..0; write them as 0..255 (uint8) or as floats"),
    (lambda x: x * 300.0, "pixels lie in 0..300"),
])
def test_pixels_that_cannot_be_images_are_one_line(tmp_path, damage, says):
    path = write_digits_npz(str(tmp_path))
    with np.load(path) as npz:
        _rewrite(path, x_train=damage(npz["x_train"].astype(np.float32) / 255.0))
    with pytest.raises(InputError) as error:
        mnist.load(data_dir=str(tmp_path))
    assert says in str(error.value) and "\n" not in str(error.value)


def test_mnist_npz_on_a_ram_filesystem_loads_like_a_local_one(tmp_path):
    """--data_dir is read through tf.io.gfile: ram:// here, gs:// for users."""
    import tensorflow as tf

    from tfloop import inputs

    path = write_digits_npz(str(tmp_path))
    with open(path, "rb") as f, tf.io.gfile.GFile("ram://mnist_test/mnist.npz", "wb") as g:
        g.write(f.read())
    local = mnist.load(data_dir=str(tmp_path))
    remote = inputs.load("mnist", data_dir="ram://mnist_test")
    for a, b in ((local.train, remote.train), (local.eval, remote.eval)):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)
    with pytest.raises(InputError, match="ram://nothing/mnist.npz does not exist"):
        mnist.load(data_dir="ram://nothing")
