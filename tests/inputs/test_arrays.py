"""NumPy arrays as a task's data (`inputs.ArrayData`, `inputs.from_npz`):
dtypes kept (floats float32, never uint8), dict features and sample weights,
seeded shuffling, exact resume, eval once in order, one-line refusals."""

import io

import numpy as np
import pytest
import tensorflow as tf

from tfloop.inputs import ArrayData, InputContext, InputError, from_npz

N = 20


def _arrays(count=N, seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        features={"pixels": rng.uniform(0, 1, (count, 4, 4)),  # float64, as NumPy makes them
                  "age": rng.integers(0, 90, count).astype(np.int32),
                  "id": np.arange(count)},
        targets=rng.normal(size=(count, 2)),
        sample_weight=rng.integers(0, 3, count),
    )


def _context(batch=6, seed=1, start_step=0, **fields):
    return InputContext.create(global_batch_size=batch, seed=seed, start_step=start_step,
                               **fields)


def _batches(ds, count):
    return [tf.nest.map_structure(lambda t: t.numpy(), element) for element in ds.take(count)]


def _ids(batches):
    return np.concatenate([features["id"] for features, *_ in batches])


def test_elements_keep_dtypes_and_rows_line_up():
    arrays = _arrays()
    data = ArrayData(**arrays)
    spec = data.train_dataset(_context()).element_spec
    features, targets, weights = spec
    assert features["pixels"] == tf.TensorSpec((6, 4, 4), tf.float32)  # not uint8, not float64
    assert features["age"] == tf.TensorSpec((6,), tf.int32)
    assert features["id"] == tf.TensorSpec((6,), tf.int64)
    assert targets == tf.TensorSpec((6, 2), tf.float32)
    assert weights == tf.TensorSpec((6,), tf.float32)
    for features, targets, weights in _batches(data.train_dataset(_context()), 4):
        rows = features["id"]  # every array's row i of a batch is the same example
        np.testing.assert_array_equal(features["pixels"],
                                      arrays["features"]["pixels"][rows].astype(np.float32))
        np.testing.assert_array_equal(features["age"], arrays["features"]["age"][rows])
        np.testing.assert_array_equal(targets, arrays["targets"][rows].astype(np.float32))
        np.testing.assert_array_equal(weights, arrays["sample_weight"][rows])
    # A plain array pair without weights: Keras's (x, y), uint8 images stay uint8.
    images = np.zeros((N, 3, 3, 1), np.uint8)
    plain = ArrayData(features=images, targets=np.arange(N) % 2)
    assert plain.train_dataset(_context()).element_spec == (
        tf.TensorSpec((6, 3, 3, 1), tf.uint8), tf.TensorSpec((6,), tf.int64))
    assert plain.describe() == "20 train examples (no eval split)"
    assert plain.eval_dataset(_context()) is None and not plain.has_eval


def test_train_stream_is_seeded_reshuffled_each_epoch_and_resumes_exactly():
    data = ArrayData(**_arrays())
    straight = _ids(_batches(data.train_dataset(_context()), 10))  # 60 ids: three epochs
    epochs = straight.reshape(3, N)
    for epoch in epochs:
        assert sorted(epoch) == list(range(N))  # every example once per epoch
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[0], np.arange(N))
    np.testing.assert_array_equal(_ids(_batches(data.train_dataset(_context()), 10)), straight)
    assert not np.array_equal(_ids(_batches(data.train_dataset(_context(seed=2)), 1)),
                              straight[:6])
    # Resumed at step 4 (24 examples in: inside the second epoch) it goes on exactly.
    context = _context(start_step=4)
    resumed = _batches(data.train_dataset(context), 6)
    assert context.start_step_read
    np.testing.assert_array_equal(_ids(resumed), straight[24:])
    assert all(len(features["id"]) == 6 for features, *_ in resumed)  # full batches only
    # `file`/`off` sharding over 2 pipelines: a worker consumes 3 of its examples a step.
    off = _batches(data.train_dataset(_context(start_step=4, shard_policy="off",
                                               num_input_pipelines=2)), 2)
    np.testing.assert_array_equal(_ids(off), straight[12:24])


def test_eval_counts_every_example_once_in_order_with_a_partial_last_batch():
    train, held = _arrays(), _arrays(count=7, seed=1)
    data = ArrayData(**train, eval_features=held["features"], eval_targets=held["targets"])
    assert data.describe() == "20 train / 7 eval examples"
    batches = _batches(data.eval_dataset(_context(batch=3)), 10)
    assert [len(t) for _, t in batches] == [3, 3, 1] and len(batches[0]) == 2  # no weights
    np.testing.assert_array_equal(np.concatenate([f["id"] for f, _ in batches]), np.arange(7))
    np.testing.assert_array_equal(np.concatenate([t for _, t in batches]),
                                  held["targets"].astype(np.float32))


def test_eval_fraction_holds_out_the_same_rows_every_time_in_stored_order():
    split = ArrayData(**_arrays(), eval_fraction=0.25)
    assert (split.num_train, split.num_eval) == (15, 5)
    held = np.concatenate([f["id"] for f, _, _ in _batches(split.eval_dataset(_context()), 5)])
    assert list(held) == sorted(held)
    again = ArrayData(**_arrays(), eval_fraction=0.25)
    np.testing.assert_array_equal(
        np.concatenate([f["id"] for f, _, _ in _batches(again.eval_dataset(_context()), 5)]),
        held)
    trained = set(_ids(_batches(split.train_dataset(_context(batch=5)), 3)))
    assert trained == set(range(N)) - set(held)


def _refusal(**kwargs):
    with pytest.raises(InputError) as info:
        ArrayData(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_mistakes_in_the_arrays_are_one_line_each():
    x, y = np.zeros((10, 3), np.float32), np.zeros(10, np.int64)
    assert "targets has 9 rows but features['a'] has 10" in _refusal(
        features={"a": x}, targets=y[:9])
    assert "features['b'] has 8 rows but features['a'] has 10" in _refusal(
        features={"a": x, "b": x[:8]}, targets=y)
    assert "sample_weight has 4 rows but features has 10" in _refusal(
        features=x, targets=y, sample_weight=np.ones(4))
    assert "features is empty (shape (0, 3))" in _refusal(features=x[:0], targets=y[:0])
    assert "targets is a scalar" in _refusal(features=x, targets=np.int64(3))
    assert "features['name'] holds <U3 values; give numbers" in _refusal(
        features={"name": np.array(["cat"] * 10)}, targets=y)
    assert "targets holds object values" in _refusal(features=x, targets=np.array([None] * 10))
    assert "features is an empty dict" in _refusal(features={}, targets=y)
    assert "sample_weight has shape (10, 1); give one weight per example" in _refusal(
        features=x, targets=y, sample_weight=np.ones((10, 1)))
    assert "sample_weight has 1 negative or non-finite value(s) (e.g. -1 at row 2)" in _refusal(
        features=x, targets=y, sample_weight=np.where(np.arange(10) == 2, -1.0, 1.0))
    assert "(e.g. nan at row 0)" in _refusal(
        features=x, targets=y, sample_weight=np.full(10, np.nan))
    assert "eval_fraction=1.0 must be at least 0 and below 1" in _refusal(
        features=x, targets=y, eval_fraction=1.0)
    assert "not both" in _refusal(features=x, targets=y, eval_features=x, eval_targets=y,
                                  eval_fraction=0.5)
    assert "give both eval_features and eval_targets" in _refusal(
        features=x, targets=y, eval_features=x)
    assert "eval_features rows are float32 (4,) but features rows are float32 (3,)" in _refusal(
        features=x, targets=y, eval_features=np.zeros((5, 4)), eval_targets=y[:5])
    assert "eval_targets rows are int32 () but targets rows are int64 ()" in _refusal(
        features=x, targets=y, eval_features=x, eval_targets=y.astype(np.int32))
    assert "eval_targets has 3 rows but eval_features has 10" in _refusal(
        features=x, targets=y, eval_features=x, eval_targets=y[:3])
    assert "needs at least 2 examples" in _refusal(features=x[:1], targets=y[:1],
                                                   eval_fraction=0.5)


def _write_npz(path, **arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(buffer.getvalue())
    return path


def test_from_npz_reads_any_gfile_path_and_maps_keys():
    arrays = _arrays()
    path = _write_npz("ram://arrays/data.npz", x=arrays["features"]["pixels"],
                      age=arrays["features"]["age"], y=arrays["targets"],
                      w=arrays["sample_weight"], x_test=arrays["features"]["pixels"][:4],
                      age_test=arrays["features"]["age"][:4], y_test=arrays["targets"][:4])
    data = from_npz(path, features={"pixels": "x", "age": "age"}, targets="y",
                    sample_weight="w", eval_features={"pixels": "x_test", "age": "age_test"},
                    eval_targets="y_test")
    assert data.describe() == "20 train / 4 eval examples"
    (features, targets), = _batches(data.eval_dataset(_context(batch=8)), 2)
    np.testing.assert_array_equal(features["pixels"],
                                  arrays["features"]["pixels"][:4].astype(np.float32))
    np.testing.assert_array_equal(targets, arrays["targets"][:4].astype(np.float32))

    def refusal(path, **keys):
        with pytest.raises(InputError) as info:
            from_npz(path, **{"features": "x", "targets": "y", **keys})
        assert "\n" not in str(info.value)
        return str(info.value)

    assert ("ram://arrays/data.npz has no array 'label' (for targets); it has: age, age_test, "
            "w, x, x_test, y, y_test") in refusal(path, targets="label")
    assert "ram://arrays/data.npz: sample_weight has 4 rows but features has 20" in refusal(
        path, sample_weight="age_test")
    assert "ram://arrays/missing.npz does not exist" in refusal("ram://arrays/missing.npz")
    with tf.io.gfile.GFile("ram://arrays/text.npz", "wb") as f:
        f.write(b"not a zip file at all")
    assert "text.npz is not a readable .npz file" in refusal("ram://arrays/text.npz")
