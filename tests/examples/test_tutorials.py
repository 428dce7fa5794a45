"""The tutorials' scripts run on two logical CPUs with at most two changed
lines (issue 31 item 12): TF's "Multi-worker training with Keras" single-worker
cells (examples/mwms_tutorial/) and TF's MirroredStrategy note
(examples/mirrored_strategy_note.py). Keras's multi-GPU guide:
test_keras_guide.py. The MWMS tutorial's main.py runs on two workers under
bin/launch with two changed lines, counted by `diff` against the tutorial's own
code (tests/examples/originals/), as is the note.

Each runs as its user runs it, in a process of its own and its own folder
(`tutorials.run_script`: a fork of the binary server, TensorFlow's runtime not
yet started, as in a fresh interpreter; under bin/launch, the workers are the
launcher's fresh interpreters); the engine's start-up line says what `fit`
trained on.
"""

import os

import keras
import numpy as np
import tensorflow as tf

from helpers import REPO, write_digits_npz
from tutorials import changed_lines, diff_lines, run_script

MWMS = os.path.join(REPO, "examples", "mwms_tutorial")
NOTE = os.path.join(REPO, "examples", "mirrored_strategy_note.py")
#: The documents' own code, as written, to count the lines changed with `diff`.
ORIGINALS = os.path.join(REPO, "tests", "examples", "originals")
AI_PLATFORM = os.path.join(REPO, "examples", "ai_platform", "task.py")


def _assert_two_changed_lines(script):
    changed = changed_lines(script)
    assert len(changed) == 2, changed
    assert changed[0].startswith("import tfloop; tfloop.use_devices(\"cpu:0,cpu:1\")")
    assert "tfloop.fit(" in changed[1]


def test_mwms_tutorial_single_worker_cells_train_on_two_logical_cpus(tmp_path):
    script = os.path.join(MWMS, "single_worker.py")
    _assert_two_changed_lines(script)
    assert changed_lines(os.path.join(MWMS, "mnist_setup.py")) == []
    write_digits_npz(str(tmp_path))  # the tutorial's mnist.npz, made locally
    (tmp_path / "tmp").mkdir()
    # TUTORIAL_STEPS: the script's steps_per_epoch (70, the tutorial's, unset).
    result = run_script(script, tmp_path, env={"TUTORIAL_STEPS": "3",
                                               "TMPDIR": str(tmp_path / "tmp")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mirrored over 2 replica(s) [cpu:0,cpu:1]" in result.stderr
    assert "global batch 64 (32 per replica)" in result.stderr  # the tutorial's batch_size
    assert [result.stdout.count(f"Epoch {e}/3") for e in (1, 2, 3)] == [1, 1, 1]
    assert "3/3" in result.stdout and "accuracy:" in result.stdout
    assert os.listdir(tmp_path / "tmp") == []  # fit's temporary run folder is gone


def test_mwms_tutorial_main_trains_on_two_workers_under_launch(tmp_path):
    script = os.path.join(MWMS, "main.py")
    # Two lines against the tutorial's own main.py (diff), the two marked # tfloop.
    changed = diff_lines(os.path.join(ORIGINALS, "mwms_tutorial_main.py"), script)
    assert changed == changed_lines(script), changed
    assert len(changed) == 2, changed
    assert changed[0] == "import tfloop  # tfloop"
    assert changed[1].startswith("tfloop.fit(multi_worker_model, multi_worker_dataset, ")
    write_digits_npz(str(tmp_path))
    (tmp_path / "tmp").mkdir()
    result = run_script(script, tmp_path, launch=("--num_workers=2", "--grace_period=5"),
                        env={"TUTORIAL_STEPS": "2", "TUTORIAL_MODEL_DIR": str(tmp_path / "model"),
                             "TMPDIR": str(tmp_path / "tmp")})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    for worker in ("worker:0", "worker:1"):
        # per_worker_batch_size 64 x 2 workers, one replica each.
        assert (f"{worker}: multi_worker over 2 replica(s)" in out
                and "global batch 128 (64 per replica)" in out), out[-3000:]
    assert [out.count(f"[worker:0] Epoch {e}/3") for e in (1, 2, 3)] == [1, 1, 1]
    assert tf.train.latest_checkpoint(str(tmp_path / "model")).endswith("ckpt-6")
    assert os.listdir(tmp_path / "tmp") == []


def test_mirrored_strategy_note_trains_on_two_logical_cpus(tmp_path):
    # Two lines against the note's own code (diff), the two marked # tfloop.
    changed = diff_lines(os.path.join(ORIGINALS, "mirrored_strategy_note.py"), NOTE)
    assert changed == changed_lines(NOTE), changed
    _assert_two_changed_lines(NOTE)
    assert changed[1] == "tfloop.fit(model, dataset, epochs=2)  # tfloop"
    result = run_script(NOTE, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Number of devices: 2" in result.stdout
    assert "mirrored over 2 replica(s) [cpu:0,cpu:1]" in result.stderr
    assert [result.stdout.count(f"Epoch {e}/2") for e in (1, 2)] == [1, 1]
    assert "sparse_categorical_accuracy:" in result.stdout


def test_a_task_py_shaped_like_the_ai_platform_posts_equals_keras_on_two_workers(
        tmp_path, monkeypatch):
    """The post's shape (its own MultiWorkerMirroredStrategy, a parallel map
    before a seeded shuffle, `strategy.num_replicas_in_sync` in the batch,
    `cluster_resolver` for where to save) with two changed lines, run on two
    workers under bin/launch. Keras's own `fit` does not run under
    MultiWorkerMirroredStrategy here (TF 2.21's Keras 3: "Attempt to convert a
    value (PerReplica...)" at its first step, the post's code and the
    tutorial's alike, measured), so Keras's numbers are its `fit` of the post's
    own model and data on the same two replicas in one process
    (MirroredStrategy): the same global batches, the same weights (1e-5)."""
    original = os.path.join(ORIGINALS, "ai_platform_task.py")
    changed = diff_lines(original, AI_PLATFORM)
    assert changed == changed_lines(AI_PLATFORM) and len(changed) == 2, changed
    write_digits_npz(str(tmp_path))
    job = tmp_path / "job"
    result = run_script(AI_PLATFORM, tmp_path, launch=("--num_workers=2", "--grace_period=5"),
                        args=("--epochs=2", "--steps-per-epoch=3", "--batch-size=16",
                              f"--job-dir={job}"))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert out.count("Number of replicas: 2") == 2, out[-3000:]  # the truth, on each worker
    assert (job / "workertemp_1" / "model.keras").exists()  # cluster_resolver said task 1
    ours = keras.saving.load_model(job / "model.keras").get_weights()

    post = _module(original)
    monkeypatch.chdir(tmp_path)
    # (reduction to one device: a fresh strategy's default collective ops can
    # take an instance key another in-process test's all-reduce holds)
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
    keras.utils.set_random_seed(1)  # as the post, before its model
    with strategy.scope():
        model = post.create_model()
    model.fit(post.create_dataset(16 * 2), epochs=2, steps_per_epoch=3, verbose=0)
    theirs = model.get_weights()
    assert len(theirs) == len(ours)
    # Within 1e-5 (1e-6 absolute): the same global batches, split over two
    # workers by the strategy's sharding there and over two replicas in order
    # here, so each replica's sums run in another order (measured: 1 weight of
    # 43264 3.4e-7 apart after 6 Adam steps), as for any two-worker comparison.
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _module(path):
    """The post's own code as a module (its functions, not its main)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ai_platform_post", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
