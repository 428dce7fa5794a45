"""Damaged data is one line naming the file (and record) before training
where a cheap check sees it, and when the pipeline reads it otherwise:
TFRecord shards (foreign, truncated, emptied, corrupted inside, wrong label
or image size), image files that do not decode, labels and NaNs in arrays."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tfloop import inputs
from tfloop.inputs import InputError, RecordData, data_errors, framing, image_folder, tfrecord
from helpers import write_image_folder, write_tfrecord_dir

SHARD = "train-00002-of-00004.tfrecord"


@pytest.fixture
def records(tmp_path):
    return write_tfrecord_dir(str(tmp_path / "records"), num_shards=4, num_train=64, num_eval=16)


def _load_error(data_dir) -> str:
    with pytest.raises(InputError) as info:
        inputs.load("tfrecord", data_dir=data_dir)
    message = str(info.value)
    assert "\n" not in message
    return message


def _metadata(data_dir, edit=None) -> dict:
    path = os.path.join(data_dir, tfrecord.METADATA)
    meta = json.load(open(path))
    if edit is not None:
        edit(meta)
        json.dump(meta, open(path, "w"))
    return meta


def _records_of(path) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(path)]


def _rewrite(path, records) -> None:
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


def _example(image: np.ndarray, label: int) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={
        tfrecord.IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[tf.io.encode_png(image).numpy()])),
        tfrecord.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()


def _drop_shard_sizes(data_dir) -> None:
    """Version 1 metadata: the split's total count only."""
    def edit(meta):
        for entry in meta["splits"].values():
            entry.pop("counts"), entry.pop("bytes")
    _metadata(data_dir, edit)


def test_the_converter_records_each_shards_count_and_size(records):
    train = _metadata(records)["splits"]["train"]
    assert train["counts"] == [16, 16, 16, 16] and sum(train["counts"]) == train["count"]
    assert train["bytes"] == [os.path.getsize(os.path.join(records, f)) for f in train["files"]]
    assert [framing.count_records(os.path.join(records, f)) for f in train["files"]] == [16] * 4


@pytest.mark.parametrize("damage, says", [
    ("random", "holds 3100 bytes but metadata.json says"),
    ("text", "holds 1900 bytes but metadata.json says"),
    ("truncated", "holds 15164 bytes but metadata.json says"),
    ("empty", "holds 0 bytes but metadata.json says"),
])
def test_a_damaged_shard_is_refused_at_load_naming_it(records, damage, says):
    path = os.path.join(records, SHARD)
    data = open(path, "rb").read()
    replacement = {"random": np.random.default_rng(0).bytes(3100),
                   "text": b"hello this is text\n" * 100,
                   "truncated": data[:-100], "empty": b""}[damage]
    open(path, "wb").write(replacement)
    message = _load_error(records)
    assert message.startswith(f"{path} {says}"), message
    assert "(16 records): the shard is truncated or was replaced" in message


def test_same_size_garbage_fails_the_first_header_checksum(records):
    path = os.path.join(records, SHARD)
    size = os.path.getsize(path)
    open(path, "wb").write(np.random.default_rng(1).bytes(size))
    assert _load_error(records) == (
        f"{path} is not a readable TFRecord shard (the first record's header fails its "
        "checksum); re-create the folder with bin/convert_to_tfrecord")


def test_version_1_metadata_counts_the_records_by_walking_the_headers(records):
    _drop_shard_sizes(records)
    assert len(inputs.load("tfrecord", data_dir=records).train) == 64
    path = os.path.join(records, SHARD)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-100])
    assert _load_error(records).startswith(f"{path} is damaged: record 15 (byte ")
    _rewrite(path, _records_of(os.path.join(records, "train-00001-of-00004.tfrecord"))[:10])
    assert _load_error(records) == (
        f"--data_dir={records}: the train shards hold 58 records (train-00000-of-00004.tfrecord: "
        "16, train-00001-of-00004.tfrecord: 16, train-00002-of-00004.tfrecord: 10, "
        "train-00003-of-00004.tfrecord: 16) but metadata.json says 64; re-create the folder "
        "with bin/convert_to_tfrecord")
    open(path, "wb").close()
    assert "holds no record (0 bytes)" in _load_error(records)


def test_an_unreadable_shard_is_refused_at_load_naming_it(records):
    _drop_shard_sizes(records)  # a folder's size would differ from version 2's first
    path = os.path.join(records, SHARD)
    os.remove(path)
    os.mkdir(path)  # in the shard's place: listed, but it cannot be read
    message = _load_error(records)
    assert message.startswith(f"{path} cannot be read (FailedPreconditionError: "), message
    assert message.endswith("; re-create the folder with bin/convert_to_tfrecord")


def test_a_first_record_with_a_bad_label_or_size_is_refused_at_load(records):
    _drop_shard_sizes(records)
    path = os.path.join(records, SHARD)
    rest = _records_of(path)[1:]
    _rewrite(path, [_example(np.zeros((28, 28, 1), np.uint8), 12)] + rest)
    assert _load_error(records) == (
        f"{path} record 0: label 12 is outside [0, 10), the num_classes of metadata.json; fix "
        "the labels or the metadata")
    _rewrite(path, [_example(np.zeros((28, 28, 1), np.uint8), -1)] + rest)
    assert "record 0: label -1 is outside [0, 10)" in _load_error(records)
    _rewrite(path, [_example(np.zeros((32, 28, 1), np.uint8), 3)] + rest)
    assert _load_error(records) == (
        f"{path} record 0: the image is 32x28 but metadata.json says 28x28; re-create the "
        "folder with bin/convert_to_tfrecord")


@pytest.mark.parametrize("record, says", [
    (lambda: _example(np.zeros((28, 28, 1), np.uint8), 1_000_000_000),
     "record 5: label 1000000000 is outside [0, 10), the num_classes of metadata.json"),
    (lambda: _example(np.zeros((20, 28, 1), np.uint8), 3),
     "record 5: the image is 20x28 but metadata.json says 28x28"),
])
def test_a_later_bad_record_stops_the_pipeline_naming_file_and_index(records, record, says):
    _drop_shard_sizes(records)
    path = os.path.join(records, SHARD)
    kept = _records_of(path)
    kept[5] = record()
    _rewrite(path, kept)
    split = inputs.load("tfrecord", data_dir=records).train  # record 0 is fine
    for batches in (inputs.train_batches(split, global_batch_size=8, seed=0).take(8),
                    inputs.eval_batches(split, global_batch_size=8)):
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            for _ in batches:
                pass
        named = data_errors.explain(info.value)
        assert str(named) == f"{path} {says}" + ("; fix the labels or the metadata" if "label" in says
                                                 else "; re-create the folder with bin/convert_to_tfrecord")


def test_corruption_inside_a_record_is_traced_to_its_file_after_the_failure(records):
    path = os.path.join(records, SHARD)
    data = bytearray(open(path, "rb").read())
    offsets, offset = [], 0
    while offset < len(data):  # record starts
        offsets.append(offset)
        offset += 16 + int.from_bytes(data[offset:offset + 8], "little")
    data[offsets[7] + 40] ^= 0xFF  # inside record 7's data: same size, header intact
    open(path, "wb").write(bytes(data))
    split = inputs.load("tfrecord", data_dir=records).train  # sizes and first frames agree
    with pytest.raises(tf.errors.DataLossError) as info:
        for _ in inputs.train_batches(split, global_batch_size=8, seed=0).take(16):
            pass
    assert str(data_errors.explain(info.value)) == (
        f"{path} is damaged: record 7 (byte {offsets[7]}) fails its data checksum; re-create "
        f"or remove the file (TensorFlow: corrupted record at {offsets[7] + 12})")
    with pytest.raises(InputError, match="record 7 .* fails its data checksum"):
        with data_errors.naming():
            for _ in inputs.eval_batches(split, global_batch_size=8):
                pass


def test_record_data_refuses_any_foreign_file_and_names_a_damaged_one_mid_run(records, tmp_path):
    features = {tfrecord.IMAGE_KEY: "bytes"}
    good = os.path.join(records, "train-00000-of-00004.tfrecord")
    text = tmp_path / "notes.tfrecord"
    text.write_bytes(b"this is a text file, not records\n" * 10)
    with pytest.raises(InputError) as info:
        RecordData(train_files=[good, str(text)], features=features, label_key=tfrecord.LABEL_KEY)
    assert str(info.value) == (f"{text} is not a TFRecord file (the first record's header fails "
                               "its checksum); if it is compressed, pass compression=")
    truncated = str(tmp_path / "truncated.tfrecord")
    open(truncated, "wb").write(open(good, "rb").read()[:-30])
    data = RecordData(train_files=[good, truncated], features=features,
                      label_key=tfrecord.LABEL_KEY)
    context = inputs.InputContext.create(global_batch_size=8, num_replicas=1, seed=0)
    with pytest.raises(InputError) as info:
        with data_errors.naming():
            for _ in data.train_dataset(context).take(8):
                pass
    assert str(info.value).startswith(f"{truncated} is damaged: record 15 (byte ")
    assert "is cut short" in str(info.value) and "truncated record at" in str(info.value)


def test_an_image_that_does_not_decode_is_named_after_the_failure(tmp_path):
    root = write_image_folder(tmp_path / "pets", classes=("cats", "dogs"), per_class=4)
    jpeg = os.path.join(root, "dogs", "dogs.1.jpg")
    data = open(jpeg, "rb").read()
    open(jpeg, "wb").write(data[: len(data) // 2])  # truncated: the signature still passes
    split = inputs.load("image_folder", data_dir=root, image_size=8, eval_fraction=0).train
    with pytest.raises(InputError) as info:
        with data_errors.naming():
            for _ in inputs.train_batches(split, global_batch_size=4, seed=0).take(4):
                pass
    message = str(info.value)
    assert message.startswith(f"{jpeg} cannot be decoded as an image (") and "\n" not in message
    assert image_folder.first_undecodable(split.paths) == jpeg


def _npz(path, **arrays):
    base = dict(x_train=np.zeros((30, 4, 4), np.uint8), y_train=np.arange(30) % 10,
                x_test=np.zeros((5, 4, 4), np.uint8), y_test=np.arange(5))
    base.update(arrays)
    np.savez(path / "mnist.npz", **base)
    return str(path)


def test_mnist_labels_outside_the_classes_are_one_line(tmp_path):
    def refusal(**arrays):
        with pytest.raises(InputError) as info:
            inputs.load("mnist", data_dir=_npz(tmp_path, **arrays))
        return str(info.value)

    path = str(tmp_path / "mnist.npz")
    y = np.arange(30) % 10
    assert refusal(y_train=np.where(np.arange(30) == 17, -1, y)) == (
        f"{path}: y_train[17] is -1; labels must be class indices 0, 1, ... (1 negative label(s))")
    assert refusal(y_train=np.where(np.arange(30) == 3, 10**9, y)) == (
        f"{path}: y_train's largest label is 1000000000, which makes 1000000001 classes, but no "
        "train example has label 10 (11 distinct labels); labels must be the class indices 0..N-1")
    assert refusal(y_test=np.array([0, 1, 12, 3, 4])) == (
        f"{path}: y_test[2] is 12, a class y_train never has (its labels are 0..9)")
    assert inputs.load("mnist", data_dir=_npz(tmp_path)).num_classes == 10


def test_arrays_refuse_nan_and_labels_outside_num_classes(tmp_path):
    x = np.zeros((20, 3), np.float64)
    x[13, 1] = np.nan
    y = np.arange(20) % 4
    with pytest.raises(InputError) as info:
        inputs.ArrayData(features=x, targets=y)
    assert str(info.value) == ("features holds 1 NaN or infinite value(s), the first in row 13; "
                               "fix or drop those rows")
    x[13, 1] = 0
    bad = np.where(np.arange(20) == 6, 9, y)
    np.savez(tmp_path / "data.npz", x=x, y=bad)
    with pytest.raises(InputError) as info:
        inputs.from_npz(str(tmp_path / "data.npz"), features="x", targets="y", num_classes=4)
    assert str(info.value) == (f"{tmp_path / 'data.npz'}: targets[6] is 9, outside [0, 4) "
                               "(num_classes=4); 1 row(s) outside")
    with pytest.raises(InputError, match=r"features\['a'\] holds 1 NaN or infinite"):
        inputs.ArrayData(features={"a": np.where(np.arange(20) == 0, np.inf, 0.0)}, targets=y)
    assert inputs.ArrayData(features=x, targets=y, num_classes=4).num_train == 20
