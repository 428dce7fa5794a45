"""The example tasks (examples/): four replicas equal one device, and a
stopped or killed run resumes to the uninterrupted weights."""

import os
import shutil
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from examples import gan, regression, two_heads, wgan_gp
from helpers import REPO, start_python, wait_for_output
from tfloop.engine.config import RunConfig
from tfloop.engine.assembly.run import run

TASKS = {
    "regression": regression.Regression,
    "two_heads": two_heads.TwoHeads,
    "gan": gan.RingGAN,
}


def _config(model_dir, *, devices="cpu:0,cpu:1,cpu:2,cpu:3", **overrides):
    settings = dict(strategy="mirrored" if "," in devices else "one_device", devices=devices,
                    model_dir=str(model_dir), global_batch_size=64, train_steps=20,
                    steps_per_loop=10, checkpoint_interval=10, learning_rate=0.01, seed=3,
                    mode="train", export=False)  # exported where a test reads the export
    settings.update(overrides)
    return RunConfig(**settings)


def _weights(result):
    return [np.asarray(w) for w in result.model.get_weights()]


def _assert_same_weights(a, b, atol):
    assert len(a) == len(b)
    worst = max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))
    assert worst <= atol, f"max abs difference {worst}"


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """`one_device(name)`: the number of replicas and the weights of the plain
    one-device run of task `name` (`_config`'s defaults), trained once per
    module: the plain run both the four-replica and the recipe comparisons read."""
    done: dict = {}

    def trained(name):
        if name not in done:
            result = run(_config(tmp_path_factory.mktemp(f"one_{name}"), devices="cpu:0"),
                         task=TASKS[name]())
            done[name] = (result["num_replicas"], _weights(result))
        return done[name]
    return trained


@pytest.fixture(scope="module")
def four_replicas(tmp_path_factory):
    """`four_replicas(name)`: the plain four-replica run of task `name`
    (`_config`'s defaults: 20 steps, checkpoints at 10 and 20, exported),
    trained once per module: (its result, its model_dir). Read by the
    comparison with one device, by the GAN's update counts (its ckpt-10 is
    the state of a 10-step run) and, copied, as the first half of a stopped
    and resumed run (the same flags; the copy leaves the export out, as the
    stopped run's `export=False` would). Nobody writes to it."""
    done: dict = {}

    def trained(name):
        if name not in done:
            model_dir = tmp_path_factory.mktemp(f"four_{name}")
            result = run(_config(model_dir, export=True), task=TASKS[name]())
            done[name] = (result, model_dir)
        return done[name]
    return trained


def _group(*names: str) -> list:
    """The parameters `names`, each in the xdist group of its task's shared
    runs (`one_device`, `four_replicas`), so that one worker trains them once."""
    return [pytest.param(n, marks=pytest.mark.xdist_group(f"example_tasks_{n}")) for n in names]


@pytest.mark.parametrize("name", _group(*sorted(TASKS)))
def test_four_replicas_equal_one_device(tmp_path, name, one_device, four_replicas):
    one_replicas, one = one_device(name)
    four, _ = four_replicas(name)
    assert four["num_replicas"] == 4 and one_replicas == 1
    initial = run(_config(tmp_path / "init", train_steps=0), task=TASKS[name]())
    moved = max(float(np.max(np.abs(x - y))) for x, y in zip(one, _weights(initial)))
    assert moved > 1e-3  # the comparison is about trained weights
    _assert_same_weights(_weights(four), one, atol=1e-5)
    # Every example's export holds model.keras (the GAN: a registered subclass).
    assert os.path.exists(os.path.join(four["export"], "model.keras"))


#: A large-batch recipe's step options, all at once.
RECIPE = dict(accumulation_steps=2, clip_norm=0.5, ema_decay=0.9, lr_schedule="cosine",
              warmup_steps=5, weight_decay=1e-3, optimizer="momentum")


@pytest.mark.parametrize("name", _group("regression", "gan"))
def test_a_recipe_on_four_replicas_equals_one_device(tmp_path, name, one_device):
    """The step options reach a user's task (the GAN: two objectives, one
    every second step) and keep N replicas equal to one device."""
    one = run(_config(tmp_path / "one", devices="cpu:0", **RECIPE), task=TASKS[name]())
    four = run(_config(tmp_path / "four", **RECIPE), task=TASKS[name]())
    _, plain = one_device(name)
    moved = max(float(np.max(np.abs(x - y))) for x, y in zip(_weights(one), plain))
    assert moved > 1e-4  # clipping changed the trajectory
    _assert_same_weights(_weights(four), _weights(one), atol=1e-5)
    assert any(key.endswith("grad_norm") for key in four)


def test_a_task_s_own_step_on_four_replicas_equals_one_device(tmp_path):
    """examples/wgan_gp.py: `Task.gradients` (a gradient penalty: a second
    backward pass inside the step) with accumulation, clipping and the
    average; the engine's one all-reduce keeps four replicas equal to one."""
    settings = dict(RECIPE, train_steps=10)
    one = run(_config(tmp_path / "one", devices="cpu:0", **settings), task=wgan_gp.RingWGAN())
    four = run(_config(tmp_path / "four", **settings), task=wgan_gp.RingWGAN())
    assert four["train/critic/penalty"] > 0  # reported by the task's own step only
    _assert_same_weights(_weights(four), _weights(one), atol=1e-5)
    raw = [four.raw_weights[w.path] for w in four.model.weights]
    _assert_same_weights(raw, [one.raw_weights[w.path] for w in one.model.weights], atol=1e-5)
    # Trained: the weights moved away from their average (result.model holds the average).
    assert max(float(np.max(np.abs(x - y))) for x, y in zip(raw, _weights(four))) > 1e-4


@pytest.mark.parametrize("name", _group("two_heads", "gan"))
def test_stopped_and_resumed_equals_uninterrupted(tmp_path, name, four_replicas):
    """Stopped at step 20 and resumed to 40 (another run call on the same
    model_dir) ends with the weights of an uninterrupted 40-step run. The first
    20 steps are the shared four-replica run (`four_replicas`: the same flags),
    copied without its export: the resume writes to the copy only."""
    _, first_half = four_replicas(name)
    shutil.copytree(first_half, tmp_path / "resumed", ignore=shutil.ignore_patterns("export"))
    assert tf.train.latest_checkpoint(str(tmp_path / "resumed")).endswith("ckpt-20")
    resumed = run(_config(tmp_path / "resumed", train_steps=40), task=TASKS[name]())
    assert resumed["start_step"] == 20 and resumed["step"] == 40
    straight = run(_config(tmp_path / "straight", train_steps=40), task=TASKS[name]())
    _assert_same_weights(_weights(resumed), _weights(straight), atol=1e-6)


@pytest.mark.xdist_group("example_tasks_gan")
def test_the_gan_updates_its_generator_every_second_step(four_replicas):
    """The GAN's 10-step state is the shared four-replica run's ckpt-10 (the
    same flags as a 10-step run: steps_per_loop 10, a checkpoint every 10)."""
    result, model_dir = four_replicas("gan")
    assert "train/generator/loss" in result and "train/discriminator/accuracy" in result
    # Each optimizer counts its own updates, and the checkpoint holds both.
    reader = tf.train.load_checkpoint(os.path.join(model_dir, "ckpt-10"))
    iterations = {name: int(reader.get_tensor(f"optimizer/{name}/_iterations/.ATTRIBUTES/"
                                              "VARIABLE_VALUE"))
                  for name in ("discriminator", "generator")}
    assert iterations == {"discriminator": 10, "generator": 5}


def test_a_killed_run_resumes_to_the_uninterrupted_weights(tmp_path):
    """bin/train --task, SIGKILLed after a checkpoint, resumed in this process."""
    model_dir = tmp_path / "killed"
    process = start_python(
        [os.path.join(REPO, "bin", "train"),
         "--task=examples.regression:Regression", "--strategy=mirrored",
         "--devices=cpu:0,cpu:1,cpu:2,cpu:3", f"--model_dir={model_dir}", "--global_batch_size=64",
         "--train_steps=1000000", "--steps_per_loop=10", "--checkpoint_interval=10",
         "--learning_rate=0.01", "--seed=3", "--mode=train"],
        env=dict(os.environ), stderr=subprocess.STDOUT)
    try:
        wait_for_output(process, "ckpt-30", timeout=180)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    killed_at = int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])
    target = killed_at + 20
    resumed = run(_config(model_dir, train_steps=target), task=regression.Regression())
    assert resumed["start_step"] == killed_at
    straight = run(_config(tmp_path / "straight", train_steps=target), task=regression.Regression())
    _assert_same_weights(_weights(resumed), _weights(straight), atol=1e-6)
