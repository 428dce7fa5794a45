"""Fixtures shared by the engine's tests."""

import shutil

import pytest


@pytest.fixture(scope="module")
def trained(request, tmp_path_factory):
    """A finished run of the test module's own `SMALL` config (trained once
    per module), for tests that plant links in a copy of it or damage one
    (`trained_copy`) instead of training again."""
    from tfloop.engine.assembly.run import run
    from tfloop.engine.config import RunConfig

    model_dir = tmp_path_factory.mktemp("trained") / "run"
    run(RunConfig(model_dir=str(model_dir), **request.module.SMALL))
    return model_dir


@pytest.fixture
def trained_copy(trained, tmp_path):
    """A copy of `trained` in this test's own folder (its lock left behind)."""
    return shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("*.lock"))


@pytest.fixture
def victim(tmp_path):
    """A folder outside the run, which a planted link points at: a file, a
    subfolder and a SavedModel-like name, whose listing and bytes a test checks
    are unchanged (tests/engine/run_dir/test_links.py, runtime/test_files.py)."""
    folder = tmp_path / "victim"
    (folder / "sub").mkdir(parents=True)
    (folder / "thesis.tex").write_bytes(b"precious\n")
    (folder / "sub" / "data.bin").write_bytes(b"\x00\x01")
    (folder / "saved_model.pb").write_bytes(b"not yours")
    return folder


@pytest.fixture
def mirrored_trainer(cpu_devices):
    """`make(dataset, features, outputs)`: a `Trainer` of one Dense layer under
    a MirroredStrategy on the session's first two logical CPUs (ring
    all-reduce, SGD), for tests that trace or block its loop
    (loop/test_trainer.py, loop/test_step_phase.py)."""
    import keras
    import tensorflow as tf

    from tfloop import collectives
    from tfloop.engine.loop.trainer import Trainer

    def make(dataset, features, outputs):
        devices = cpu_devices[:2]
        strategy = tf.distribute.MirroredStrategy(devices)
        with strategy.scope():
            model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(outputs)])
            step = tf.Variable(0, dtype=tf.int64,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        return Trainer(strategy=strategy, model=model, global_step=step,
                       collective=collectives.create("ring", devices=devices),
                       train_dataset=dataset, global_batch_size=8,
                       optimizer=keras.optimizers.SGD(0.1))

    return make
