"""`engine.run_dir.export`: a SavedModel + model.keras that serve without tfloop, on any filesystem."""

import logging
import os
import shutil
import subprocess
import sys
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import bin_env, run_python
from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir.export import export_model, export_path, latest_export

HERE = os.path.dirname(os.path.abspath(__file__))
FEATURES = {"x": tf.TensorSpec([None, 3], tf.float32), "z": tf.TensorSpec([None, 2], tf.float32)}


def _dict_model():
    x, z = keras.Input((3,), name="x"), keras.Input((2,), name="z")
    hidden = keras.layers.Dense(4, activation="relu")(keras.layers.Concatenate()([x, z]))
    hidden = keras.layers.BatchNormalization()(hidden)
    return keras.Model({"x": x, "z": z}, keras.layers.Dense(2, name="logits")(hidden))


def _batch(rows=5, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(rows, 3)).astype(np.float32),
            "z": rng.normal(size=(rows, 2)).astype(np.float32)}


def _saved_model_cli():
    return shutil.which("saved_model_cli") or os.path.join(
        os.path.dirname(sys.executable), "saved_model_cli")


def _two_tower_module():
    module = tf.Module()
    module.encoder = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh")])
    module.head = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    return module


def _two_tower_serving(module, inputs):
    hidden = module.encoder(inputs, training=False)
    return {"scores": module.head(hidden, training=False), "embedding": hidden}


def test_a_mirrored_keras_model_serves_its_own_predictions_in_a_fresh_process(
        cpu_devices, tmp_path):
    strategy = tf.distribute.MirroredStrategy(cpu_devices)
    with strategy.scope():
        model = _dict_model()
        model.compile(optimizer="adam", loss="mse")
        model.optimizer.build(model.trainable_variables)  # slots that must stay out of the export
        path = export_model(model, input_signature=FEATURES, directory=str(tmp_path), step=7)
    assert path == export_path(str(tmp_path), 7) == latest_export(str(tmp_path / "export"))
    assert sorted(os.listdir(tmp_path / "export")) == ["7"]  # no temporary folder left
    assert {"saved_model.pb", "variables", "model.keras"} <= set(os.listdir(path))
    # Only the 8 weights the signature reads (BatchNormalization's included), each once.
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    stored = [name for name in reader.get_variable_to_shape_map() if name.endswith("VALUE")]
    assert len(stored) == len(model.weights) == 8, stored

    batch = _batch()
    expected = model(batch, training=False).numpy()
    np.savez(tmp_path / "features.npz", **batch)
    served = subprocess.run(
        [sys.executable, os.path.join(HERE, "serve_export.py"), path,
         str(tmp_path / "features.npz"), str(tmp_path / "predictions.npz")],
        capture_output=True, text=True, timeout=240, cwd=str(tmp_path))
    assert served.returncode == 0, served.stderr[-3000:]
    predictions = np.load(tmp_path / "predictions.npz")
    assert np.abs(predictions["signature"] - expected).max() <= 1e-6
    assert np.abs(predictions["keras"] - expected).max() <= 1e-6

    # The installed `saved_model_cli` script itself, run as `python <script>` in a
    # process of its own: a fork of the binary server (TensorFlow imported once per
    # worker) rather than a fresh interpreter, which only the serving above needs.
    shown = run_python([_saved_model_cli(), "show", "--dir", path, "--all"], env=bin_env(),
                       cwd=str(tmp_path))
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "signature_def['serving_default']" in shown.stdout
    for name in ("inputs['x']", "inputs['z']", "outputs['outputs']"):
        assert name in shown.stdout, shown.stdout


def test_a_module_of_two_keras_models_exports_its_serving_fn_without_model_keras(
        cpu_devices, tmp_path, caplog):
    with tf.distribute.MirroredStrategy(cpu_devices).scope():
        module = _two_tower_module()
    with caplog.at_level(logging.INFO, logger="tfloop.engine.run_dir.export"):
        path = export_model(module, serving_fn=_two_tower_serving, directory=str(tmp_path), step=3,
                            input_signature=tf.TensorSpec([None, 3], tf.float32))
    assert "model.keras" not in os.listdir(path)
    assert [r.getMessage() for r in caplog.records if "not a keras.Model" in r.getMessage()]

    serve = tf.saved_model.load(path).signatures["serving_default"]
    features = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    outputs = serve(inputs=tf.constant(features))
    expected = _two_tower_serving(module, features)
    assert sorted(outputs) == ["embedding", "scores"]
    for name in outputs:
        np.testing.assert_allclose(outputs[name].numpy(), expected[name].numpy(), atol=1e-6)


def test_a_ram_filesystem_export_reads_back_and_a_second_export_of_a_step_replaces_it():
    directory = "ram://test_export/run"
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    signature = tf.TensorSpec([None, 3])
    first = export_model(model, input_signature=signature, directory=directory, step=5)
    model.layers[0].kernel.assign(tf.ones([3, 2]))
    second = export_model(model, input_signature=signature, directory=directory, step=5)
    assert first == second == "ram://test_export/run/export/5"
    assert latest_export(directory + "/export") == second
    assert tf.io.gfile.listdir("ram://test_export/run/export") == ["5"]
    features = np.random.default_rng(2).normal(size=(3, 3)).astype(np.float32)
    served = tf.saved_model.load(second).signatures["serving_default"](inputs=tf.constant(features))
    np.testing.assert_allclose(served["outputs"].numpy(), model(features).numpy(), atol=1e-6)
    reloaded = keras.models.load_model(second + "/model.keras")
    np.testing.assert_allclose(reloaded(features).numpy(), model(features).numpy(), atol=1e-6)


def test_canary_the_ram_filesystem_still_renames_no_directories():
    """When this fails, TensorFlow fixed ram:// renames: drop export._RENAMES_NO_DIRECTORIES."""
    tf.io.gfile.makedirs("ram://test_export_canary/before")
    with tf.io.gfile.GFile("ram://test_export_canary/before/file", "w") as handle:
        handle.write("x")
    tf.io.gfile.rename("ram://test_export_canary/before", "ram://test_export_canary/after")
    assert not tf.io.gfile.exists("ram://test_export_canary/after/file")


def test_a_worker_that_is_not_chief_writes_nothing_and_leaves_no_temporary_folder(
        tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    directory = tmp_path / "run"
    assert export_model(model, input_signature=tf.TensorSpec([None, 3]), directory=str(directory),
                        step=4, is_chief=False, worker_name="worker:1") is None
    assert not directory.exists()
    # Autograph writes the source of each function it first converts in a process into
    # the temporary directory (`__autograph_generated_file*.py`, never removed): its
    # file, not the export's. Run alone, or first on its worker, this test converts first.
    left = [name for name in os.listdir(scratch)
            if not name.startswith("__autograph_generated_file")]
    assert left == []


def test_latest_export_takes_the_highest_complete_step(tmp_path):
    assert latest_export(str(tmp_path / "export")) is None
    for name, complete in [("9", True), ("10", True), (".11.tmp-1a2b3c4d", True), ("12", False)]:
        tf.io.gfile.makedirs(str(tmp_path / "export" / name / "variables"))
        if complete:
            (tmp_path / "export" / name / "saved_model.pb").write_bytes(b"")
    assert latest_export(str(tmp_path / "export")) == export_path(str(tmp_path), 10)


class _Unserializable(keras.layers.Layer):
    """A custom layer with an argument Keras cannot write into a config."""

    def __init__(self, table, **kwargs):
        super().__init__(**kwargs)
        self.table = table

    def call(self, inputs):
        return inputs * 2.0


class _Unregistered(keras.layers.Layer):
    """Saves without complaint, but no process can load it back: not registered."""

    def call(self, inputs):
        return inputs * 3.0


@pytest.mark.parametrize("layer", [_Unserializable(object()), _Unregistered()],
                         ids=["no_get_config", "not_registered"])
def test_a_model_keras_cannot_save_still_exports_its_saved_model(tmp_path, caplog, layer):
    model = keras.Sequential([keras.Input((3,)), layer, keras.layers.Dense(2)])
    with caplog.at_level(logging.INFO, logger="tfloop.engine.run_dir.export"):
        path = export_model(model, input_signature=tf.TensorSpec([None, 3]),
                            directory=str(tmp_path), step=1)
    assert "model.keras" not in os.listdir(path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "register_keras_serializable" in warnings[0], warnings
    assert "\n" not in warnings[0]
    features = tf.ones([2, 3])
    served = tf.saved_model.load(path).signatures["serving_default"](inputs=features)
    np.testing.assert_allclose(served["outputs"].numpy(), model(features).numpy(), atol=1e-6)


@keras.saving.register_keras_serializable(package="tests")
class RegisteredNet(keras.Model):
    """A subclassed model, registered: its model.keras loads back."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(2)

    def call(self, inputs):
        return self.dense(inputs)


class UnregisteredNet(RegisteredNet):
    """The same, unregistered (examples/gan.py's GAN was): Could not locate class."""


def test_a_subclassed_model_says_once_how_to_make_it_saveable(tmp_path, caplog):
    saveable = RegisteredNet()
    saveable(tf.ones([1, 3]))
    path = export_model(saveable, input_signature=tf.TensorSpec([None, 3]),
                        directory=str(tmp_path / "registered"), step=1)
    assert "model.keras" in os.listdir(path)

    model = UnregisteredNet()
    model(tf.ones([1, 3]))
    with caplog.at_level(logging.INFO, logger="tfloop.engine.run_dir.export"):
        for step in (1, 2):  # e.g. the best export, then the final one
            export_model(model, input_signature=tf.TensorSpec([None, 3]),
                         directory=str(tmp_path / "not_registered"), step=step)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "no model.keras" in r.getMessage()]
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO]
    assert "Keras cannot load class 'UnregisteredNet' back; decorate it with " \
           "@keras.saving.register_keras_serializable()" in said[0][1]
    assert "\n" not in said[0][1]


def _wrong_output(model, inputs):
    return {"nested": {"logits": model(inputs)}}


@pytest.mark.parametrize("kwargs, says", [
    (dict(input_signature=None), "exporting needs input_signature"),
    (dict(input_signature={"x": (None, 3)}),
     "input_signature['x'][0] (None) must be a tf.TensorSpec"),
    (dict(input_signature=tf.TensorSpec([8, 3])), "first (batch) dimension must be None"),
    (dict(input_signature=tf.TensorSpec([None, 5])), "cannot serve input_signature"),
    (dict(input_signature=tf.TensorSpec([None, 3]), serving_fn=_wrong_output),
     "must return a tensor, a list of tensors, or a dict of tensors"),
    (dict(input_signature=tf.TensorSpec([None, 3]), step=-1), "export step (-1)"),
    (dict(input_signature={"class": tf.TensorSpec([None, 3])}),
     "input_signature['class'] would be the signature input 'class'"),
    (dict(input_signature={"my feature": tf.TensorSpec([None, 3])}),
     "input_signature['my feature'] would be the signature input 'my feature'"),
    (dict(input_signature={"a-b": tf.TensorSpec([None, 3]), "a_b": tf.TensorSpec([None, 3])}),
     "the signature inputs 'a-b' and 'a_b' would both be called 'a_b'"),
])
def test_mistakes_are_one_line_and_write_nothing(tmp_path, kwargs, says):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    arguments = dict(directory=str(tmp_path / "run"), step=2)
    arguments.update(kwargs)
    with pytest.raises(ConfigError) as raised:
        export_model(model, **arguments)
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "run").exists()


def test_a_module_without_serving_fn_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="pass serving_fn") as raised:
        export_model(_two_tower_module(), input_signature=tf.TensorSpec([None, 3]),
                     directory=str(tmp_path / "run"), step=1)
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "run").exists()


def _clipped_serving(model, inputs):
    outputs = model(inputs, training=False)
    if tf.reduce_max(outputs) > 1.0:  # a tensor condition: needs autograph
        outputs = tf.clip_by_value(outputs, -1.0, 1.0)
    return outputs


def test_a_serving_fn_with_tensor_control_flow_is_converted_by_autograph(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = export_model(model, serving_fn=_clipped_serving, directory=str(tmp_path), step=1,
                        input_signature=tf.TensorSpec([None, 3]))
    features = tf.fill([2, 3], 100.0)
    served = tf.saved_model.load(path).signatures["serving_default"](inputs=features)
    np.testing.assert_allclose(served["outputs"].numpy(), _clipped_serving(model, features).numpy())


def test_a_lookup_table_travels_with_the_export(tmp_path):
    words = keras.Input((1,), dtype="string", name="word")
    ids = keras.layers.StringLookup(vocabulary=["a", "b", "c"])(words)
    model = keras.Model(words, keras.layers.Embedding(5, 2)(ids))
    path = export_model(model, input_signature=tf.TensorSpec([None, 1], tf.string),
                        directory=str(tmp_path), step=1)
    batch = tf.constant([["b"], ["unknown"]])
    served = tf.saved_model.load(path).signatures["serving_default"](inputs=batch)
    np.testing.assert_allclose(served["outputs"].numpy(), model(batch).numpy())
