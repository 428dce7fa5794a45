"""inputs.synthetic: MNIST-shaped by default, ImageNet-sized on request (issue 30)."""

import numpy as np
import pytest

from tfloop import inputs
from tfloop.inputs import synthetic


def test_the_default_is_mnist_shaped_and_unchanged_by_the_new_options():
    default = inputs.load("synthetic", seed=3)
    assert default.train.x.shape == (8192, 28, 28, 1) and default.num_classes == 10
    again = inputs.load("synthetic", seed=3, image_size=0, num_classes=0)
    assert np.array_equal(default.train.x, again.train.x)


def test_imagenet_sized_images_are_uint8_within_a_memory_budget():
    splits = inputs.load("synthetic", seed=0, image_size=224, num_classes=1000)
    assert splits.input_shape == (224, 224, 3) and splits.num_classes == 1000
    assert splits.train.x.dtype == np.uint8
    assert splits.train.x.nbytes <= synthetic.BUDGET_BYTES
    assert len(splits.train) == synthetic.BUDGET_BYTES // (224 * 224 * 3)
    assert 0 <= splits.train.y.min() and splits.train.y.max() < 1000
    small = inputs.load("synthetic", seed=0, image_size=32, num_classes=5)
    assert small.input_shape == (32, 32, 3) and set(small.train.y) == set(range(5))


def test_num_classes_is_for_synthetic_data_only():
    with pytest.raises(inputs.InputError, match="--num_classes=3 applies to --dataset=synthetic"):
        inputs.load("mnist", data_dir="/nonexistent", num_classes=3)


def test_small_splits_are_made_once_per_process_and_cannot_be_changed():
    """A notebook or a suite that runs again gets the same splits without
    making them again, and no caller can change another's data."""
    first = synthetic.load(seed=11, num_train=64, num_eval=16)
    assert synthetic.load(seed=11, num_train=64, num_eval=16) is first
    assert synthetic.load(seed=12, num_train=64, num_eval=16) is not first
    with pytest.raises(ValueError, match="read-only"):
        first.train.x[0, 0, 0, 0] = 1
    with pytest.raises(ValueError, match="read-only"):
        first.eval.y[0] = 1
    # Over KEPT_BYTES: made on every call, as before (nothing large stays in memory).
    large = dict(seed=11, num_train=synthetic.KEPT_BYTES // (28 * 28) + 1, num_eval=1)
    made = synthetic.load(**large)
    assert synthetic.load(**large) is not made and made.train.x.flags.writeable
    np.testing.assert_array_equal(synthetic.load(**large).train.x[:64], made.train.x[:64])
