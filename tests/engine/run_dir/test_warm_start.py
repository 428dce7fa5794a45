"""`--init_from`: a new run takes another model's weights and nothing else.

Every source kind (a run's model_dir, a checkpoint prefix, an export folder or
its root, a .keras file, a .weights.h5 file) loads exactly the source's
weights into a model built under `MirroredStrategy` over the session's four
logical CPUs, every replica's copy included; a Keras model arrives compiled,
and its optimizer's variables are neither counted as weights nor loaded. Every
refusal is one line that names the first offending variable, and leaves the
model untouched.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfloop.engine.run_dir import checkpointing, export
from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir.warm_start import load_initial_weights


@pytest.fixture(scope="module")
def strategy(cpu_devices):
    return tf.distribute.MirroredStrategy(cpu_devices)


def mlp(hidden=8, outputs=3, extra_layer=False):
    """Dense 4 -> hidden -> outputs (-> outputs)."""
    layers = [keras.Input((4,)), keras.layers.Dense(hidden, activation="relu"),
              keras.layers.Dense(outputs)]
    if extra_layer:
        layers.append(keras.layers.Dense(outputs))
    return keras.Sequential(layers)


class TwoModels(tf.Module):
    """Several Keras models in one trackable, as a GAN task holds them."""

    def __init__(self, hidden=8):
        super().__init__()
        self.generator = mlp(hidden)
        self.critic = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    @property
    def trainable_variables(self):
        return self.generator.trainable_variables + self.critic.trainable_variables


def randomize(model, seed):
    """Gives every weight a value of its own; returns the values."""
    rng = np.random.default_rng(seed)
    for variable in model_weights(model):
        variable.assign(rng.standard_normal(variable.shape).astype(np.float32))
    return values(model)


def model_weights(model):
    if isinstance(model, TwoModels):
        return model.generator.weights + model.critic.weights
    return model.weights


def values(model):
    return [np.array(variable.numpy()) for variable in model_weights(model)]


def assert_weights(model, expected, replicas=4):
    """`model` (built under the 4-replica strategy) holds `expected` on every device."""
    for variable, value in zip(model_weights(model), expected, strict=True):
        copies = variable.value.values  # the MirroredVariable's per-device variables
        assert len(copies) == replicas
        for copy in copies:
            np.testing.assert_array_equal(copy.numpy(), value)


def build_under(strategy, make):
    """A fresh model built under the strategy; a Keras one compiled, as a Task's may arrive."""
    with strategy.scope():
        model = make()
        if isinstance(model, keras.Model):
            model.compile(optimizer="adam", loss="mse")
    return model


def write_run(model_dir, model, steps):
    """An engine-style model_dir with ckpt-<step> for each step; returns each step's weights."""
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    global_step = tf.Variable(0, dtype=tf.int64)
    _, manager = checkpointing.create(model=model, optimizer=optimizer, global_step=global_step,
                                      directory=str(model_dir), max_to_keep=None)
    saved = {}
    for step in steps:
        saved[step] = randomize(model, seed=step)
        global_step.assign(step)
        optimizer.iterations.assign(step)
        for slot in optimizer.variables[2:]:  # Adam's moments: something to not restore
            slot.assign(tf.ones_like(slot))
        manager.save(checkpoint_number=step)
    return saved


def write_export(directory, model, step, **kwargs):
    """`<directory>/export/<step>/` as a run exports it: a SavedModel (+ model.keras)."""
    return export.export_model(model, input_signature=tf.TensorSpec([None, 4], tf.float32),
                               directory=str(directory), step=step, **kwargs)


def assert_one_line_refusal(error, *parts):
    message = str(error.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, message


# --- each source loads exactly the weights, and nothing else -----------------

class Scaled(keras.Model):
    """A variable set on the model itself: a checkpoint stores it as model/scale."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)
        self.scale = self.add_weight(shape=(), initializer="ones", name="scale")
        self(tf.ones([1, 4]))

    def call(self, inputs):
        return self.dense(inputs) * self.scale


@pytest.mark.parametrize("make, count, root", [
    (mlp, 4, None), (TwoModels, 6, None), (Scaled, 3, None), (mlp, 4, "ram://warm_start/run"),
], ids=["mirrored_keras_model", "module_of_two_models", "variable_on_the_model",
        "another_filesystem"])
def test_a_model_dir_loads_its_latest_checkpoint(tmp_path, strategy, make, count, root):
    """A run folder: its newest checkpoint, into a mirrored model, exactly; a
    module holding two models, a variable set on the model itself (stored as
    model/scale), and a `ram://` folder alike."""
    root = root or str(tmp_path / "run")
    saved = write_run(root, make(), steps=[10, 20])
    model = build_under(strategy, make)
    randomize(model, seed=99)

    said = load_initial_weights(model, root)

    assert said == f"model weights of {root}/ckpt-20 ({count} variables)"
    assert_weights(model, saved[20])


def test_a_model_dir_whose_newest_checkpoint_is_damaged_loads_the_newest_that_reads(
        tmp_path, strategy, caplog):
    root = str(tmp_path / "run")
    saved = write_run(root, mlp(), steps=[10, 20])
    with open(f"{root}/ckpt-20.index", "wb") as f:
        f.write(b"not an index")
    model = build_under(strategy, mlp)
    randomize(model, seed=99)

    with caplog.at_level("INFO"):
        said = load_initial_weights(model, root)

    assert said == f"model weights of {root}/ckpt-10 (4 variables)"
    assert_weights(model, saved[10])
    assert "ckpt-20 is damaged" in caplog.text and "starting from ckpt-10" in caplog.text
    for step in (10, 20):  # --init_from only reads: nothing moved
        assert os.path.exists(f"{root}/ckpt-{step}.index")

    with open(f"{root}/ckpt-10.index", "wb") as f:
        f.write(b"not an index")
    with pytest.raises(ConfigError) as error:
        load_initial_weights(model, root)
    assert_one_line_refusal(error, f"--init_from={root} holds checkpoints and none of them reads",
                            "ckpt-20:", "ckpt-10:")


@pytest.mark.parametrize("suffix", ["", ".index"])
def test_checkpoint_prefix_loads_that_checkpoint(tmp_path, strategy, suffix):
    saved = write_run(tmp_path / "run", mlp(), steps=[10, 20, 30])
    model = build_under(strategy, mlp)

    load_initial_weights(model, str(tmp_path / "run" / "ckpt-20") + suffix)

    assert_weights(model, saved[20])


def test_export_folder_loads_its_model_keras(tmp_path, strategy):
    source = mlp()
    expected = randomize(source, seed=1)
    write_export(tmp_path, source, step=7)
    model = build_under(strategy, mlp)

    said = load_initial_weights(model, str(tmp_path / "export" / "7"))

    assert said == f"model weights of {tmp_path / 'export' / '7' / 'model.keras'} (4 variables)"
    assert_weights(model, expected)


def test_export_root_picks_the_highest_step(tmp_path, strategy):
    source = mlp()
    randomize(source, seed=9)
    write_export(tmp_path, source, step=9)
    expected = randomize(source, seed=10)
    write_export(tmp_path, source, step=10)  # 10 > 9, though "10" < "9"
    model = build_under(strategy, mlp)

    said = load_initial_weights(model, str(tmp_path / "export"))

    assert str(tmp_path / "export" / "10" / "model.keras") in said
    assert_weights(model, expected)


def test_an_export_of_a_module_without_model_keras_is_refused(tmp_path, strategy):
    # Its SavedModel names variables by position (_all_variables/N), not by model path.
    write_export(tmp_path, TwoModels(), step=3,
                 serving_fn=lambda models, inputs: models.critic(models.generator(inputs)))
    model = build_under(strategy, TwoModels)
    before = values(model)

    with pytest.raises(ConfigError) as error:
        load_initial_weights(model, str(tmp_path / "export"))

    assert_one_line_refusal(error, f"--init_from={tmp_path / 'export'} is an export without "
                            "model.keras; point --init_from at the run's --model_dir")
    assert_weights(model, before)


class _NoConfig(keras.layers.Layer):
    """A layer whose argument cannot be written into a config: its model has no model.keras."""

    def __init__(self, table, **kwargs):
        super().__init__(**kwargs)
        self.table = table

    def call(self, inputs):
        return inputs


def test_an_export_of_a_keras_model_without_model_keras_is_refused(tmp_path, strategy):
    source = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), _NoConfig(object())])
    path = write_export(tmp_path, source, step=3)
    assert export.KERAS_FILENAME not in tf.io.gfile.listdir(path)
    model = build_under(strategy, mlp)
    before = values(model)

    with pytest.raises(ConfigError) as error:
        load_initial_weights(model, path)

    assert_one_line_refusal(error, "export without model.keras", "the run's --model_dir")
    assert_weights(model, before)


@pytest.mark.parametrize("file_name", ["model.keras", "model.weights.h5"])
def test_keras_files_load_exactly_their_weights(tmp_path, strategy, file_name, recwarn):
    source = mlp()
    source.compile(optimizer="adam", loss="mse")  # the file then holds optimizer state too
    source.fit(np.ones((8, 4)), np.ones((8, 3)), verbose=0)
    expected = values(source)
    path = str(tmp_path / file_name)
    source.save(path) if file_name.endswith(".keras") else source.save_weights(path)
    model = build_under(strategy, mlp)
    with strategy.scope():  # as many optimizer variables as the source's: Keras would load them
        model.optimizer.build(model.trainable_variables)
    optimizer_before = [variable.numpy() for variable in model.optimizer.variables]

    said = load_initial_weights(model, path)

    assert said == f"model weights of {path} (4 variables)"
    assert_weights(model, expected)
    for variable, before in zip(model.optimizer.variables, optimizer_before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), before)  # not the source's step, moments
    assert not [w for w in recwarn if "optimizer" in str(w.message)]  # nor a skipped-load warning


# --- mismatches: one line naming the first offender, nothing written -------------

def write_source(kind, tmp_path):
    """A Dense 4 -> 8 -> 3 source of `kind`; returns what --init_from names."""
    source = mlp()
    randomize(source, seed=1)
    if kind == "checkpoint":
        write_run(tmp_path / "run", source, steps=[1])
        return str(tmp_path / "run")
    if kind == "export":
        write_export(tmp_path, source, step=1)
        return str(tmp_path / "export")
    path = str(tmp_path / ("model.keras" if kind == "keras" else "model.weights.h5"))
    source.save(path) if kind == "keras" else source.save_weights(path)
    return path


KINDS = ["checkpoint", "export", "keras", "h5"]

#: The tests that only read `sources` (a refused or a partial load writes nothing there).
READS_SOURCES = pytest.mark.xdist_group("test_warm_start_sources")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """`write_source` of each kind, written once for the module in one folder
    (their names differ: run/, export/, model.keras, model.weights.h5)."""
    folder = tmp_path_factory.mktemp("sources")
    return {kind: write_source(kind, folder) for kind in KINDS}


@READS_SOURCES
@pytest.mark.parametrize("kind", KINDS)
def test_a_shape_mismatch_names_the_variable(sources, strategy, kind):
    path = sources[kind]
    model = build_under(strategy, lambda: mlp(outputs=5))  # the first layer still fits
    before = values(model)

    with pytest.raises(ConfigError) as error:
        load_initial_weights(model, path)

    kernel = model.layers[1].kernel.path
    assert_one_line_refusal(error, f"--init_from={path} does not fit this model",
                            f"{kernel} is (8, 3) there but (8, 5) here")
    assert_weights(model, before)  # not even the layer that fits was written


@READS_SOURCES
@pytest.mark.parametrize("kind", KINDS)
def test_a_variable_the_source_lacks_is_named(sources, strategy, kind):
    path = sources[kind]
    model = build_under(strategy, lambda: mlp(extra_layer=True))
    before = values(model)

    with pytest.raises(ConfigError) as error:
        load_initial_weights(model, path)

    assert_one_line_refusal(error, f"has no value for {model.layers[2].kernel.path}",
                            "holds 4 variables, the model has 6")
    assert_weights(model, before)


@READS_SOURCES
@pytest.mark.parametrize("kind", KINDS)
def test_values_the_model_has_no_place_for_are_refused(sources, strategy, kind):
    path = sources[kind]
    smaller = lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(8)])  # noqa: E731
    model = build_under(strategy, smaller)
    before = values(model)

    with pytest.raises(ConfigError) as error:
        load_initial_weights(model, path)

    assert_one_line_refusal(error, "holds 4 variables, the model has 2", "nothing here takes")
    assert_weights(model, before)


def test_checkpoint_into_a_module_of_another_shape_names_the_variable(tmp_path, strategy):
    write_run(tmp_path / "run", TwoModels(), steps=[1])
    model = build_under(strategy, lambda: TwoModels(hidden=16))

    with pytest.raises(ConfigError) as error:
        load_initial_weights(model, str(tmp_path / "run"))

    kernel = model.generator.layers[0].kernel.path
    assert_one_line_refusal(error, f"{kernel} is (4, 8) there but (4, 16) here")


# --- paths that hold nothing usable -------------------------------------------------

def test_a_path_that_does_not_exist_is_refused(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_initial_weights(mlp(), str(tmp_path / "nowhere"))
    assert_one_line_refusal(error, "nowhere does not exist", "point it at a run's --model_dir")


@pytest.mark.parametrize("name", ["empty_dir", "notes.txt"])
def test_a_path_with_nothing_recognisable_is_refused(tmp_path, name):
    path = tmp_path / name
    path.mkdir() if name == "empty_dir" else path.write_text("hello")
    with pytest.raises(ConfigError) as error:
        load_initial_weights(mlp(), str(path))
    assert_one_line_refusal(error, "holds no checkpoint, export, .keras or .weights.h5 file")


@pytest.mark.parametrize("state", [bytes(range(256)), b'model_checkpoint_path: "model.ckpt"\n'],
                         ids=["garbled", "naming_a_checkpoint_without_a_step"])
def test_a_checkpoint_file_that_names_no_checkpoint_there_is_refused(tmp_path, state):
    (tmp_path / "checkpoint").write_bytes(state)
    with pytest.raises(ConfigError) as error:
        load_initial_weights(mlp(), str(tmp_path))
    assert_one_line_refusal(error, "has a 'checkpoint' file but none of the checkpoints it lists")


def test_a_file_that_is_not_what_its_name_says_is_refused(tmp_path):
    (tmp_path / "model.keras").write_text("not a zip")
    with pytest.raises(ConfigError) as error:
        load_initial_weights(mlp(), str(tmp_path / "model.keras"))
    assert_one_line_refusal(error, "is not a .keras archive")


def test_weights_h5_into_a_module_is_refused(tmp_path):
    mlp().save_weights(str(tmp_path / "model.weights.h5"))
    with pytest.raises(ConfigError) as error:
        load_initial_weights(TwoModels(), str(tmp_path / "model.weights.h5"))
    assert_one_line_refusal(error, "only a Keras model can load", "is a TwoModels",
                            "a run's --model_dir (its checkpoint)")


# --- partial warm start: --init_from_skip_mismatch ------------------------------

@READS_SOURCES
@pytest.mark.parametrize("kind", KINDS)
def test_skip_mismatch_loads_the_body_and_skips_the_new_head(sources, strategy, kind, caplog):
    """Fine-tuning 3 classes -> 5: the first layer comes from the source, the
    head keeps its fresh values, and each variable is logged, loaded or skipped."""
    path = sources[kind]
    model = build_under(strategy, lambda: mlp(outputs=5))
    fresh = values(model)

    with caplog.at_level("INFO", logger="tfloop.engine.run_dir.warm_start"):
        said = load_initial_weights(model, path, skip_mismatch=True)

    assert said.endswith("(2 variables loaded, 2 skipped)"), said
    reference = mlp()
    randomize(reference, seed=1)  # the source's values
    expected = values(reference)[:2] + fresh[2:]
    assert_weights(model, expected)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("--init_from:")]
    body, head = model.layers[0], model.layers[1]
    assert f"--init_from: loaded  {body.kernel.path}" in lines
    assert f"--init_from: loaded  {body.bias.path}" in lines
    assert f"--init_from: skipped {head.kernel.path} ((8, 3) there, (8, 5) here)" in lines
    assert f"--init_from: skipped {head.bias.path} ((3,) there, (5,) here)" in lines
    assert len(lines) == 4


@READS_SOURCES
def test_skip_mismatch_still_refuses_a_source_of_which_nothing_fits(sources, strategy):
    path = sources["checkpoint"]
    model = build_under(strategy, lambda: mlp(hidden=6, outputs=5))  # every shape differs
    before = values(model)
    with pytest.raises(ConfigError) as error:
        load_initial_weights(model, path, skip_mismatch=True)
    assert_one_line_refusal(error, "none of its variables fits this model", "4 skipped")
    assert_weights(model, before)


def test_skip_mismatch_without_init_from_is_refused():
    from tfloop.engine.config import RunConfig

    with pytest.raises(ConfigError, match="give --init_from too"):
        RunConfig(init_from_skip_mismatch=True)
