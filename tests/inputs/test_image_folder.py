"""Image folders: both layouts, labels from sorted class names, decode and resize
in tf.data, unreadable files skipped with a logged count, folder mistakes as
one line, and the folder → TFRecord conversion."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from tfloop import inputs
from helpers import write_image_folder
from tfloop.inputs import InputError, convert, image_folder, tfrecord


def test_labels_come_from_sorted_class_folders_and_a_fixed_eval_fraction(tmp_path):
    root = write_image_folder(tmp_path / "pets", classes=("dogs", "cats", "fish"))
    splits = inputs.load("image_folder", data_dir=root, image_size=16, eval_fraction=0.25)
    assert splits.class_names == ("cats", "dogs", "fish") and splits.num_classes == 3
    assert splits.input_shape == (16, 16, 3)
    assert (len(splits.train), len(splits.eval)) == (9, 3)
    both = list(zip(splits.train.paths + splits.eval.paths, splits.train.labels + splits.eval.labels))
    assert sorted(both) == sorted(
        (os.path.join(root, name, f"{name}.{i}.{'png' if i % 2 == 0 else 'jpg'}"), label)
        for label, name in enumerate(("cats", "dogs", "fish")) for i in range(4))
    # The eval split does not depend on --seed (the loader takes none), and
    # eval_fraction=0 means no eval split.
    assert inputs.load("image_folder", data_dir=root, image_size=16, seed=9,
                       eval_fraction=0.25).eval == splits.eval
    assert inputs.load("image_folder", data_dir=root, image_size=16, eval_fraction=0).eval is None


def test_train_and_validation_folders_are_the_two_splits(tmp_path):
    write_image_folder(tmp_path / "train", classes=("cats", "dogs"), per_class=3)
    write_image_folder(tmp_path / "validation", classes=("cats", "dogs"), per_class=2)
    splits = inputs.load("image_folder", data_dir=str(tmp_path), image_size=8)
    assert (len(splits.train), len(splits.eval)) == (6, 4)
    assert all("/validation/" in p for p in splits.eval.paths)
    write_image_folder(tmp_path / "bad" / "train", classes=("cats", "dogs"), per_class=1)
    write_image_folder(tmp_path / "bad" / "eval", classes=("cats", "cows"), per_class=1)
    with pytest.raises(InputError, match="has classes cats, cows but .* has cats, dogs"):
        inputs.load("image_folder", data_dir=str(tmp_path / "bad"))


def test_images_are_decoded_and_resized_in_tf_data(tmp_path):
    root = write_image_folder(tmp_path / "pets", per_class=2)
    split = inputs.load("image_folder", data_dir=root, image_size=20, eval_fraction=0).train
    (x, y), = [(x.numpy(), y.numpy()) for x, y in inputs.eval_batches(split, global_batch_size=6)]
    assert x.shape == (6, 20, 20, 3) and x.dtype == np.float32
    np.testing.assert_array_equal(y, [0, 0, 1, 1, 2, 2])
    png = tf.io.decode_png(tf.io.read_file(split.paths[0]), channels=3)
    expected = tf.image.resize(png, (20, 20)).numpy() / 255.0
    np.testing.assert_allclose(x[0], expected, atol=0.5 / 255 + 1e-6)
    batches = inputs.train_batches(split, global_batch_size=4, seed=0)
    x, y = next(iter(batches))
    assert x.shape == (4, 20, 20, 3) and 0.0 <= x.numpy().min() and x.numpy().max() <= 1.0


def test_unreadable_files_are_skipped_with_a_logged_count(tmp_path, caplog):
    root = write_image_folder(tmp_path / "pets", classes=("cats", "dogs"), per_class=2)
    good = open(os.path.join(root, "cats", "cats.0.png"), "rb").read()
    bad = {
        "empty.jpg": b"",
        "text.png": b"not an image at all",
        "truncated.png": good[: len(good) // 2],
    }
    for name, data in bad.items():
        with open(os.path.join(root, "dogs", name), "wb") as f:
            f.write(data)
    with open(os.path.join(root, "dogs", "notes.txt"), "w") as f:
        f.write("not an image name: ignored, not counted")
    with caplog.at_level(logging.WARNING, logger="tfloop"):
        splits = inputs.load("image_folder", data_dir=root, image_size=8, eval_fraction=0)
    assert len(splits.train) == 4
    assert sorted(os.path.basename(p) for p in image_folder.scan(root).skipped) == sorted(bad)
    assert "skipped 3 unreadable or non-image file(s)" in caplog.text
    # A file with a valid signature but a corrupt body is not skippable ahead
    # of time: decoding it stops the pipeline (documented in image_folder.py).
    with open(os.path.join(root, "dogs", "corrupt.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0" + b"\x00" * 64)
    split = inputs.load("image_folder", data_dir=root, image_size=8, eval_fraction=0).train
    with pytest.raises(tf.errors.InvalidArgumentError):
        for _ in inputs.eval_batches(split, global_batch_size=8):
            pass


def test_folder_mistakes_are_one_line_errors(tmp_path):
    def error(data_dir, **options):
        with pytest.raises(InputError) as info:
            inputs.load("image_folder", data_dir=data_dir, **options)
        assert "\n" not in str(info.value)
        return str(info.value)

    assert "needs --data_dir" in error("")
    assert "is not a directory" in error(str(tmp_path / "missing"))
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"\xff\xd8\xff")
    assert "has no class sub-folders" in error(str(tmp_path / "flat"))
    write_image_folder(tmp_path / "one", classes=("cats",), per_class=1)
    assert "one class folder (cats)" in error(str(tmp_path / "one"))
    write_image_folder(tmp_path / "hollow", classes=("cats",), per_class=1)
    (tmp_path / "hollow" / "dogs").mkdir()
    assert "dogs has no readable image" in error(str(tmp_path / "hollow"))
    # `bin/convert_to_tfrecord --image_size=-1` was a traceback from tf.data's
    # decode ("Dimension -1 must be >= 0"); bin/train's own flag is checked earlier.
    two = write_image_folder(tmp_path / "two", per_class=2)
    assert "--image_size=-1 must be a positive number of pixels (0 or left out: 224)" in error(
        two, image_size=-1)
    # 0 is the default size, through the registry and the loader alike.
    from tfloop.inputs import image_folder
    for splits in (inputs.load("image_folder", data_dir=two, image_size=0),
                   image_folder.load(data_dir=two, image_size=0, eval_fraction=0.2)):
        assert splits.input_shape == (224, 224, 3)


def test_image_folder_converts_to_the_same_examples_as_tfrecords(tmp_path):
    root = write_image_folder(tmp_path / "pets", per_class=3)
    out = convert.convert("image_folder", data_dir=root, output_dir=str(tmp_path / "records"),
                          num_shards=2, image_size=12, eval_fraction=0.2)
    folder = inputs.load("image_folder", data_dir=root, image_size=12, eval_fraction=0.2)
    records = inputs.load("tfrecord", data_dir=out)
    assert records.class_names == ("cats", "dogs", "fish") and records.input_shape == (12, 12, 3)
    for name in ("train", "eval"):
        decoded = [(x.numpy(), y.numpy()) for x, y in
                   image_folder.decoded(getattr(folder, name)).batch(100)][0]
        back = tfrecord.read_all(getattr(records, name))
        np.testing.assert_array_equal(back.x, decoded[0])
        np.testing.assert_array_equal(back.y, decoded[1])


def _copy_tree(local_root, target):
    for folder, _, files in os.walk(local_root):
        for name in files:
            relative = os.path.relpath(os.path.join(folder, name), local_root)
            tf.io.gfile.makedirs(os.path.dirname(f"{target}/{relative}"))
            tf.io.gfile.copy(os.path.join(folder, name), f"{target}/{relative}")


def test_a_folder_on_a_ram_filesystem_loads_decodes_and_converts_like_a_local_one(tmp_path):
    """Scanning and checking go through tf.io.gfile: ram:// here, gs:// for users."""
    root = write_image_folder(tmp_path / "pets", per_class=2)
    good = open(os.path.join(root, "cats", "cats.0.png"), "rb").read()
    with open(os.path.join(root, "dogs", "truncated.png"), "wb") as f:
        f.write(good[: len(good) // 2])
    _copy_tree(root, "ram://image_folder_test/pets")
    local = inputs.load("image_folder", data_dir=root, image_size=12, eval_fraction=0.3)
    remote = inputs.load("image_folder", data_dir="ram://image_folder_test/pets", image_size=12,
                         eval_fraction=0.3)
    assert remote.class_names == local.class_names
    for a, b in ((local.train, remote.train), (local.eval, remote.eval)):
        assert [p.replace(root, "ram://image_folder_test/pets") for p in a.paths] == list(b.paths)
        assert a.labels == b.labels
    assert [os.path.basename(p) for p in
            image_folder.scan("ram://image_folder_test/pets").skipped] == ["truncated.png"]
    out = convert.convert("image_folder", data_dir="ram://image_folder_test/pets",
                          output_dir="ram://image_folder_test/records", num_shards=2,
                          image_size=12, eval_fraction=0.3)
    back = tfrecord.read_all(inputs.load("tfrecord", data_dir=out).train)
    decoded = [(x.numpy(), y.numpy()) for x, y in image_folder.decoded(local.train).batch(100)][0]
    np.testing.assert_array_equal(back.x, decoded[0])
    np.testing.assert_array_equal(back.y, decoded[1])
    assert sorted(tf.io.gfile.listdir("ram://image_folder_test")) == ["pets", "records"]
