"""TFRecord datasets: converter round trip, deterministic file-based pipeline,
exact resume (one process, and the skip arithmetic of `file` and `data`
sharding over two workers), loader mistakes."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tfloop import inputs
from tfloop.engine.config import RunConfig
from tfloop.engine.assembly.run import run
from tfloop.inputs import InputError, convert, synthetic, tfrecord
from helpers import worker_batches, write_tfrecord_dir


@pytest.fixture(scope="module")
def source():
    return synthetic.load(seed=3, num_train=240, num_eval=50)


@pytest.fixture(scope="module")
def records(source, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("records") / "synthetic")
    convert.write(source, directory, num_shards=4, source="synthetic")
    return directory


def _batches(ds, count):
    return [(x.numpy(), y.numpy()) for x, y in ds.take(count)]


def test_converter_round_trip_gives_the_source_examples_in_order(source, records):
    assert sorted(os.listdir(records)) == sorted(["metadata.json"] + [
        f"{split}-0000{i}-of-00004.tfrecord" for split in ("eval", "train") for i in range(4)])
    loaded = inputs.load("tfrecord", data_dir=records)
    assert loaded.num_classes == 10 and loaded.input_shape == (28, 28, 1)
    assert (len(loaded.train), len(loaded.eval)) == (240, 50)
    for split, original in ((loaded.train, source.train), (loaded.eval, source.eval)):
        back = tfrecord.read_all(split)
        np.testing.assert_array_equal(back.x, original.x)
        np.testing.assert_array_equal(back.y, original.y)
    # The eval pipeline reads the files in order: the source's order, floats in [0, 1].
    (x, y), = _batches(inputs.eval_batches(loaded.eval, global_batch_size=64), 1)
    np.testing.assert_array_equal(y, source.eval.y)
    np.testing.assert_allclose(x, source.eval.x / 255.0, atol=1e-6)


def test_train_pipeline_covers_each_epoch_once_is_seeded_and_skips_exactly(source, records):
    split = inputs.load("tfrecord", data_dir=records).train
    first = _batches(inputs.train_batches(split, global_batch_size=24, seed=1), 12)
    # The first 10 batches are one epoch: every example exactly once, shuffled.
    epoch_labels = np.concatenate([y for _, y in first[:10]])
    assert sorted(epoch_labels) == sorted(source.train.y)
    assert not np.array_equal(epoch_labels, source.train.y)
    epoch_images = np.concatenate([x for x, _ in first[:10]])
    assert {img.tobytes() for img in np.round(epoch_images * 255).astype(np.uint8)} == {
        img.tobytes() for img in source.train.x}
    # Same seed, same batches; a resumed pipeline continues exactly.
    again = _batches(inputs.train_batches(split, global_batch_size=24, seed=1), 12)
    resumed = _batches(inputs.train_batches(split, global_batch_size=24, seed=1, start_step=9), 3)
    for (x1, y1), (x2, y2) in zip(first, again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    for (x1, y1), (x2, y2) in zip(first[9:], resumed):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    other_seed = _batches(inputs.train_batches(split, global_batch_size=24, seed=2), 1)
    assert not np.array_equal(other_seed[0][1], first[0][1])


def _worker_steps(split, policy, worker, *, start_step, steps, batch=8, workers=2):
    ds = inputs.train_batches(split, global_batch_size=batch, seed=4, start_step=start_step,
                              shard_policy=policy, num_workers=workers)
    return [(np.round(x * 255).astype(np.uint8), y)
            for x, y in worker_batches(ds, batch, workers, worker, steps)]


@pytest.mark.parametrize("policy", ["file", "data", "off"])
def test_two_workers_resume_exactly_under_every_shard_policy(source, records, policy):
    split = inputs.load("tfrecord", data_dir=records).train
    shard_of = {image.tobytes(): i // 60 for i, image in enumerate(source.train.x)}  # 60 a file
    shards = {}
    for worker in (0, 1):
        straight = _worker_steps(split, policy, worker, start_step=0, steps=7)
        resumed = _worker_steps(split, policy, worker, start_step=3, steps=4)
        assert all(len(y) == 4 for _, y in straight)  # 8 examples a step over 2 workers
        for (x1, y1), (x2, y2) in zip(straight[3:], resumed):
            np.testing.assert_array_equal(x1, x2)
            np.testing.assert_array_equal(y1, y2)
        shards[worker] = {shard_of[image.tobytes()] for x, _ in straight for image in x}
    if policy == "file":  # each worker reads two of the four files, not the other's
        assert len(shards[0]) == len(shards[1]) == 2 and not shards[0] & shards[1]
    else:  # every worker reads every file (`data`: and keeps its part of each batch)
        assert len(shards[0]) > 2 and len(shards[1]) > 2


def test_training_on_tfrecords_resumes_with_the_weights_of_an_uninterrupted_run(tmp_path):
    data_dir = write_tfrecord_dir(str(tmp_path / "records"), num_shards=3, num_train=300)

    def config(name, steps):
        return RunConfig(strategy="mirrored", devices="cpu:0,cpu:1",
                         collective="reduce_to_one_device", model="mlp", dataset="tfrecord",
                         data_dir=data_dir, model_dir=str(tmp_path / name), global_batch_size=32,
                         train_steps=steps, steps_per_loop=4, checkpoint_interval=4,
                         summary_interval=0, mode="train", optimizer="adam", seed=2,
                         export=False)

    # 300 examples, 32 a step: the stop (step 8) and the end (step 16) sit in
    # different epochs, so resume crosses an epoch boundary of the file shuffle.
    assert run(config("resumed", 8))["step"] == 8
    resumed = run(config("resumed", 16))
    assert resumed["start_step"] == 8 and resumed["step"] == 16
    run(config("straight", 16))
    a = tf.train.load_checkpoint(str(tmp_path / "resumed"))
    b = tf.train.load_checkpoint(str(tmp_path / "straight"))
    names = [n for n in a.get_variable_to_shape_map() if n.startswith("model_weights/")]
    assert len(names) == 6
    for name in names:
        np.testing.assert_allclose(a.get_tensor(name), b.get_tensor(name), rtol=1e-6, atol=1e-7)


def test_loader_mistakes_are_one_line_input_errors(records, tmp_path):
    def error(data_dir):
        with pytest.raises(InputError) as info:
            inputs.load("tfrecord", data_dir=data_dir)
        assert "\n" not in str(info.value)
        return str(info.value)

    assert "needs --data_dir" in error("")
    assert "is not a directory" in error(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert "has no metadata.json" in error(str(tmp_path / "empty"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metadata.json").write_text("{not json")
    assert "metadata.json is not valid (JSONDecodeError" in error(str(bad))
    (bad / "metadata.json").write_text(json.dumps({"format": "tfloop.tfrecord",
                                                   "image_shape": [28, 28]}))
    assert "image_shape" in error(str(bad))
    meta = json.loads(open(os.path.join(records, "metadata.json")).read())
    (bad / "metadata.json").write_text(json.dumps(meta))
    assert "holds no train-*.tfrecord files" in error(str(bad))
    for name in meta["splits"]["train"]["files"][:3]:
        os.symlink(os.path.join(records, name), bad / name)
    assert "differ from those metadata.json lists (e.g. train-00003" in error(str(bad))

    split = inputs.load("tfrecord", data_dir=records).train
    with pytest.raises(InputError, match="deals 4 file.s. to 5 workers"):
        inputs.resolve_shard_policy(split, "file", 5)
    assert inputs.resolve_shard_policy(split, "auto", 5) == "data"
    assert inputs.resolve_shard_policy(split, "auto", 4) == "file"
    with pytest.raises(InputError, match="needs a dataset of files.*in memory"):
        inputs.resolve_shard_policy(synthetic.load(seed=0, num_train=8, num_eval=0).train,
                                    "file", 2)



def test_a_folder_written_to_a_ram_filesystem_reads_back_and_batches_the_same(source, records):
    """Converter and loader go through tf.io.gfile: ram:// here, gs:// for users."""
    out = convert.write(source, "ram://tfrecord_test/synthetic", num_shards=4)
    assert out == "ram://tfrecord_test/synthetic"
    assert tf.io.gfile.listdir("ram://tfrecord_test") == ["synthetic"]  # no temporary left
    assert sorted(tf.io.gfile.listdir(out)) == sorted(os.listdir(records))
    loaded = inputs.load("tfrecord", data_dir=out)
    np.testing.assert_array_equal(tfrecord.read_all(loaded.eval).x, source.eval.x)
    local = inputs.load("tfrecord", data_dir=records).train
    for (x1, y1), (x2, y2) in zip(
            _batches(inputs.train_batches(loaded.train, global_batch_size=24, seed=1), 3),
            _batches(inputs.train_batches(local, global_batch_size=24, seed=1), 3)):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    with pytest.raises(InputError, match="ram://tfrecord_test/synthetic is not empty"):
        convert.write(source, out, num_shards=2)
