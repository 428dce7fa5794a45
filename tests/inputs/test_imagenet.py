"""`--dataset=imagenet` (issue 40, items 1 and 2): the standard ImageNet TFRecord
layout read and refused, the converter's round trip, the Inception-style
preprocessing (shapes, dtype, stateless per-example randomness, exact resume,
multi-worker file sharding), ImageNet's normalization in the step and the
export, and one short `bin/train` run that resumes."""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tfloop import inputs
from tfloop.engine.task import ClassificationTask
from tfloop.inputs import InputError, augment, data_errors, imagenet, imagenet_convert
from helpers import (assert_one_line_error, run_bin, worker_batches, write_imagenet_dir,
                     write_jpeg_tree)

SIZE = 32


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """3 classes of 8 images of 4 sizes, a quarter PNG."""
    return write_jpeg_tree(tmp_path_factory.mktemp("tree") / "photos", per_class=8)


@pytest.fixture(scope="module")
def data_dir(tree, tmp_path_factory):
    return imagenet_convert.write(tree, str(tmp_path_factory.mktemp("inet") / "imagenet"),
                                  num_shards=4, eval_fraction=0.25)


@pytest.fixture(scope="module")
def splits(data_dir):
    return inputs.load("imagenet", data_dir=data_dir, image_size=SIZE)


def _records(path):
    return [tf.train.Example.FromString(r.numpy()).features.feature
            for r in tf.data.TFRecordDataset(path)]


def _example(label=1, encoded=None, **floats):
    feature = {}
    if encoded is not None:
        feature[imagenet.IMAGE_KEY] = tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[encoded]))
    if label is not None:
        feature[imagenet.LABEL_KEY] = tf.train.Feature(int64_list=tf.train.Int64List(
            value=[label]))
    for key, values in floats.items():
        feature[f"image/object/bbox/{key}"] = tf.train.Feature(
            float_list=tf.train.FloatList(value=values))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(path, records):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def test_the_converter_writes_the_layout_and_every_record_reads_back(tree, data_dir, splits):
    names = sorted(os.listdir(data_dir))
    assert names == ["synsets.txt"] + [f"{s}-0000{i}-of-00004" for s in ("train", "validation")
                                       for i in range(4)]
    assert open(os.path.join(data_dir, "synsets.txt")).read() == "n01\nn02\nn03\n"
    source = {}  # file name -> (1-based label, bytes)
    for label, name in enumerate(("n01", "n02", "n03")):
        for file in os.listdir(os.path.join(tree, name)):
            source[file] = (label + 1, open(os.path.join(tree, name, file), "rb").read())
    seen = {}
    for path in splits.train.files + splits.eval.files:
        for feature in _records(path):
            file = feature["image/filename"].bytes_list.value[0].decode()
            label, original = source[file]
            encoded = feature[imagenet.IMAGE_KEY].bytes_list.value[0]
            assert feature[imagenet.LABEL_KEY].int64_list.value == [label]
            assert feature["image/class/synset"].bytes_list.value == [f"n0{label}".encode()]
            assert feature["image/format"].bytes_list.value == [b"JPEG"]
            height, width = (feature[k].int64_list.value[0] for k in ("image/height",
                                                                        "image/width"))
            decoded = tf.io.decode_image(original, channels=3).numpy()
            assert (height, width) == decoded.shape[:2]
            if file.endswith(".JPEG"):
                assert encoded == original  # the JPEG's bytes as they are
            else:  # a PNG, re-encoded as JPEG at quality 100 (chroma subsampled: noise
                assert encoded[:3] == b"\xff\xd8\xff"  # differs; the colour stays)
                again = tf.io.decode_jpeg(encoded).numpy()
                assert again.shape == decoded.shape
                assert abs(again.mean() - decoded.mean()) < 2
            seen[file] = path
    assert sorted(seen) == sorted(source)  # every image once
    assert (len(splits.train), len(splits.eval)) == (18, 6) and splits.num_classes == 3
    assert splits.class_names == ("n01", "n02", "n03") and splits.input_shape == (SIZE, SIZE, 3)
    # The train files were shuffled before sharding (build_imagenet_data's seed): each
    # shard mixes classes; validation keeps the source order.
    first_shard = {f["image/class/label"].int64_list.value[0] for f in _records(
        splits.train.files[0])}
    assert len(first_shard) > 1


def test_an_image_that_does_not_decode_stops_the_conversion_naming_it(tmp_path):
    tree = write_jpeg_tree(tmp_path / "photos", per_class=2)
    broken = os.path.join(tree, "n02", "n02_1.JPEG")
    with open(broken, "r+b") as f:  # a JPEG signature, then garbage
        f.seek(40)
        f.write(b"\x00" * 200)
        f.truncate(300)
    with pytest.raises(InputError) as info:
        imagenet_convert.write(tree, str(tmp_path / "out"), num_shards=1, eval_fraction=0)
    assert f"{broken} cannot be decoded as an image" in str(info.value)
    assert "\n" not in str(info.value) and os.listdir(tmp_path) == ["photos"]  # nothing left


def test_a_ram_filesystem_folder_converts_loads_and_batches_as_the_local_one(tree, splits):
    """Through tf.io.gfile: ram:// here, gs:// for users (not counted there)."""
    out = imagenet_convert.write(tree, "ram://imagenet_test/out", num_shards=4,
                                 eval_fraction=0.25)
    assert tf.io.gfile.listdir("ram://imagenet_test") == ["out"]  # no staging left
    remote = inputs.load("imagenet", data_dir=out, image_size=SIZE)
    assert remote.train.count is None and remote.class_names == splits.class_names
    task = ClassificationTask(dataset="imagenet", data_dir=out, image_size=SIZE)
    task.prepare()
    assert task.train_examples is None and "4 files (examples not counted)" in task.describe()
    task.splits = dataclasses.replace(task.splits, class_names=tuple(
        f"n{i:08d}" for i in range(1000)))  # ILSVRC's synsets: one line, not 1000 names
    assert task.describe().endswith(", 1000 classes (n00000000, n00000001, n00000002, ..., "
                                    "n00000999)")

    def first(split):
        return _take(inputs.train_batches(split, global_batch_size=6, seed=1,
                                          image_dtype="uint8"), 2)
    for a, b in zip(first(remote.train), first(splits.train)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_labels_are_one_based_in_the_files_and_boxes_are_read():
    jpeg = tf.io.encode_jpeg(np.full((20, 30, 3), 90, np.uint8)).numpy()
    record = _example(label=3, encoded=jpeg, xmin=[0.1], ymin=[0.2], xmax=[0.5], ymax=[0.9])
    encoded, label, boxes = imagenet.parse(tf.constant(record), num_classes=5)
    assert encoded.numpy() == jpeg and label.numpy() == 2
    np.testing.assert_allclose(boxes.numpy(), [[0.2, 0.1, 0.9, 0.5]])  # ymin, xmin, ymax, xmax
    _, _, none = imagenet.parse(tf.constant(_example(label=1, encoded=jpeg)), num_classes=5)
    assert none.shape == (0, 4)


def test_the_train_crop_covers_a_tenth_of_the_object_box():
    """A white 20x20 object in the corner of a black 100x100 image: with its box
    every crop holds part of it; without, some crops miss it."""
    image = np.zeros((100, 100, 3), np.uint8)
    image[75:95, 75:95] = 255
    jpeg = tf.io.encode_jpeg(image, quality=100)
    box = tf.constant([[0.75, 0.75, 0.95, 0.95]])  # ymin, xmin, ymax, xmax

    def bright(boxes):
        return [int((augment.train_image(jpeg, augment.example_seed(0, p), SIZE, boxes)
                     .numpy() > 128).sum()) for p in range(24)]
    assert min(bright(box)) > 0
    assert min(bright(None)) == 0


def test_a_label_out_of_range_stops_the_run_naming_the_file_and_record(tmp_path):
    jpeg = tf.io.encode_jpeg(np.full((20, 30, 3), 90, np.uint8)).numpy()
    _write(tmp_path / "train-00000-of-00001",
           [_example(label=2, encoded=jpeg), _example(label=1001, encoded=jpeg)])
    loaded = inputs.load("imagenet", data_dir=str(tmp_path), image_size=SIZE)
    assert loaded.eval is None and loaded.num_classes == 1000  # no synsets.txt: ILSVRC-2012's
    with pytest.raises(InputError) as info, data_errors.naming():
        list(inputs.eval_batches(loaded.train, global_batch_size=2))
    message = str(info.value)
    assert "train-00000-of-00001 record 1: image/class/label 1001 is outside [1, 1000]" in message
    assert "\n" not in message


def test_loader_refusals_are_one_line(tmp_path, data_dir):
    def error(path, **kwargs):
        with pytest.raises(InputError) as info:
            inputs.load("imagenet", data_dir=str(path), **kwargs)
        assert "\n" not in str(info.value)
        return str(info.value)

    jpeg = tf.io.encode_jpeg(np.full((20, 30, 3), 90, np.uint8)).numpy()
    assert "needs --data_dir" in error("")
    assert "is not a directory" in error(tmp_path / "missing")
    folder = tmp_path / "folder"
    folder.mkdir()
    assert "holds no train-NNNNN-of-NNNNN files" in error(folder)
    for i in (0, 2):
        _write(folder / f"train-0000{i}-of-00003", [_example(encoded=jpeg)])
    assert "train-00001-of-00003 is missing (2 of 3 train files found)" in error(folder)
    _write(folder / "train-00001-of-00004", [_example(encoded=jpeg)])
    assert "several totals (-of-00003, -of-00004)" in error(folder)
    os.remove(folder / "train-00001-of-00004")
    (folder / "train-00001-of-00003").write_bytes(b"not a tfrecord at all")
    (folder / "train-00000-of-00003").write_bytes(b"garbage bytes, no frame")
    assert "train-00000-of-00003 is not a readable TFRecord file" in error(folder)
    _write(folder / "train-00000-of-00003", [_example(label=None, encoded=jpeg)])
    assert "record 0 has no image/class/label" in error(folder)
    _write(folder / "train-00000-of-00003", [_example(label=0, encoded=jpeg)])
    assert "image/class/label [0] is not one label in [1, 1000] (1-based" in error(folder)
    (folder / "synsets.txt").write_text("a\n\nb\n")
    assert "synsets.txt has an empty line" in error(folder)
    (folder / "synsets.txt").write_text("a\nb\n")
    _write(folder / "train-00000-of-00003", [_example(encoded=jpeg)])
    _write(folder / "train-00001-of-00003", [_example(encoded=jpeg)] * 2)
    with open(folder / "train-00001-of-00003", "r+b") as f:
        f.truncate(os.path.getsize(folder / "train-00001-of-00003") - 5)
    assert "train-00001-of-00003 is damaged: record 1 (byte" in error(folder)
    assert "--augment='crop' is not one of: none, inception" in error(data_dir, augment="crop")
    with pytest.raises(InputError, match="--augment=inception applies to --dataset="
                                         "image_folder or imagenet; --dataset=synthetic"):
        inputs.load("synthetic", augment="inception")


def test_ilsvrc_shard_counts_give_its_example_counts_unread(tmp_path):
    """The references hard-code ILSVRC-2012's sizes; a split of its 128
    validation shards is taken to hold its 50,000 images (a header walk of the
    real 1.28 M train records would cost every start seconds)."""
    jpeg = tf.io.encode_jpeg(np.full((20, 30, 3), 90, np.uint8)).numpy()
    _write(tmp_path / "train-00000-of-00001", [_example(encoded=jpeg)] * 3)
    for i in range(128):
        _write(tmp_path / f"validation-{i:05d}-of-00128", [_example(encoded=jpeg)])
    loaded = inputs.load("imagenet", data_dir=str(tmp_path))
    assert (len(loaded.train), len(loaded.eval)) == (3, 50_000)
    assert loaded.input_shape == (224, 224, 3)  # the default --image_size


def test_preprocessing_shapes_dtype_and_stateless_randomness():
    rng = np.random.default_rng(0)
    smooth = np.kron(rng.integers(0, 255, (7, 9, 3)), np.ones((10, 10, 1))).astype(np.uint8)
    jpeg = tf.io.encode_jpeg(smooth, quality=100)
    png = tf.io.encode_png(tf.io.decode_jpeg(jpeg))  # the JPEG's pixels, losslessly
    crops = [augment.train_image(jpeg, augment.example_seed(7, p), SIZE).numpy()
             for p in range(6)]
    assert all(c.shape == (SIZE, SIZE, 3) and c.dtype == np.uint8 for c in crops)
    assert len({c.tobytes() for c in crops}) == 6  # each position its own crop
    again = augment.train_image(jpeg, augment.example_seed(7, 3), SIZE).numpy()
    np.testing.assert_array_equal(again, crops[3])  # the same (seed, position): equal
    other = augment.train_image(jpeg, augment.example_seed(8, 3), SIZE).numpy()
    assert not np.array_equal(other, crops[3])
    # A PNG is cropped with the very same box: the box depends on shape and seed only
    # (a JPEG decoded by window differs at the window's edges in its chroma alone).
    for position in range(6):
        from_png = augment.train_image(png, augment.example_seed(7, position), SIZE).numpy()
        assert np.abs(from_png.astype(int) - crops[position]).mean() < 1
    # Eval: the central 32/64 of the shorter side (70 -> 35), decoded alone, resized.
    central = augment.eval_image(jpeg, SIZE).numpy()
    window = tf.io.decode_jpeg(jpeg).numpy()[18:53, 28:63]
    expected = tf.cast(tf.round(tf.image.resize(window, [SIZE, SIZE])), tf.uint8).numpy()
    np.testing.assert_array_equal(central, expected)
    np.testing.assert_array_equal(augment.eval_image(png, SIZE).numpy(), expected)


def _take(ds, count):
    return [tuple(t.numpy() for t in batch) for batch in ds.take(count)]


def test_augmented_stream_is_seeded_per_position_and_resumes_exactly(splits):
    def stream(**kwargs):
        return inputs.train_batches(splits.train, global_batch_size=6, image_dtype="uint8",
                                    **{"seed": 1, **kwargs})

    straight = _take(stream(), 9)  # 18 examples: 3 epochs
    assert straight[0][0].shape == (6, SIZE, SIZE, 3) and straight[0][0].dtype == np.uint8
    for batch, again in zip(straight, _take(stream(), 9)):  # two builds: the same
        for a, b in zip(batch, again):
            np.testing.assert_array_equal(a, b)
    for batch, resumed in zip(straight[5:], _take(stream(start_step=5), 4)):  # mid-epoch
        for a, b in zip(batch, resumed):
            np.testing.assert_array_equal(a, b)
    # The same image in another epoch: another crop. Another seed: other crops.
    images = np.concatenate([x for x, _ in straight])
    assert len({image.tobytes() for image in images}) == len(images)
    assert not np.array_equal(_take(stream(seed=2), 1)[0][0], straight[0][0])
    # On the host as float32: exactly what the step's lookup gives (ImageNet's mean/std).
    host = _take(inputs.train_batches(splits.train, global_batch_size=6, seed=1), 2)
    for (x, _), (pixels, _) in zip(host, straight):
        np.testing.assert_array_equal(x, inputs.to_float(pixels, splits.normalization).numpy())


def test_exact_epochs_of_the_augmented_stream_resume_exactly(splits):
    def stream(start_step=0):
        return inputs.train_batches(splits.train, global_batch_size=4, seed=3,
                                    image_dtype="uint8", exact_epochs=True,
                                    start_step=start_step)

    straight = _take(stream(), 10)  # 18 examples: 5 batches an epoch, the last of 2
    assert [len(w[w > 0]) for _, _, w in straight[:5]] == [4, 4, 4, 4, 2]
    assert sorted(np.concatenate([y[w > 0] for _, y, w in straight[:5]])) == sorted(
        np.concatenate([y[w > 0] for _, y, w in straight[5:]]))
    assert not np.array_equal(straight[0][0], straight[5][0])
    for batch, resumed in zip(straight[3:], _take(stream(start_step=3), 7)):
        for a, b in zip(batch, resumed):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("policy", ["file", "data"])
def test_two_workers_shard_the_augmented_stream_and_resume_exactly(splits, policy):
    def steps(worker, start_step, count, workers=2):
        ds = inputs.train_batches(splits.train, global_batch_size=4, seed=4,
                                  start_step=start_step, shard_policy=policy, num_workers=workers,
                                  image_dtype="uint8", input_pipeline_id=worker)
        ds = inputs.with_run_options(ds, policy, True)  # as the engine hands it on
        return worker_batches(ds, 4, workers, worker, count)

    assert inputs.resolve_shard_policy(splits.train, "auto", 2) == "file"
    seen = {}
    for worker in (0, 1):
        straight = steps(worker, 0, 6)
        for batch, resumed in zip(straight[2:], steps(worker, 2, 4)):
            for a, b in zip(batch, resumed):
                np.testing.assert_array_equal(a, b)
        assert all(len(y) == 2 for _, y in straight)  # half of each global batch of 4
        seen[worker] = straight
    if policy == "data":  # both read the whole stream and keep their halves of each batch
        for (x0, y0), (x1, y1), (x, y) in zip(seen[0], seen[1], steps(0, 0, 6, workers=1)):
            np.testing.assert_array_equal(np.concatenate([x0, x1]), x)
            np.testing.assert_array_equal(np.concatenate([y0, y1]), y)
    else:  # own files (dealt as TensorFlow deals them), positions id, id + 2, ...: no
        crops = [{i.tobytes() for x, _ in seen[w] for i in x} for w in (0, 1)]  # shared crop
        assert not crops[0] & crops[1]


def test_normalization_in_the_step_and_in_the_export(splits):
    norm = splits.normalization
    assert norm == inputs.IMAGENET_NORMALIZATION
    pixels = tf.constant(np.arange(256 * 3, dtype=np.int64).reshape(1, 16, 16, 3) % 256, tf.uint8)
    expected = ((pixels.numpy().astype(np.float64) - np.array(norm.mean)) /
                np.array(norm.std)).astype(np.float32)
    np.testing.assert_array_equal(inputs.to_float(pixels, norm).numpy(), expected)
    np.testing.assert_array_equal(tf.function(inputs.to_float)(pixels, norm).numpy(), expected)
    np.testing.assert_array_equal(tf.function(inputs.to_float, jit_compile=True)(
        pixels, norm).numpy(), expected)  # a lookup: exact on the device too
    unit = inputs.to_float(pixels).numpy()
    np.testing.assert_allclose(inputs.normalize_unit(unit, norm).numpy(), expected, atol=2e-6)
    task = ClassificationTask(dataset="imagenet", model="mlp")
    task.splits = splits
    model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)), tf.keras.layers.Flatten(),
                                 tf.keras.layers.Dense(3)])
    np.testing.assert_allclose(task.serve(model, unit).numpy(),
                               model(task.scaled(pixels)).numpy(), atol=1e-5)
    assert task.serving_spec((tf.TensorSpec([8, 16, 16, 3], tf.uint8),)).dtype == tf.float32


def test_image_folder_takes_the_same_augmentation(tree):
    plain = inputs.load("image_folder", data_dir=tree, image_size=SIZE, eval_fraction=0.25)
    cropped = inputs.load("image_folder", data_dir=tree, image_size=SIZE, eval_fraction=0.25,
                          augment="inception")
    assert plain.train.augment == "none" and not plain.train.augmented  # the default, as before
    assert cropped.train.augmented and not cropped.eval.augmented
    assert plain.normalization is None and cropped.normalization is None

    def first(split, **kwargs):
        return _take(inputs.train_batches(split, global_batch_size=6, seed=1,
                                          image_dtype="uint8", **kwargs), 4)

    a, b = first(plain.train), first(cropped.train)
    np.testing.assert_array_equal(a[0][1], b[0][1])  # the same order of examples
    assert not np.array_equal(a[0][0], b[0][0])
    for batch, resumed in zip(b[2:], first(cropped.train, start_step=2)):
        np.testing.assert_array_equal(batch[0], resumed[0])
    (x, _), = _take(inputs.eval_batches(cropped.eval, global_batch_size=6,
                                        image_dtype="uint8"), 1)
    path = cropped.eval.paths[0]
    np.testing.assert_array_equal(
        x[0], augment.eval_image(tf.io.read_file(path), SIZE).numpy())


def test_bin_converts_then_trains_and_resumes_on_the_imagenet_layout(tree, tmp_path):
    out = str(tmp_path / "converted")
    wrong = run_bin("convert_to_tfrecord", "--format=imagenet", f"--data_dir={tree}",
                    f"--output_dir={out}")
    assert_one_line_error(wrong, contains="--format=imagenet converts --source=image_folder")
    done = run_bin("convert_to_tfrecord", "--format=imagenet", "--source=image_folder",
                   f"--data_dir={tree}", f"--output_dir={out}", "--num_shards=2")
    assert done.returncode == 0, done.stderr[-2000:]
    common = ["--dataset=imagenet", f"--data_dir={out}", f"--image_size={SIZE}", "--model=cnn",
              "--strategy=mirrored", "--devices=cpu:0,cpu:1", "--global_batch_size=4",
              "--steps_per_loop=2", "--checkpoint_interval=2", "--summary_interval=0",
              "--seed=3", "--deterministic", "--mode=train", "--noexport"]
    resumed, straight = str(tmp_path / "resumed"), str(tmp_path / "straight")
    for model_dir, steps in ((resumed, 2), (resumed, 6), (straight, 6)):
        done = run_bin("train", *common, f"--model_dir={model_dir}", f"--train_steps={steps}")
        assert done.returncode == 0, done.stderr[-2000:]
        assert "dataset imagenet: 2 files (19 examples) to train on" in done.stdout, done.stdout
    metrics = json.load(open(os.path.join(resumed, "metrics.json")))
    assert metrics["step"] == 6 and metrics["start_step"] == 2
    # Stopped at step 2 and resumed: the crops and flips an uninterrupted run trained on
    # (19 examples, 4 a step: the stop and the end sit in different epochs).
    a, b = tf.train.load_checkpoint(resumed), tf.train.load_checkpoint(straight)
    names = [n for n in a.get_variable_to_shape_map() if n.startswith("model_weights/")]
    assert names
    for name in names:
        np.testing.assert_allclose(a.get_tensor(name), b.get_tensor(name), rtol=1e-6, atol=1e-7)
