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
