"""The best checkpoint (`model_dir/best/`) and early stopping (`engine.loop.best`).

Scripted metrics through the real Controller say exactly when training stops
and what is kept; tiny mlp runs check that the kept checkpoint holds the
weights of the best evaluation; `bin/train` killed with SIGKILL and resumed
keeps best.json and the patience count exact; two workers stop together.
"""

import glob
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys

import numpy as np
from tensorboard.backend.event_processing import plugin_event_accumulator as accumulator
import pytest
import tensorflow as tf

from tfloop.engine.loop import best
from tfloop.engine.run_dir import checkpoint_files
from tfloop.engine.loop.actions import LoopEnd
from tfloop.engine.config import RunConfig
from tfloop.engine.loop.controller import Controller
from tfloop.engine.errors import ConfigError
from tfloop.engine.assembly.run import run
from tfloop.engine.loop.contracts import AbstractEvaluator
from fakes import FakeTrainer, Recorder, step_variable
from helpers import REPO, run_bin, start_python

# eval/loss at steps 2, 4, ...: better at 4 and 8, then 10 ties (not better) and
# 12, 14 are worse: with patience 3 training stops at 14, the best is step 8.
LOSSES = {2: 5.0, 4: 3.0, 6: 4.0, 8: 2.0, 10: 2.0, 12: 2.5, 14: 3.0, 16: 1.0, 18: 0.5, 20: 0.1}


class ScriptedEvaluator(AbstractEvaluator):
    """Reports `values[step]` as `metric` at each global step."""

    def __init__(self, step, values, metric="loss"):
        self.step, self.values, self.metric = step, values, metric
        self.evaluated = []

    def evaluate(self, num_steps=-1):
        at = int(self.step.numpy())
        self.evaluated.append(at)
        return {self.metric: self.values[at], "examples": 8.0}


def _controller(model_dir, step, values, *, metric="eval/loss", mode="min", patience=3,
                start_step=None, extra_eval_actions=()):
    """A Controller over a fake trainer, the real checkpoints and KeepBest."""
    weights = tf.Variable(0.0)
    checkpoint = tf.train.Checkpoint(global_step=step, weights=weights)
    manager = tf.train.CheckpointManager(checkpoint, directory=str(model_dir), max_to_keep=None)
    keep = best.KeepBest(metric=metric, mode=mode, checkpoint=checkpoint,
                         model_dir=str(model_dir), patience=patience, start_step=start_step)
    evaluator = ScriptedEvaluator(step, values, metric.split("/")[1])

    class Trainer(FakeTrainer):
        def train(self, num_steps):
            metrics = super().train(num_steps)
            weights.assign(float(self.step.numpy()))  # the weights say which step wrote them
            return metrics

    trainer = Trainer(step)
    controller = Controller(global_step=step, trainer=trainer, evaluator=evaluator,
                            steps_per_loop=100, checkpoint_manager=manager,
                            checkpoint_interval=2,
                            eval_actions=[*extra_eval_actions, keep])
    return controller, trainer, evaluator, keep


def _files(directory):
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("mode", ["min", "max"])
def test_training_stops_at_the_patience_th_evaluation_without_improvement(tmp_path, caplog,
                                                                          mode):
    values = LOSSES if mode == "min" else {k: -v for k, v in LOSSES.items()}
    controller, trainer, evaluator, _ = _controller(tmp_path, step_variable(), values,
                                                    metric="eval/score", mode=mode)
    with caplog.at_level(logging.INFO, logger="tfloop"):
        controller.train(20, eval_interval=2)
    assert evaluator.evaluated == [2, 4, 6, 8, 10, 12, 14]  # no evaluation after the stop
    assert controller.step == 14 and trainer.loop_ends[-1] == 14
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-14")
    reason = f"eval/score has not improved for 3 evaluations (best {values[8]:.4f} at step 8)"
    assert controller.stopped_early == reason
    assert f"stopping early at step 14: {reason}" in caplog.text
    record = json.loads((tmp_path / "best" / "best.json").read_text())
    assert record == {"metric": "eval/score", "mode": mode, "value": values[8], "step": 8,
                      "checkpoint": "best/ckpt-8", "export": None}
    assert _files(tmp_path / "best") == [
        "best.json", "ckpt-8.data-00000-of-00001", "ckpt-8.index", "state.json"]
    reader = tf.train.load_checkpoint(str(tmp_path / "best" / "ckpt-8"))
    assert reader.get_tensor("weights/.ATTRIBUTES/VARIABLE_VALUE") == 8.0
    assert json.loads((tmp_path / "best" / "state.json").read_text()) == {
        "since_best": [10, 12, 14]}


def test_without_patience_the_best_is_kept_and_training_goes_on(tmp_path):
    controller, _, evaluator, keep = _controller(tmp_path, step_variable(), LOSSES, patience=0)
    controller.train(20, eval_interval=2)
    assert evaluator.evaluated[-1] == 20 and controller.stopped_early is None
    assert keep.record["step"] == 20 and keep.record["value"] == 0.1
    assert _files(tmp_path / "best")[:3] == ["best.json", "ckpt-20.data-00000-of-00001",
                                             "ckpt-20.index"]


def test_each_evaluation_comes_before_the_checkpoint_of_its_step(tmp_path):
    seen = []

    class CheckpointAbsent(Recorder):
        def __call__(self, loop):
            seen.append((loop.step, os.path.exists(tmp_path / f"ckpt-{loop.step}.index")))

    controller, *_ = _controller(tmp_path, step_variable(), LOSSES, patience=0,
                                 extra_eval_actions=[CheckpointAbsent()])
    controller.train(6, eval_interval=2)
    assert seen == [(2, False), (4, False), (6, False)]  # the last too, at the end of train
    assert os.path.exists(tmp_path / "ckpt-6.index")


def test_patience_survives_a_resume_exactly_and_a_stopped_run_trains_nothing(tmp_path,
                                                                             caplog):
    # Killed after evaluating step 12 (since: 10, 12), resumed from ckpt-10:
    # the evaluation of 12 is forgotten, made again, and the run still stops at 14.
    first, *_ = _controller(tmp_path, step_variable(), LOSSES)
    first.train(12, eval_interval=2)
    assert json.loads((tmp_path / "best" / "state.json").read_text())["since_best"] == [10, 12]
    resumed_step = step_variable(10)
    second, _, evaluator, keep = _controller(tmp_path, resumed_step, LOSSES, start_step=10)
    assert keep.since == [10]
    second.train(20, eval_interval=2)
    assert evaluator.evaluated == [12, 14] and second.step == 14
    assert second.stopped_early.startswith("eval/loss has not improved for 3 evaluations")

    third, trainer, evaluator, _ = _controller(tmp_path, step_variable(14), LOSSES,
                                               start_step=14)
    with caplog.at_level(logging.INFO, logger="tfloop"):
        third.train(20, eval_interval=2)
    assert trainer.loop_ends == [] and evaluator.evaluated == []
    assert third.stopped_early == second.stopped_early
    assert f"stopping early at step 14: {second.stopped_early}" in caplog.text


def test_a_best_newer_than_the_resumed_checkpoint_is_kept_and_not_counted(tmp_path):
    """Killed after best.json named step 8 but before ckpt-8: resumed from
    ckpt-6, steps 6 and 8 are evaluated again and neither counts against patience."""
    first, *_ = _controller(tmp_path, step_variable(), LOSSES)
    first.train(8, eval_interval=2)
    _, _, _, keep = _controller(tmp_path, step_variable(6), LOSSES, start_step=6)
    assert keep.record["step"] == 8 and keep.since == []
    for at in (6, 8, 10):
        keep(LoopEnd(start=at, step=at, target=at, num_steps=-1, seconds=0.0,
                     metrics={"loss": LOSSES[at]}))
    assert keep.record["step"] == 8 and keep.since == [10]


def test_a_non_finite_metric_never_becomes_the_best_but_counts(tmp_path):
    _, _, _, keep = _controller(tmp_path, step_variable(), {}, patience=0)
    for at, value in ((2, math.nan), (4, 3.0), (6, math.inf), (8, math.nan)):
        keep(LoopEnd(start=at, step=at, target=at, num_steps=-1, seconds=0.0,
                     metrics={"loss": value}))
    assert keep.record["step"] == 4 and keep.since == [6, 8]


def test_what_best_json_does_not_name_is_removed_at_start_up(tmp_path):
    """Left by saves killed midway: a newer checkpoint, TensorFlow's temporary
    files, a half-written best.json, a newer export and a temporary export."""
    directory = tmp_path / "best"
    (directory / "export" / "8").mkdir(parents=True)
    (directory / "export" / "12").mkdir()
    (directory / "export" / ".12.tmp-1234abcd").mkdir()
    (directory / "ckpt-12_temp").mkdir()
    for name in ("ckpt-8.index", "ckpt-8.data-00000-of-00001", "ckpt-12.index",
                 "best.json.tmp", "state.json"):
        (directory / name).write_text("x" if name != "state.json" else '{"since_best": [10]}')
    (directory / "best.json").write_text(json.dumps({
        "metric": "eval/loss", "mode": "min", "value": 2.0, "step": 8,
        "checkpoint": "best/ckpt-8", "export": "best/export/8"}))
    _controller(tmp_path, step_variable(10), LOSSES, start_step=10)
    assert _files(directory) == ["best.json", "ckpt-8.data-00000-of-00001", "ckpt-8.index",
                                 "export", "state.json"]
    assert _files(directory / "export") == ["8"]


def test_a_worker_writes_only_its_own_checkpoint_in_its_own_directory(tmp_path):
    step = step_variable(4)
    checkpoint = tf.train.Checkpoint(global_step=step)
    keep = best.KeepBest(metric="eval/loss", mode="min", checkpoint=checkpoint,
                         model_dir=str(tmp_path / "run"), write_dir=str(tmp_path / "worker"),
                         is_chief=False, patience=2)
    for at in (4, 6):
        keep(LoopEnd(start=at, step=at, target=at, num_steps=-1, seconds=0.0,
                     metrics={"loss": 10.0 - at}))
    assert not (tmp_path / "run").exists()
    assert _files(tmp_path / "worker" / "best") == ["ckpt-6.data-00000-of-00001",
                                                    "ckpt-6.index"]
    assert keep.record["step"] == 6  # decides as the chief does


@pytest.mark.parametrize("metric,expected", [
    ("eval/accuracy", "max"), ("eval/top5_accuracy", "max"), ("eval/auc", "max"),
    ("eval/precision", "max"), ("eval/recall", "max"), ("eval/f1", "max"),
    ("eval/loss", "min"), ("eval/mae", "min")])
def test_auto_mode_is_keras_rule(metric, expected):
    assert best.resolve_mode(metric, "auto") == expected
    assert best.resolve_mode(metric, "min") == "min"


# --- whole runs -------------------------------------------------------------

def _config(model_dir, **overrides):
    settings = dict(
        strategy="one_device", devices="cpu:0", model="mlp", dataset="synthetic",
        model_dir=str(model_dir), global_batch_size=32, train_steps=120, steps_per_loop=10,
        checkpoint_interval=10, eval_interval=10, eval_steps=4, summary_interval=0,
        optimizer="adam", learning_rate=0.01, seed=1, export=False, max_checkpoints=100,
        mode="train_and_evaluate", best_metric="eval/loss", early_stopping_patience=3)
    settings.update(overrides)
    return RunConfig(**settings)


def _evaluations(model_dir, tag):
    """{step: value} of `tag` in summaries/eval; a step evaluated twice keeps the later."""
    values = {}
    paths = sorted(glob.glob(os.path.join(str(model_dir), "summaries", "eval", "events.*")),
                   key=os.path.getmtime)
    for path in paths:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    values[event.step] = float(tf.make_ndarray(value.tensor))
    return dict(sorted(values.items()))


def _expected(evaluations, mode, patience):
    """(best step, best value, stop step or None): the rule applied by hand."""
    best_step = best_value = None
    since = 0
    for step, value in evaluations.items():
        if best_value is None or (value > best_value if mode == "max" else value < best_value):
            best_step, best_value, since = step, value, 0
        else:
            since += 1
            if patience and since == patience:
                return best_step, best_value, step
    return best_step, best_value, None


def _model_weights(prefix):
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(n for n in reader.get_variable_to_shape_map()
                   if n.startswith("model_weights/"))
    assert len(names) == 6, names
    return {n: reader.get_tensor(n) for n in names}


@pytest.mark.parametrize("metric,patience", [("eval/loss", 3), ("eval/accuracy", 0)])
def test_the_best_checkpoint_holds_the_weights_of_the_best_evaluation(tmp_path, metric,
                                                                      patience):
    config = _config(tmp_path, best_metric=metric, early_stopping_patience=patience,
                     export=metric == "eval/accuracy")
    result = run(config)
    mode = best.resolve_mode(metric, "auto")
    evaluations = _evaluations(tmp_path, metric.split("/")[1])
    step, value, stop = _expected(evaluations, mode, patience)
    # The run with patience does stop early, so the `if stop:` part below runs.
    assert (stop is not None) == bool(patience)
    record = json.loads((tmp_path / "best" / "best.json").read_text())
    assert (record["step"], record["mode"]) == (step, mode)
    assert np.float32(record["value"]) == np.float32(value)
    assert result["best"] == record
    with open(tmp_path / "metrics.json") as f:
        assert json.load(f)["best"] == record
    assert result["step"] == (stop or 120)
    assert (result["stopped_early"] is None) == (stop is None)
    # Every rolling checkpoint is kept (max_checkpoints=100): the best is the one of its step.
    kept = _model_weights(str(tmp_path / "best" / f"ckpt-{step}"))
    rolling = _model_weights(str(tmp_path / f"ckpt-{step}"))
    for name in kept:
        np.testing.assert_array_equal(kept[name], rolling[name])
    if config.export:
        assert record["export"] == f"best/export/{step}"
        assert os.listdir(tmp_path / "best" / "export") == [str(step)]
        assert os.path.exists(tmp_path / "best" / "export" / str(step) / "saved_model.pb")
        assert os.path.exists(tmp_path / "export" / "120" / "saved_model.pb")  # the final one
    if stop:
        again = run(config)  # the same command after an early stop trains nothing
        assert again["start_step"] == again["step"] == stop
        assert again["stopped_early"] == result["stopped_early"]
        assert again["best"] == record
        with pytest.raises(ConfigError, match="keeps its best checkpoint by eval/loss"):
            run(_config(tmp_path, best_metric="eval/accuracy", early_stopping_patience=0))


def test_the_evaluator_task_keeps_the_best_of_the_checkpoints_it_evaluates(tmp_path,
                                                                          monkeypatch):
    run(_config(tmp_path, mode="train", train_steps=20, best_metric="",
                early_stopping_patience=0))
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["localhost:1"]}, "task": {"type": "evaluator", "index": 0}}))
    with pytest.raises(ConfigError, match="evaluator task, which reads the chief's"):
        run(_config(tmp_path, train_steps=20, mode=""))
    result = run(_config(tmp_path, train_steps=20, mode="", early_stopping_patience=0,
                         eval_timeout=1))
    record = json.loads((tmp_path / "best" / "best.json").read_text())
    assert result["best"] == record and record["step"] == 20
    kept = _model_weights(str(tmp_path / "best" / "ckpt-20"))
    rolling = _model_weights(str(tmp_path / "ckpt-20"))
    for name in kept:
        np.testing.assert_array_equal(kept[name], rolling[name])


# --- bin/train ----------------------------------------------------------------

_KILL_WHEN = """
import os, signal, sys, time
path, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120
while not os.path.exists(path):
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.005)
os.kill(pid, signal.SIGKILL)
"""

KILL_FLAGS = [
    "--strategy=one_device", "--devices=cpu:0", "--model=mlp", "--dataset=synthetic",
    "--global_batch_size=64", "--train_steps=600", "--steps_per_loop=10",
    "--checkpoint_interval=10", "--eval_interval=10", "--eval_steps=4", "--summary_interval=10",
    "--learning_rate=0.003", "--best_metric=eval/loss", "--early_stopping_patience=3",
    "--max_checkpoints=100", "--deterministic", "--noexport", "--seed=1",
    "--mode=train_and_evaluate",
]


def test_after_a_kill_9_and_a_resume_best_json_and_patience_are_exact(tmp_path):
    model_dir = tmp_path / "run"
    args = [os.path.join(REPO, "bin", "train"), f"--model_dir={model_dir}", *KILL_FLAGS]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    with open(tmp_path / "out", "w") as out:
        process = start_python(args, stdout=out, stderr=out, env=env)
        killer = subprocess.Popen([sys.executable, "-c", _KILL_WHEN,
                                   str(model_dir / "ckpt-180.index"), str(process.pid)])
        assert killer.wait(timeout=150) == 0, (tmp_path / "out").read_text()[-3000:]
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    # Killed mid-run: metrics.json says so, and names no step beyond a checkpoint.
    record = json.loads((model_dir / "metrics.json").read_text())
    assert (record["status"], record["interrupted"]) == ("running", True)
    assert record["step"] in (170, 180)
    assert checkpoint_files.damage(str(model_dir / f"ckpt-{record['step']}")) is None
    # The kill lands once ckpt-180.index exists: before or after the `checkpoint`
    # state file names it. Either way the resume starts from ckpt-180 if it reads.
    resumes_from = 180 if checkpoint_files.damage(str(model_dir / "ckpt-180")) is None else 170

    result = run_bin("train", *args[1:])
    assert result.returncode == 0, result.stderr[-3000:]
    with open(model_dir / "metrics.json") as f:
        metrics = json.load(f)
    assert metrics["start_step"] == resumes_from and metrics["start_step"] < metrics["step"]
    evaluations = _evaluations(model_dir, "loss")
    assert list(evaluations) == list(range(10, metrics["step"] + 1, 10))
    # TensorBoard's own reader (its server's accumulator, which honours the
    # restart mark the resumed run wrote) sees each step once after the kill.
    for kind in ("train", "eval"):
        reader = accumulator.EventAccumulator(str(model_dir / "summaries" / kind),
                                              size_guidance={accumulator.TENSORS: 0})
        reader.Reload()
        steps = [event.step for event in reader.Tensors("loss")]
        assert steps == list(range(10, metrics["step"] + 1, 10)), (kind, steps)
    step, value, stop = _expected(evaluations, "min", 3)
    assert stop == metrics["step"] and metrics["stopped_early"]
    assert f"stopping early at step {stop}: eval/loss has not improved" in result.stdout
    record = json.loads((model_dir / "best" / "best.json").read_text())
    assert record["step"] == step and np.float32(record["value"]) == np.float32(value)
    assert sorted(os.listdir(model_dir / "best")) == [
        "best.json", f"ckpt-{step}.data-00000-of-00001", f"ckpt-{step}.index", "state.json"]
    kept = _model_weights(str(model_dir / "best" / f"ckpt-{step}"))
    rolling = _model_weights(str(model_dir / f"ckpt-{step}"))
    for name in kept:
        np.testing.assert_array_equal(kept[name], rolling[name])


def test_two_workers_evaluate_alike_stop_together_and_only_the_chief_keeps_the_best(tmp_path):
    """`checkpoint.write` is collective: worker:1 writes into its own temporary
    directory, which is gone at the end."""
    worker_tmp = tmp_path / "worker_tmp"
    worker_tmp.mkdir()
    model_dir = tmp_path / "run"
    result = run_bin(
        "launch", "--num_workers=2", "--grace_period=5", "--",
        "bin/train", f"--model_dir={model_dir}", "--strategy=multi_worker", "--collective=ring",
        "--global_batch_size=32", "--train_steps=300", "--steps_per_loop=10",
        "--checkpoint_interval=10", "--eval_interval=10", "--eval_steps=4",
        "--learning_rate=0.01", "--mode=train_and_evaluate", "--best_metric=eval/loss",
        "--early_stopping_patience=3", "--seed=1", "--max_checkpoints=100",
        env={"TMPDIR": str(worker_tmp)}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    step, value, stop = _expected(_evaluations(model_dir, "loss"), "min", 3)
    assert metrics["step"] == stop
    for worker in ("worker:0", "worker:1"):
        assert f"[{worker}] " in result.stdout
        assert re.search(rf"\[{worker}\] .*stopping early at step {stop}: eval/loss has not "
                         rf"improved for 3 evaluations \(best [0-9.]+ at step {step}\)",
                         result.stdout), result.stdout[-3000:]
    assert metrics["best"]["step"] == step
    assert np.float32(metrics["best"]["value"]) == np.float32(value)
    assert os.listdir(model_dir / "best" / "export") == [str(step)]
    kept = _model_weights(str(model_dir / "best" / f"ckpt-{step}"))
    rolling = _model_weights(str(model_dir / f"ckpt-{step}"))
    for name in kept:
        np.testing.assert_array_equal(kept[name], rolling[name])
    assert os.listdir(worker_tmp) == []


@pytest.mark.parametrize("arguments, message", [
    (dict(metric="loss"), r"^`metric` \('loss'\) must name an evaluation metric, eval/<name>$"),
    (dict(mode="auto"), r"^`mode` \('auto'\) must be one of \('max', 'min'\)$"),
    (dict(checkpoint=object()), r"^`checkpoint` \(<object object at .*\) must be a "
     r"tf.train.Checkpoint$"),
    (dict(export_fn="export"), r"^`export_fn` \('export'\) must be callable as "
     r"export_fn\(export_root\) or None$"),
    (dict(patience=True), r"^`patience` \(True\) must be an integer >= 0 \(0: never stop\)$"),
    (dict(patience=-1), r"^`patience` \(-1\) must be an integer >= 0"),
])
def test_keep_best_refuses_a_wrong_argument_naming_it_and_its_value(tmp_path, arguments,
                                                                     message):
    """Refused at construction, before `best/` is read or anything removed."""
    given = dict(dict(metric="eval/loss", mode="min",
                      checkpoint=tf.train.Checkpoint(global_step=step_variable(0)),
                      model_dir=str(tmp_path / "run")), **arguments)
    with pytest.raises(ValueError, match=message):
        best.KeepBest(**given)
    assert not (tmp_path / "run").exists()
