"""Images cross to the device as uint8 and are scaled in the step (issue 15, item 9).

Every split kind can hand its batches over as uint8 (`image_dtype="uint8"`);
`inputs.to_float` then gives exactly the floats the host-side cast gives. The
built-in task does that: its datasets carry uint8 (a quarter of the bytes per
step), its loss scales them on the replica's device, its export still serves
float32, and a run trains to the very weights of the host-cast pipeline.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfloop import inputs, models
from tfloop.engine.config import RunConfig
from tfloop.engine.task.losses import classification_loss
from tfloop.engine.assembly.run import run
from tfloop.engine.task import ClassificationTask
from tfloop.inputs import InputContext, InputError, convert, synthetic
from helpers import write_image_folder


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """The three split kinds: in memory, TFRecord files, an image folder."""
    source = synthetic.load(seed=5, num_train=96, num_eval=40)
    records = str(tmp_path_factory.mktemp("records") / "synthetic")
    convert.write(source, records, num_shards=2, source="synthetic")
    folder = write_image_folder(tmp_path_factory.mktemp("images") / "pictures", per_class=6)
    return {"examples": source, "records": inputs.load("tfrecord", data_dir=records),
            "image_folder": inputs.load("image_folder", data_dir=folder, image_size=16,
                                        eval_fraction=0.25)}


def _arrays(ds, count=None):
    ds = ds.take(count) if count else ds
    return [(x.numpy(), y.numpy()) for x, y in ds]


@pytest.mark.parametrize("kind", ["examples", "records", "image_folder"])
def test_uint8_batches_scaled_in_the_step_equal_the_host_cast(splits, kind):
    split = splits[kind]
    host = inputs.train_batches(split.train, global_batch_size=8, seed=1, start_step=2)
    raw = inputs.train_batches(split.train, global_batch_size=8, seed=1, start_step=2,
                               image_dtype="uint8")
    assert host.element_spec[0].dtype == tf.float32 and raw.element_spec[0].dtype == tf.uint8
    for (x, y), (pixels, labels) in zip(_arrays(host, 4), _arrays(raw, 4)):
        np.testing.assert_array_equal(inputs.to_float(pixels).numpy(), x)  # bit for bit
        np.testing.assert_array_equal(labels, y)
    host = _arrays(inputs.eval_batches(split.eval, global_batch_size=7))
    raw = _arrays(inputs.eval_batches(split.eval, global_batch_size=7, image_dtype="uint8"))
    assert [x.shape for x, _ in raw] == [x.shape for x, _ in host]
    for (x, y), (pixels, labels) in zip(host, raw):
        assert pixels.dtype == np.uint8
        np.testing.assert_array_equal(inputs.to_float(pixels).numpy(), x)
        np.testing.assert_array_equal(labels, y)


def test_to_float_is_the_division_by_255_of_before_in_and_out_of_a_graph():
    pixels = tf.constant(np.arange(256, dtype=np.uint8))
    divided = (tf.cast(pixels, tf.float32) / 255.0).numpy()  # eager: IEEE division
    np.testing.assert_array_equal(inputs.to_float(pixels).numpy(), divided)
    np.testing.assert_array_equal(tf.function(inputs.to_float)(pixels).numpy(), divided)
    np.testing.assert_array_equal(
        tf.function(inputs.to_float, jit_compile=True)(pixels).numpy(), divided)


def test_an_unknown_image_dtype_is_one_line(splits):
    with pytest.raises(InputError, match="image_dtype='float16' is not one of float32, uint8"):
        inputs.train_batches(splits["examples"].train, global_batch_size=8, seed=0,
                             image_dtype="float16")


def _task():
    task = ClassificationTask(dataset="synthetic", model="mlp", seed=2)
    task.splits = synthetic.load(seed=2, num_train=128, num_eval=64)
    return task


def test_the_built_in_task_ships_uint8_and_scales_in_its_loss():
    task = _task()
    context = InputContext.create(global_batch_size=16)
    train, evaluation = task.train_dataset(context), task.eval_dataset(context)
    assert train.element_spec[0].dtype == tf.uint8
    assert evaluation.element_spec[0].dtype == tf.uint8
    # The export still takes what the model takes: float32 in [0, 1].
    assert task.serving_spec(train.element_spec) == tf.TensorSpec([None, 28, 28, 1], tf.float32)
    model = models.build("mlp", input_shape=(28, 28, 1), num_classes=10)
    pixels, labels = next(iter(train))
    scaled = task.loss(model, (pixels, labels), training=False)
    plain = classification_loss(model, (tf.cast(pixels, tf.float32) / 255.0, labels),
                                training=False)
    np.testing.assert_array_equal(scaled.per_example_loss.numpy(), plain.per_example_loss.numpy())
    np.testing.assert_array_equal(scaled.metrics["accuracy"].numpy(),
                                  plain.metrics["accuracy"].numpy())


class _HostCast(ClassificationTask):
    """The pipeline before the change: floats made on the host."""

    def train_dataset(self, context):
        return inputs.train_batches(self.splits.train, seed=context.seed,
                                    global_batch_size=context.global_batch_size,
                                    start_step=context.start_step)


def test_a_run_trains_to_the_weights_of_the_host_cast_pipeline(tmp_path):
    def weights(task, name):
        config = RunConfig(strategy="mirrored", devices="cpu:0,cpu:1", model="mlp",
                           global_batch_size=32, train_steps=6, steps_per_loop=3,
                           mode="train", export=False, optimizer="sgd", learning_rate=0.1,
                           model_dir=str(tmp_path / name), seed=2)
        run(config, task=task)
        reader = tf.train.load_checkpoint(str(tmp_path / name))
        return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
                if key.startswith("model_weights/")}

    device_cast = weights(ClassificationTask(dataset="synthetic", model="mlp", seed=2), "device")
    host_cast = weights(_HostCast(dataset="synthetic", model="mlp", seed=2), "host")
    assert device_cast.keys() == host_cast.keys() and device_cast
    for key in device_cast:
        np.testing.assert_array_equal(device_cast[key], host_cast[key], err_msg=key)
