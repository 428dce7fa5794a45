"""`engine.assembly.plan.make_plan`: every check before anything is built or written.

The plan's contract: it reads and decides, it never writes (a refused request
leaves no `model_dir`, an accepted one finds it as it was); it settles the
replicas, the mode and the checkpoint to resume from once, for everything
built after it; its `describe` is the run's start-up line. Each refusal of an
impossible request: tests/engine/assembly/test_run_refusals.py; `--epochs` and the
batch arithmetic: tests/engine/assembly/test_run_length.py; which role locks:
tests/engine/run_dir/test_run_lock.py. In process, on the session's 4
logical CPUs; nothing is trained.
"""

import os

import pytest
import tensorflow as tf

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.batching import decide_batch
from tfloop.engine.assembly.plan import make_plan, spec_sections
from tfloop.engine.run_dir import run_lock
from train_only_task import TrainOnly

FOUR = "cpu:0,cpu:1,cpu:2,cpu:3"


def _config(model_dir, **flags):
    return RunConfig(**{"model_dir": str(model_dir), "devices": FOUR,
                        "collective": "reduce_to_one_device", "global_batch_size": 32, **flags})


def test_a_plan_settles_the_run_and_writes_nothing(tmp_path):
    plan = make_plan(_config(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    assert (plan.devices, plan.replicas) == (["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"], 4)
    # The built-in synthetic dataset has an eval split: outside a cluster the default
    # mode trains and evaluates; the single process is its own chief and locks model_dir.
    assert plan.mode == "train_and_evaluate" and plan.lock == run_lock.TRAIN
    assert not plan.role.in_cluster and plan.input_workers == 1
    assert plan.latest_checkpoint is None and plan.config.global_batch_size == 32
    assert plan.describe(plan.replicas).startswith(
        "mirrored over 4 replica(s) [cpu:0,cpu:1,cpu:2,cpu:3], collective "
        "reduce_to_one_device, global batch 32 (8 per replica)")


def _checkpoints(model_dir, steps):
    """A run's checkpoints `ckpt-<step>` (what a model_dir holds after training)."""
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(global_step=step),
                                         str(model_dir), max_to_keep=5, step_counter=step)
    for value in steps:
        step.assign(value)
        manager.save(checkpoint_number=value)


def test_a_plan_resumes_from_the_newest_checkpoint_and_leaves_the_folder_as_it_was(tmp_path):
    model_dir = tmp_path / "run"
    _checkpoints(model_dir, [3, 6])
    before = {name: (model_dir / name).stat().st_mtime_ns for name in os.listdir(model_dir)}
    plan = make_plan(_config(model_dir, mode="evaluate"))
    assert plan.latest_checkpoint == str(model_dir / "ckpt-6")
    assert plan.lock == run_lock.EVALUATE  # --mode=evaluate locks against a second evaluator
    assert {name: (model_dir / name).stat().st_mtime_ns
            for name in os.listdir(model_dir)} == before


def test_evaluate_without_a_checkpoint_is_one_line_and_writes_nothing(tmp_path):
    with pytest.raises(ConfigError, match=r"--mode=evaluate found no checkpoint in "
                       r"--model_dir=.*; train first or point --model_dir at a trained run"):
        make_plan(_config(tmp_path / "run", mode="evaluate"))
    assert not (tmp_path / "run").exists()


def test_the_mode_follows_the_tasks_eval_split(tmp_path):
    assert make_plan(_config(tmp_path / "run"), TrainOnly()).mode == "train"
    with pytest.raises(ConfigError, match=r"--mode=train_and_evaluate needs an eval split, and "
                       r"task TrainOnly has none; use --mode=train"):
        make_plan(_config(tmp_path / "run", mode="train_and_evaluate"), TrainOnly())
    assert not (tmp_path / "run").exists()


class _FortyEight:
    """A task's train split of known size, all decide_batch reads of it."""
    train_examples = 48


def test_the_batch_is_decided_and_refused_in_one_place():
    """decide_batch resolves a per-replica request and checks the batch it
    made against the train split in the same call (the flag's own range is
    its option's check; the contradicting requests, RunConfig's)."""
    batching = decide_batch(RunConfig(per_replica_batch_size=12), 4, task=_FortyEight())
    assert (batching.global_batch_size, batching.per_replica_batch_size) == (48, 12)
    with pytest.raises(ConfigError) as error:
        decide_batch(RunConfig(per_replica_batch_size=16), 4, task=_FortyEight())
    assert str(error.value) == (
        "--global_batch_size=64 is larger than the 48 examples _FortyEight trains on: each "
        "step would repeat examples; use a batch of at most 48")
    assert decide_batch(RunConfig(global_batch_size=64), 4).global_batch_size == 64  # no task


def test_a_plan_carries_run_json_as_read_and_hands_each_room_its_values(tmp_path):
    """Plain data, read once: what the rooms below get are typed values
    taken from the plan, never the plan itself."""
    from tfloop.engine.run_dir import run_identity

    model_dir = tmp_path / "run"
    model_dir.mkdir()
    assert make_plan(_config(model_dir)).run_json is None  # a new run
    run_identity.write(_config(model_dir), None, start_step=0)
    plan = make_plan(_config(model_dir, seed=5))
    assert plan.run_json == run_identity.load(str(model_dir))
    assert plan.run_json["ranges"][0]["global_batch_size"] == 32
    inputs = plan.inputs
    assert (inputs.global_batch_size, inputs.replicas, inputs.input_workers,
            inputs.pipeline_index, inputs.seed, inputs.run_json) == (32, 4, 1, 0, 5,
                                                                     plan.run_json)
    trainer = plan.for_trainer
    assert (trainer.sections, trainer.role, trainer.collective, trainer.inputs) == (
        spec_sections(plan.config), plan.role, plan.collective, inputs)
    assert (trainer.sections.loop, trainer.sections.step) == (plan.config.loop, plan.config.step)
    watched = plan.watched
    assert (watched.cluster, watched.hparams, watched.role, watched.compares_workers,
            watched.loop_runs_here) == (plan.config.cluster, plan.config.as_dict(), plan.role,
                                        False, True)


def test_the_start_up_line_shows_the_batch_as_decided(tmp_path):
    """`describe` takes the per-replica numbers from the plan's `Batching`
    (decided once), here micro-batches that --max_per_replica_batch_size
    chose, not from the flags."""
    plan = make_plan(_config(tmp_path / "run", max_per_replica_batch_size=4))
    assert (plan.batching.accumulation_steps, plan.config.accumulation_steps) == (2, 2)
    assert plan.batching.describe() == "global batch 32 (8 per replica in 2 micro-batches of 4)"
    assert ", collective reduce_to_one_device, " + plan.batching.describe() in plan.describe(4)
    assert decide_batch(RunConfig(global_batch_size=12), 3).describe() == (
        "global batch 12 (4 per replica)")
    assert not (tmp_path / "run").exists()


def test_the_plan_decides_and_asks_the_run_directory_once():
    """Issue 41 item 2: the batch arithmetic (engine.assembly.batching) and
    the file-system refusals (engine.run_dir.refusals) live apart, and the
    plan makes one call into engine/run_dir/ (`plan_reading.read_for_plan`),
    where it made 18; plan.py stays at most 400 lines."""
    import re

    from tfloop.engine.assembly import plan as plan_lib

    source = open(plan_lib.__file__).read()
    assert len(source.splitlines()) <= 400
    run_dir_modules = sorted(name[:-3] for name in os.listdir(
        os.path.dirname(plan_lib.__file__) + "/../run_dir") if name.endswith(".py"))
    calls = re.findall(rf"\b({'|'.join(run_dir_modules)})\.[A-Za-z_]+\(", source)
    assert calls == ["plan_reading"]
