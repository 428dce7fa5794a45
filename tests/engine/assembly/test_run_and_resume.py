"""`engine.assembly.run`: checkpoints on interval boundaries, resume, metrics.json, summaries."""

import glob
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tfloop.engine.config import RunConfig
from tfloop.engine.assembly.run import run


def _config(model_dir, **overrides):
    settings = dict(
        strategy="mirrored", devices="cpu:0,cpu:1", collective="reduce_to_one_device",
        model="mlp", dataset="synthetic", model_dir=str(model_dir), global_batch_size=32,
        train_steps=30, steps_per_loop=7, checkpoint_interval=10, summary_interval=5,
        optimizer="adam", learning_rate=1e-3, seed=5,
        export=False,  # read back by the ram:// test only, which exports
    )
    settings.update(overrides)
    return RunConfig(**settings)


def _weights(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    names = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith("model_weights/"))
    assert len(names) == 6, names  # the mlp's three kernels and biases
    return {n: reader.get_tensor(n) for n in names}, int(reader.get_tensor(
        "global_step/.ATTRIBUTES/VARIABLE_VALUE"))


def _scalar_tags(directory):
    tags = set()
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(value.tag for value in event.summary.value)
    return tags


def test_stopped_run_resumes_where_it_stopped_and_matches_an_uninterrupted_one(tmp_path):
    first = run(_config(tmp_path / "resumed", train_steps=30, mode="train"))
    assert first["step"] == 30 and first["resumed_from"] is None
    # Loops are cut at checkpoint boundaries even though steps_per_loop is 7.
    names = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "resumed" / "ckpt-*.index")))
    assert names == ["ckpt-10.index", "ckpt-20.index", "ckpt-30.index"]

    second = run(_config(tmp_path / "resumed", train_steps=50, mode="train"))
    assert second["start_step"] == 30
    assert second["resumed_from"].endswith("ckpt-30")
    assert second["step"] == 50
    resumed, step = _weights(tmp_path / "resumed")
    assert step == 50  # the checkpoint's global step says so

    straight_through = run(_config(tmp_path / "straight", train_steps=50, mode="train"))
    assert straight_through["step"] == 50
    uninterrupted, _ = _weights(tmp_path / "straight")
    # Same data position (skipped batches) and restored Adam slots: same weights.
    for name in uninterrupted:
        np.testing.assert_allclose(resumed[name], uninterrupted[name], rtol=1e-5, atol=1e-7)


def test_metrics_json_and_summaries(tmp_path):
    result = run(_config(tmp_path, train_steps=20, eval_interval=10))
    with open(tmp_path / "metrics.json") as f:
        written = json.load(f)
    assert written["step"] == 20
    for key in ("examples_per_second", "train/loss", "train/accuracy", "eval/loss", "eval/accuracy"):
        assert key in written, key
    assert written["eval/examples"] == 2048  # the whole synthetic eval split
    assert written["examples_per_second"] > 0
    assert result["train/loss"] == written["train/loss"]
    assert {"loss", "accuracy", "steps_per_second", "examples_per_second"} <= _scalar_tags(
        tmp_path / "summaries" / "train")
    assert {"loss", "accuracy"} <= _scalar_tags(tmp_path / "summaries" / "eval")


@pytest.fixture(scope="module")
def trained_10(tmp_path_factory):
    """A run trained to step 10 only (no evaluation), for the tests that run again
    in a copy of it: (its folder, what it returned)."""
    model_dir = tmp_path_factory.mktemp("trained_10") / "run"
    return model_dir, run(_config(model_dir, train_steps=10, mode="train"))


def _copy(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.xdist_group("test_run_and_resume_trained_10")  # trained_10, trained once
def test_rerun_at_the_final_step_trains_nothing_and_evaluates(trained_10, tmp_path):
    model_dir = _copy(trained_10[0], tmp_path)
    again = run(_config(model_dir, train_steps=10))
    assert again["step"] == 10 and again["start_step"] == 10
    assert "eval/accuracy" in again


@pytest.mark.xdist_group("test_run_and_resume_trained_10")
def test_evaluate_mode_reads_the_latest_checkpoint(trained_10, tmp_path):
    trained_dir, trained = trained_10
    assert "eval/loss" not in trained
    evaluated = run(_config(_copy(trained_dir, tmp_path), mode="evaluate"))
    assert evaluated["step"] == 10
    assert evaluated["eval/examples"] == 2048


def test_a_run_on_another_tf_filesystem_trains_resumes_and_reads_back():
    """--model_dir may be any registered TF filesystem (gs://, ...): here TensorFlow's
    in-memory ram://, read back only through tf.io.gfile."""
    model_dir = "ram://tfloop-test/run"
    flags = dict(strategy="mirrored", devices="cpu:0,cpu:1", global_batch_size=64,
                 steps_per_loop=10, checkpoint_interval=10, summary_interval=10,
                 model_dir=model_dir)
    # The first run only trains (the second's evaluation, summaries and export are read back).
    first = run(RunConfig(train_steps=20, mode="train", export=False, **flags))
    second = run(RunConfig(train_steps=30, **flags))
    assert (first["step"], second["step"]) == (20, 30)
    assert second["resumed_from"] == f"{model_dir}/ckpt-20"
    assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-30"
    with tf.io.gfile.GFile(f"{model_dir}/metrics.json") as f:
        record = json.load(f)
    assert record["step"] == 30 and record["start_step"] == 20 and "eval/accuracy" in record
    for kind in ("train", "eval"):
        assert tf.io.gfile.glob(f"{model_dir}/summaries/{kind}/events.out.tfevents.*")
    # The end-of-training export, served from ram:// as well.
    assert second["export"] == f"{model_dir}/export/30"
    served = tf.saved_model.load(second["export"]).signatures["serving_default"](
        inputs=tf.zeros([3, 28, 28, 1]))
    assert served["outputs"].shape == (3, 10)
