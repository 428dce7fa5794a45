"""A resumed run that changes its flags does so explicitly: the learning rate
and the global batch take effect with a log line (the data resuming after
the examples actually trained on), the optimizer is refused in one line,
and `run.json` records what each range of steps was trained with."""

import json
import logging
import shutil

import numpy as np
import pytest
import tensorflow as tf

from helpers import assert_one_line_error, run_bin
from tfloop.engine.run_dir import run_identity
from tfloop.engine.loop import task_inputs
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.run import run
from tfloop.engine.task import ClassificationTask, Task
from tfloop.inputs import InputContext


def _config(model_dir, **overrides):
    settings = dict(strategy="default", devices="cpu:0", model_dir=str(model_dir),
                    global_batch_size=8, train_steps=4, steps_per_loop=2, checkpoint_interval=2,
                    summary_interval=0, mode="train", export=False, seed=3)
    settings.update(overrides)
    return RunConfig(**settings)


class Recording(ClassificationTask):
    """The built-in task, recording what each train dataset was told to skip."""

    skipped: list = []

    def train_dataset(self, context):
        Recording.skipped.append(context.examples_to_skip)
        return super().train_dataset(context)

    def probe_dataset(self, context):
        return None  # what the run's data was told, not an input-rate probe's pipeline


def _run(config):
    return run(config, task=Recording.from_config(config))


#: One trained run, read by several tests: each resumes a copy of it.
SHARED = pytest.mark.xdist_group("test_resume_changes_trained_4")


@pytest.fixture(scope="module")
def trained_4(tmp_path_factory):
    """`_config`'s 4 steps (the default optimizer, adam, its default learning
    rate and numerics), trained once with `Recording`, for the tests that
    resume from such a run: each resumes its own copy (`_copy`)."""
    model_dir = tmp_path_factory.mktemp("trained_4") / "run"
    Recording.skipped = []
    _run(_config(model_dir))
    assert Recording.skipped == [0]  # a new run skips nothing
    return model_dir


def _copy(trained, tmp_path):
    """A copy of the shared run in this test's own folder (its lock left behind)."""
    return shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("*.lock"))


def test_a_changed_rate_and_batch_take_effect_are_logged_and_recorded(tmp_path, caplog):
    model_dir = tmp_path / "run"
    Recording.skipped = []
    _run(_config(model_dir, learning_rate=0.01))
    with caplog.at_level(logging.INFO, logger="tfloop"):
        _run(_config(model_dir, learning_rate=0.02, global_batch_size=16, train_steps=8))
    messages = [r.getMessage() for r in caplog.records]
    assert any("learning rate 0.01 -> 0.02 from step 4" in m for m in messages), messages
    assert any("--global_batch_size=16 differs from the 8" in m for m in messages), messages
    assert any("resumes after the 32 examples steps 1..4 trained on" in m for m in messages)
    # 4 steps of 8 examples, not 4 of 16: the data continues where it stopped.
    assert Recording.skipped == [0, 32]
    ranges = json.loads((model_dir / "run.json").read_text())["ranges"]
    assert [(r["from_step"], r["global_batch_size"], r["learning_rate"], r["optimizer"])
            for r in ranges] == [(0, 8, 0.01, "adam"), (4, 16, 0.02, "adam")]
    # Resumed again with the same flags: no new range; the skip counts both.
    _run(_config(model_dir, learning_rate=0.02, global_batch_size=16, train_steps=10))
    assert Recording.skipped[-1] == 4 * 8 + 4 * 16
    assert len(json.loads((model_dir / "run.json").read_text())["ranges"]) == 2


@SHARED
def test_a_resumed_run_reads_run_json_once_and_hands_it_down(trained_4, tmp_path, monkeypatch):
    """The plan reads run.json; the identity check, the batch decision, the
    numerics of a --deterministic resume, the data's skip and the new range
    all take that value (`Plan.run_json`), not a read of their own. (The
    first run, `trained_4`, skipped 0 examples: the fixture asserts it.)"""
    from tfloop.engine.run_dir import layout

    model_dir = _copy(trained_4, tmp_path)
    Recording.skipped = []
    reads = []
    read_json = layout.read_json

    def counting(path):
        if str(path).endswith(layout.RUN_JSON):
            reads.append(path)
        return read_json(path)

    monkeypatch.setattr(layout, "read_json", counting)
    _run(_config(model_dir, global_batch_size=16, train_steps=6, deterministic=True))
    assert len(reads) == 1, reads
    assert Recording.skipped == [4 * 8]  # the first range's batch, from the plan's value
    ranges = json.loads((model_dir / "run.json").read_text())["ranges"]
    assert [(r["from_step"], r["global_batch_size"]) for r in ranges] == [(0, 8), (4, 16)]


def test_a_range_that_never_reached_a_checkpoint_is_replaced(tmp_path):
    model_dir = str(tmp_path)
    tf.io.gfile.makedirs(model_dir)
    run_identity.write(_config(model_dir), None, start_step=0)
    run_identity.write(_config(model_dir, global_batch_size=16), run_identity.load(model_dir),
                       start_step=4)
    # That run died before saving past step 2; this one resumes there with 32.
    run_identity.write(_config(model_dir, global_batch_size=32), run_identity.load(model_dir),
                       start_step=2)
    stored = run_identity.load(model_dir)
    assert [(r["from_step"], r["global_batch_size"]) for r in stored["ranges"]] == [(0, 8),
                                                                                  (2, 32)]
    assert run_identity.examples_trained(stored, 6, 32) == 2 * 8 + 4 * 32
    # A run.json from before ranges: one range of its batch size.
    assert run_identity.examples_trained({"global_batch_size": 8}, 5, 64) == 40
    assert run_identity.examples_trained(None, 5, 64) == 320


def test_run_json_holds_a_run_id_made_with_the_run_and_kept_by_every_resume(tmp_path):
    """Which run a model_dir holds, not only where it is: a model_dir made again
    at the same path gets another id (engine.run_dir.local_checkpoints)."""
    model_dir = str(tmp_path)
    run_identity.write(_config(model_dir), None, start_step=0)
    first = run_identity.run_id(run_identity.load(model_dir))
    assert first and len(first) == 32
    run_identity.write(_config(model_dir), run_identity.load(model_dir), start_step=4,
                       run_id_if_new="f" * 32)
    assert run_identity.run_id(run_identity.load(model_dir)) == first
    run_identity.write(_config(model_dir), {"ranges": []}, start_step=0, run_id_if_new="f" * 32)
    assert run_identity.run_id(run_identity.load(model_dir)) == "f" * 32  # one from before ids
    run_identity.write(_config(model_dir), None, start_step=0)
    assert run_identity.run_id(run_identity.load(model_dir)) not in (first, "f" * 32)


class Counting(Task):
    """Examples 0, 1, 2, ... in order; the builder ignores start_step."""

    def build_model(self):
        raise NotImplementedError

    def train_dataset(self, context):
        ids = tf.data.Dataset.range(10**6).map(lambda i: tf.cast(i, tf.float32)).repeat()
        return ids.batch(context.global_batch_size, drop_remainder=True)


@pytest.mark.parametrize("trained, first", [(12, 12), (16, 16)], ids=["mid_batch", "whole"])
def test_the_engine_skips_exactly_the_examples_trained_on(trained, first):
    """3 steps of 4 then a batch of 8: the stream resumes at example 12, not 24."""
    context = InputContext.create(start_step=3, examples_trained=trained, global_batch_size=8)
    batch = next(iter(task_inputs.train_dataset(Counting(), context)))
    np.testing.assert_array_equal(batch.numpy(), np.arange(first, first + 8))


@SHARED
def test_another_optimizer_on_resume_is_refused_naming_the_stored_one(trained_4, tmp_path):
    model_dir = _copy(trained_4, tmp_path)  # trained with --optimizer=adam (the default)
    assert json.loads((model_dir / "run.json").read_text())["ranges"][0]["optimizer"] == "adam"
    before = (model_dir / "run.json").read_bytes()
    with pytest.raises(ConfigError) as error:
        run(_config(model_dir, optimizer="sgd", train_steps=6))
    message = str(error.value)
    assert "--optimizer=sgd cannot resume" in message and "--optimizer=adam" in message
    assert f"--init_from={model_dir} --model_dir=<a new directory>" in message
    assert "\n" not in message
    assert (model_dir / "run.json").read_bytes() == before
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-4")


def test_bin_train_remembers_the_optimizer_and_refuses_another(tmp_path):
    model_dir = tmp_path / "run"
    run(_config(model_dir, optimizer="momentum"))
    common = [f"--model_dir={model_dir}", "--strategy=default", "--devices=cpu:0",
              "--global_batch_size=8", "--mode=train", "--noexport", "--steps_per_loop=2"]
    result = run_bin("train", *common, "--train_steps=6")  # --optimizer from run.json
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from" in result.stdout
    refused = run_bin("train", *common, "--train_steps=8", "--optimizer=adam")
    assert_one_line_error(refused, contains="--optimizer=adam cannot resume")
    assert refused.returncode == 2


def test_run_json_records_the_numerics_and_a_deterministic_resume_on_others_says_so(
        tmp_path, caplog):
    """Exact equality needs the same threads per replica and CPU instruction
    set: run.json records both per range, and a `--deterministic` run resumed
    with others (here: checkpoints written on an SSE4.1 host) says so in
    one line and resumes."""
    model_dir = tmp_path / "run"
    _run(_config(model_dir, deterministic=True))
    stored = json.loads((model_dir / "run.json").read_text())
    numerics = stored["ranges"][0]["numerics"]
    assert numerics["threads_per_replica"] == tf.config.threading.get_intra_op_parallelism_threads()
    assert numerics["cpu_isa"] and numerics["cpu"]
    # Same numerics: resumes without a word, and no new range.
    with caplog.at_level(logging.INFO, logger="tfloop"):
        _run(_config(model_dir, deterministic=True, train_steps=6))
    assert not [r for r in caplog.records if "--deterministic:" in r.getMessage()]
    assert len(json.loads((model_dir / "run.json").read_text())["ranges"]) == 1
    stored = json.loads((model_dir / "run.json").read_text())
    stored["ranges"][0]["numerics"].update(cpu_isa="sse41", threads_per_replica=7)
    (model_dir / "run.json").write_text(json.dumps(stored))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tfloop"):
        result = _run(_config(model_dir, deterministic=True, train_steps=8))
    assert result["step"] == 8
    lines = [r.getMessage() for r in caplog.records if "--deterministic:" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert f"threads_per_replica 7 -> {numerics['threads_per_replica']}" in lines[0]
    assert f"cpu_isa sse41 -> {numerics['cpu_isa']}" in lines[0]
    ranges = json.loads((model_dir / "run.json").read_text())["ranges"]
    assert [r["from_step"] for r in ranges] == [0, 6]  # the new numerics start a range


@SHARED
def test_a_resume_that_is_not_deterministic_does_not_warn(trained_4, tmp_path, caplog):
    model_dir = _copy(trained_4, tmp_path)
    stored = json.loads((model_dir / "run.json").read_text())
    stored["ranges"][0]["numerics"]["cpu_isa"] = "sse41"
    (model_dir / "run.json").write_text(json.dumps(stored))
    with caplog.at_level(logging.INFO, logger="tfloop"):
        _run(_config(model_dir, train_steps=6))
    assert not [r for r in caplog.records if "--deterministic:" in r.getMessage()]
