"""Resume on another replica count with the same global batch, exactly
(`engine.assembly.batching.decide_batch`): the accumulation steps rise or fall so that
per-replica batch x replicas x micro-batches is the recorded global batch;
the learning rate, the step and the data position go on as if uninterrupted.

Logical devices are fixed per process: the stopped run is this process's, on
its 4 logical CPUs, with the task named as `bin/train --task` names it (so
`run.json` is what a binary would write), the uninterrupted one too, on one
device; each resume (2, 1, 8) is `bin/train`. `counting_task` makes the final
weights a record of which examples each step trained on.
"""

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import counting_task
from helpers import run_bin
from tfloop.engine import run
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.batching import decide_batch

#: Where `counting_task` lives (tests/engine/, shared with tests/bin/test_lost_worker.py):
#: the binaries import it from there.
ENGINE_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, STEPS, STOP = 16, 8, 4
FLAGS = [*counting_task.flags(steps=STEPS), "--steps_per_loop=2", "--checkpoint_interval=2"]


def _env():
    return {"PYTHONPATH": os.pathsep.join([ENGINE_TESTS, os.environ.get("PYTHONPATH", "")])}


def _weights(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    names = sorted(n for n in reader.get_variable_to_shape_map()
                   if n.startswith("model_weights/"))
    assert len(names) == 5, names  # counts; hidden kernel, bias; head kernel, bias
    step = int(reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE"))
    return {n: reader.get_tensor(n) for n in names}, step


def _steps_seen(weights):
    return counting_task.steps_seen(counting_task.counts_of(weights), steps=STEPS)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    config = counting_task.reference_config(str(model_dir), batch=BATCH, steps=STEPS,
                                            devices="cpu:0", steps_per_loop=2,
                                            checkpoint_interval=2)
    run(config, task=counting_task.Counting(BATCH))
    weights, step = _weights(model_dir)
    assert step == STEPS
    assert _steps_seen(weights) == counting_task.expected_steps(batch=BATCH, steps=STEPS)
    return weights


@pytest.fixture(scope="module")
def stopped_on_four(tmp_path_factory):
    """FLAGS to step STOP on this process's 4 logical CPUs (`--task`, not a task object)."""
    model_dir = tmp_path_factory.mktemp("stopped") / "run"
    config = counting_task.reference_config(
        str(model_dir), batch=BATCH, steps=STEPS, task="counting_task:Counting",
        devices="cpu:0,cpu:1,cpu:2,cpu:3", steps_per_loop=2, checkpoint_interval=2,
        max_per_replica_batch_size=4)
    result = run(dataclasses.replace(config, train_steps=STOP))
    assert result["step"] == STOP and result["status"] == "finished"
    return model_dir


@pytest.mark.xdist_group("test_elastic_resume_stopped_on_four")  # the two module runs, once
@pytest.mark.parametrize("replicas, batch_flags, micro", [
    # fewer: 4 per replica in 2 micro-batches
    (2, ["--global_batch_size=16", "--max_per_replica_batch_size=4"], 2),
    # one device, the per-replica batch kept: 4 micro-batches of 4 (the recorded global batch)
    (1, ["--per_replica_batch_size=4"], 4),
    # more: 2 per replica, one micro-batch
    (8, ["--global_batch_size=16", "--max_per_replica_batch_size=4"], 1),
])
def test_a_run_stopped_on_four_replicas_resumes_on_another_count_exactly(
        tmp_path, uninterrupted, stopped_on_four, replicas, batch_flags, micro):
    model_dir = tmp_path / "run"
    shutil.copytree(stopped_on_four, model_dir)
    devices = ",".join(f"cpu:{i}" for i in range(replicas))
    result = run_bin("train", f"--devices={devices}", f"--model_dir={model_dir}",
                     *FLAGS, *batch_flags, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    share = BATCH // replicas
    assert (f"resuming on {replicas} replica(s) after 4: global batch 16, {share} per "
            f"replica in {micro} micro-batch(es) of {share // micro}") in result.stdout
    record = json.loads((model_dir / "run.json").read_text())
    assert record["replica_changes"] == [{"step": STOP, "from": 4, "to": replicas,
                                          "accumulation_steps": [1, micro],
                                          "global_batch_size": BATCH}]
    assert [(r["from_step"], r["replicas"], r["accumulation_steps"], r["global_batch_size"])
            for r in record["ranges"]] == [(0, 4, 1, 16), (STOP, replicas, micro, 16)]
    weights, step = _weights(model_dir)
    assert step == STEPS
    # The same examples in the same steps, at the same learning rates: exactly.
    assert _steps_seen(weights) == counting_task.expected_steps(batch=BATCH, steps=STEPS)
    for name, value in uninterrupted.items():
        difference = np.linalg.norm(weights[name] - value) / max(np.linalg.norm(value), 1e-12)
        assert difference <= 1e-5, (name, difference)


def _range(replicas, accumulation_steps=1, global_batch_size=16):
    return {"from_step": 0, "replicas": replicas, "accumulation_steps": accumulation_steps,
            "global_batch_size": global_batch_size, "schedule_replicas": replicas}


@pytest.mark.parametrize("flags, replicas, resumed, batch, micro", [
    (dict(per_replica_batch_size=4), 4, None, 16, 1),          # a new run: P x R x A
    (dict(per_replica_batch_size=4, accumulation_steps=2), 2, None, 16, 2),
    (dict(per_replica_batch_size=4), 2, _range(4), 16, 2),      # resumed: the recorded batch
    (dict(per_replica_batch_size=4), 1, _range(2, 2), 16, 4),
    (dict(max_per_replica_batch_size=4, global_batch_size=12), 3, None, 12, 1),
    (dict(max_per_replica_batch_size=4, global_batch_size=12), 2, _range(3, 1, 12), 12, 2),
    (dict(max_per_replica_batch_size=4), 8, _range(4), 16, 1),  # no --global_batch_size
    (dict(global_batch_size=16), 2, _range(4), 16, 1),          # as before: 8 per replica
])
def test_the_batch_is_decided_once_per_replica_times_replicas_times_micro_batches(
        flags, replicas, resumed, batch, micro):
    batching = decide_batch(RunConfig(**flags), replicas, resumed=resumed)
    assert (batching.global_batch_size, batching.accumulation_steps) == (batch, micro)
    assert batching.per_replica_batch_size * replicas * micro == batch
    config = batching.apply(RunConfig(**flags))
    assert (config.global_batch_size, config.accumulation_steps) == (batch, micro)


def test_a_deterministic_run_resumed_on_another_count_says_what_holds(caplog):
    config = RunConfig(per_replica_batch_size=4, deterministic=True)
    with caplog.at_level("WARNING"):
        decide_batch(config, 2, resumed=_range(4))
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith("--deterministic: resuming on 4 -> 2 replicas trains the same "
                           "examples in the same steps")
    assert "cannot be bit-identical" in line and "within 1e-5 relative" in line
    caplog.clear()
    with caplog.at_level("WARNING"):
        decide_batch(config, 4, resumed=_range(4))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_the_linear_learning_rate_scaling_keeps_the_recorded_replicas():
    config = RunConfig(per_replica_batch_size=4, scale_learning_rate="linear")
    assert decide_batch(config, 2, resumed=_range(4)).schedule_replicas == 4
    assert decide_batch(config, 2, resumed=None).schedule_replicas == 2


@pytest.mark.parametrize("flags, replicas, resumed, message", [
    (dict(per_replica_batch_size=4), 3, _range(4),
     "--per_replica_batch_size=4 on 3 replica(s) cannot make the global batch 16 this run "
     "trained with: 16 is not 4 x 3 x a whole number of micro-batches; resume on 1, 2 or 4 "
     "replica(s), or use --max_per_replica_batch_size=4 to let the per-replica batch shrink"),
    (dict(per_replica_batch_size=4), 8, _range(4), "resume on 1, 2 or 4 replica(s)"),
    (dict(max_per_replica_batch_size=4), 3, _range(4),
     "--max_per_replica_batch_size=4 cannot cut the global batch 16 over 3 replica(s): 16 "
     "does not divide by 3; use 1, 2, 4, 8 or 16 replica(s), or a global batch that divides "
     "by 3"),
    (dict(global_batch_size=16), 3, None, "--global_batch_size=16 does not divide by the 3 "
     "replicas; use a multiple of 3, e.g. 15"),
])
def test_a_batch_that_cannot_be_cut_is_refused_in_one_line_naming_what_works(
        flags, replicas, resumed, message):
    with pytest.raises(ConfigError) as error:
        decide_batch(RunConfig(**flags), replicas, resumed=resumed)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("flags, message", [
    (dict(max_per_replica_batch_size=4, per_replica_batch_size=4),
     "both set the per-replica batch; give one"),
    (dict(max_per_replica_batch_size=4, accumulation_steps=2),
     "lets the engine choose the micro-batches, and --accumulation_steps=2 fixes them"),
    (dict(max_per_replica_batch_size=-1), "--max_per_replica_batch_size=-1 must be 0 or more"),
])
def test_contradicting_batch_flags_are_refused(flags, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        RunConfig(**flags)


def test_run_json_records_each_change_against_the_range_the_steps_continue(tmp_path):
    """A resume that died before its first checkpoint trained nothing that
    counts: the next resume's change is from the range before it."""
    from tfloop.engine.run_dir import run_identity

    config = RunConfig(model_dir=str(tmp_path), global_batch_size=16)
    for step, replicas in ((0, 4), (4, 2), (4, 1), (6, 8)):
        stored = run_identity.load(str(tmp_path))
        batching = decide_batch(config, replicas, resumed=run_identity.last_range(stored))
        run_identity.write(batching.apply(config), stored, start_step=step, batching=batching)
    record = json.loads((tmp_path / "run.json").read_text())
    assert [(c["step"], c["from"], c["to"]) for c in record["replica_changes"]] == [
        (4, 4, 1), (6, 1, 8)]
    assert [(r["from_step"], r["replicas"]) for r in record["ranges"]] == [(0, 4), (4, 1), (6, 8)]
