"""The task plug-in around the step: refusals of a task's data, the run's
memory of what trained it, evaluations beside the training record, export
at the end of training and on demand, warm start."""

import json
import logging
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from examples import regression
from helpers import assert_one_line_error, run_bin
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.task.losses import Gradients, LossOutput
from tfloop.engine.assembly.run import export_checkpoint, run
from tfloop.engine.loop import task_inputs
from tfloop.engine.task import Task
from tfloop.inputs import InputContext


def _config(model_dir, **overrides):
    settings = dict(strategy="mirrored", devices="cpu:0,cpu:1", model_dir=str(model_dir),
                    global_batch_size=32, train_steps=10, steps_per_loop=5,
                    checkpoint_interval=5, seed=1, mode="train")
    settings.update(overrides)
    return RunConfig(**settings)


class Tiny(Task):
    """Four float features, a float target; variations break one thing each."""

    def __init__(self, batch=None, repeat=True, features=4, compiled=False):
        self.batch, self.repeat, self.features, self.compiled = batch, repeat, features, compiled

    def build_model(self):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        if self.compiled:
            model.compile(optimizer="sgd", loss="mse")
        return model

    def train_dataset(self, context):
        x = np.ones((256, self.features), np.float32)
        ds = tf.data.Dataset.from_tensor_slices((x, np.zeros(256, np.float32)))
        ds = ds.repeat() if self.repeat else ds
        size = self.batch or context.global_batch_size
        return ds.batch(size, drop_remainder=self.batch is None)

    def loss(self, model, batch, *, training):
        x, y = batch
        return LossOutput(per_example_loss=tf.square(model(x, training=training)[:, 0] - y))


@pytest.mark.parametrize("task, says", [
    (Tiny(batch=8), "no fixed size"),
    (Tiny(repeat=False), "add .repeat()"),
    (Tiny(features=3), "the loss function fails on a batch of (float32 (32, 3), float32 (32,)): Input 0 with name"),
])
def test_a_task_whose_data_cannot_work_is_one_line_and_writes_nothing(tmp_path, task, says):
    with pytest.raises(ConfigError) as error:
        run(_config(tmp_path / "run"), task=task)
    message = str(error.value)
    assert says in message and "\n" not in message, message
    assert not (tmp_path / "run").exists()


def test_a_batch_of_another_size_is_refused(tmp_path):
    class Fixed(Tiny):
        def train_dataset(self, context):
            return super().train_dataset(context).unbatch().batch(16, drop_remainder=True)

    with pytest.raises(ConfigError, match="yields batches of 16, and the run's global batch is 32"):
        run(_config(tmp_path / "run"), task=Fixed())


def test_a_compiled_model_is_trained_by_the_engine_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="tfloop"):
        result = run(_config(tmp_path / "run", export=False), task=Tiny(compiled=True))
    assert result["step"] == 10
    assert any("arrives compile()d" in r.getMessage() for r in caplog.records)


def test_the_engine_skips_for_a_dataset_that_does_not_read_start_step(tmp_path, caplog):
    run(_config(tmp_path / "run", export=False), task=Tiny())
    with caplog.at_level(logging.INFO, logger="tfloop"):
        run(_config(tmp_path / "run", train_steps=15, export=False), task=Tiny())
    assert any("does not read context.start_step: skipping the 10 batches" in r.getMessage()
               for r in caplog.records)


def test_the_run_remembers_what_trained_it_and_refuses_a_contradiction(tmp_path):
    model_dir = tmp_path / "run"
    run(_config(model_dir, model="cnn", export=False))
    stored = json.loads((model_dir / "run.json").read_text())
    assert stored["model"] == "cnn" and stored["dataset"] == "synthetic"
    with pytest.raises(ConfigError, match="trained with --model='cnn'"):
        run(_config(model_dir, model="mlp", train_steps=20))
    # bin/train takes what is not given from run.json: evaluate needs only --model_dir.
    result = run_bin("train", f"--model_dir={model_dir}", "--mode=evaluate",
                     "--devices=cpu:0", "--strategy=default")
    assert result.returncode == 0, result.stderr
    evaluations = json.loads((model_dir / "evaluations.json").read_text())["evaluations"]
    assert [e["step"] for e in evaluations] == [10] and evaluations[0]["by"] == "--mode=evaluate"
    record = json.loads((model_dir / "metrics.json").read_text())
    assert record["step"] == 10 and record["mode"] == "train"  # the training record stays


def test_export_at_the_end_serves_the_engines_predictions(tmp_path):
    task = regression.Regression(num_train=256, num_eval=64)
    result = run(_config(tmp_path / "run", global_batch_size=32), task=task)
    assert result["export"] == str(tmp_path / "run" / "export" / "10")
    features = {k: v[:16] for k, v in task.eval[0].items()}
    expected = result.model(features, training=False).numpy()
    served = tf.saved_model.load(result["export"]).signatures["serving_default"](
        **{k: tf.constant(v) for k, v in features.items()})
    np.testing.assert_allclose(served["outputs"].numpy(), expected, atol=1e-6)
    loaded = keras.models.load_model(os.path.join(result["export"], "model.keras"))
    np.testing.assert_allclose(loaded(features).numpy(), expected, atol=1e-6)


#: The tests that start from the module's one trained run of the built-in
#: task (a copy each): one xdist group, so that one worker trains it once.
SHARED = pytest.mark.xdist_group("tasks_built_in_run")


@pytest.fixture(scope="module")
def built_in_run(tmp_path_factory):
    """`run(_config(model_dir, export=False))` of the built-in task (ckpt-5,
    ckpt-10), never changed (each test changes a copy: `_copy`), and its
    model's weights at the end."""
    model_dir = tmp_path_factory.mktemp("built_in") / "run"
    record = run(_config(model_dir, export=False))
    return model_dir, record.model.get_weights()


def _copy(built_in_run, to):
    """A copy of the shared run at `to` (its lock left behind)."""
    return shutil.copytree(built_in_run[0], to, ignore=shutil.ignore_patterns("*.lock"))


@SHARED
def test_export_on_demand_of_a_kept_checkpoint_and_its_refusals(tmp_path, built_in_run):
    model_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="has no checkpoint to export"):
        export_checkpoint(_config(model_dir))
    assert not model_dir.exists()
    _copy(built_in_run, model_dir)  # what run(_config(model_dir, export=False)) writes
    with pytest.raises(ConfigError, match="keeps checkpoints of steps 5, 10"):
        export_checkpoint(_config(model_dir), step=7)
    path = export_checkpoint(_config(model_dir), step=5)
    assert path == str(model_dir / "export" / "5")
    assert tf.io.gfile.exists(os.path.join(path, "saved_model.pb"))


@SHARED
def test_warm_start_begins_at_step_zero_from_another_runs_weights(tmp_path, caplog,
                                                                  built_in_run):
    # The source: a copy of run(_config(tmp_path / "source", export=False)).
    _copy(built_in_run, tmp_path / "source")
    source_weights = built_in_run[1]
    init_from = str(tmp_path / "source")
    with caplog.at_level(logging.INFO, logger="tfloop"):
        tuned = run(_config(tmp_path / "tuned", train_steps=0, init_from=init_from,
                            export=False))
    assert tuned["step"] == 0
    for a, b in zip(tuned.model.get_weights(), source_weights):
        np.testing.assert_array_equal(a, b)
    assert any("starting from the model weights of" in r.getMessage() for r in caplog.records)
    # A run that has checkpoints resumes and says it ignored --init_from.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tfloop"):
        run(_config(tmp_path / "source", train_steps=15, init_from=init_from, export=False))
    assert any("ignoring --init_from" in r.getMessage() for r in caplog.records)


def test_binaries_refuse_a_bad_task_export_and_init_from_in_one_line(tmp_path):
    model_dir = tmp_path / "run"
    assert_one_line_error(run_bin("train", "--task=no_such_module:Task",
                                  f"--model_dir={model_dir}"), contains="cannot import module")
    assert_one_line_error(run_bin("train", "--task=examples.gan:NOISE",
                                  f"--model_dir={model_dir}"), contains="not a Task")
    assert_one_line_error(run_bin("export", f"--model_dir={model_dir}"),
                          contains="has no checkpoint to export")
    assert_one_line_error(run_bin("train", f"--init_from={tmp_path / 'nothing'}",
                                  "--devices=cpu:0", "--train_steps=2",
                                  f"--model_dir={model_dir}"), contains="does not exist")
    assert not model_dir.exists()


def test_run_takes_an_optimizer_object(tmp_path):
    result = run(_config(tmp_path / "run", export=False), task=Tiny(),
                 optimizer=keras.optimizers.SGD(0.05, momentum=0.5))
    reader = tf.train.load_checkpoint(str(tmp_path / "run"))
    # The given optimizer trained (its 0.05, not --learning_rate's 0.001), with its slots.
    learning_rate = reader.get_tensor("optimizer/_learning_rate/.ATTRIBUTES/VARIABLE_VALUE")
    assert np.isclose(learning_rate, 0.05)
    assert int(reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == 10
    assert result["step"] == 10


@pytest.mark.parametrize("policy", ["data", "file", "off"])
def test_the_engine_shards_a_task_dataset_by_the_resolved_policy(policy):
    """A task's own pipeline is sharded as the skip arithmetic assumes, not by
    TensorFlow's AUTO default; `--deterministic=false` leaves its order as it
    asks (unset: deterministic), `--deterministic` pins it (issue 39, item 8)."""
    for deterministic, expected in ((False, None), (True, True)):
        context = InputContext.create(global_batch_size=32, num_input_pipelines=2,
                                      shard_policy=policy, deterministic=deterministic)
        dataset = task_inputs.train_dataset(Tiny(), context)
        options = dataset.options()
        assert options.experimental_distribute.auto_shard_policy == getattr(
            tf.data.experimental.AutoShardPolicy, policy.upper())
        assert options.deterministic is expected


def test_task_mistakes_are_one_line_and_write_nothing(tmp_path, monkeypatch):
    from tfloop.engine import task as task_lib
    from tfloop.engine.task import Objective

    class NoLoss(Tiny):
        loss = Task.loss

    class NoEvalData(Tiny):
        def eval_dataset(self, context):
            return None

    for task, says in [
        (NoLoss(), "NoLoss does not define loss; a Task defines build_model"),
        (NoEvalData(), "NoEvalData.eval_dataset(context) returned None"),
    ]:
        with pytest.raises(ConfigError) as error:
            run(_config(tmp_path / "run", mode=""), task=task)
        assert says in str(error.value) and "\n" not in str(error.value)
        assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="every=0 must be a positive integer"):
        Objective("g", Tiny().loss, lambda m: m.trainable_variables, every=0)
    (tmp_path / "needs_args.py").write_text(
        "from tfloop.engine.task import Task\n"
        "class NeedsArgs(Task):\n"
        "    def __init__(self, path):\n"
        "        self.path = path\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"NeedsArgs.from_config\(config\) failed .*missing 1 "
                                          r"required positional argument"):
        task_lib.load("needs_args:NeedsArgs", _config(tmp_path / "run"))


class OwnStep(Tiny):
    """Tiny with its own step (`Task.gradients`): the engine's arithmetic by
    hand (`step.total_loss`), or, `slip=True`, one gradient too few."""

    def __init__(self, slip=False):
        super().__init__()
        self.slip = slip

    def train_dataset(self, context):
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(256, 4)).astype(np.float32), rng.normal(size=256).astype(np.float32)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        return ds.batch(context.global_batch_size, drop_remainder=True)

    def gradients(self, model, batch, step):
        with tf.GradientTape() as tape:
            per_example = self.loss(model, batch, training=True).per_example_loss
            total = step.total_loss(per_example, model)
        grads = tape.gradient(total, step.variables)
        return Gradients(grads[:1] if self.slip else grads, per_example,
                         {"own": tf.ones_like(per_example)})


class EngineStep(OwnStep):
    gradients = Task.gradients  # the engine's own step


def test_a_task_s_own_step_runs_in_the_engine_s_step_and_its_slips_are_one_line(tmp_path):
    own = run(_config(tmp_path / "own", export=False), task=OwnStep())
    engine = run(_config(tmp_path / "engine", export=False), task=EngineStep())
    assert own["train/own"] == 1.0 and "train/own" not in engine
    for a, b in zip(own.model.get_weights(), engine.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)

    with pytest.raises(ConfigError) as error:
        run(_config(tmp_path / "slip"), task=OwnStep(slip=True))
    message = str(error.value)
    assert "returned 1 gradients for objective 'loss', which has 2 variables" in message
    assert "\n" not in message and not (tmp_path / "slip").exists()


def test_the_built_in_task_takes_the_flags_of_its_names_as_keywords_with_their_defaults():
    """`ClassificationTask(dataset=..., model=..., seed=...)`: a public
    constructor that mirrors the `--model`/`--dataset` flags, keyword-only,
    each with its flag's default, so a user writes only what they change and
    `from_config` builds the same task from a `RunConfig`."""
    import dataclasses
    import inspect

    from tfloop.engine.task import ClassificationTask

    flags = {field.name: field.default for field in dataclasses.fields(RunConfig)}
    parameters = inspect.signature(ClassificationTask).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())
    mirrored = {name: p.default for name, p in parameters.items() if name in flags}
    assert set(mirrored) == {"dataset", "model", "data_dir", "image_size", "num_classes",
                             "eval_fraction", "augment", "seed"}
    assert mirrored == {name: flags[name] for name in mirrored}
    built = ClassificationTask.from_config(RunConfig(dataset="synthetic", seed=3, image_size=8))
    by_hand = ClassificationTask(seed=3, image_size=8)
    assert (built.dataset, built.model_name, built._data, built.exact_epochs) == (
        by_hand.dataset, by_hand.model_name, by_hand._data, by_hand.exact_epochs)


def test_the_tasks_optional_capabilities_are_declared_on_task_and_never_read_by_getattr():
    """What a task may declare of itself has its default on `Task`, so the
    engine reads it as an attribute: no `getattr(task, "<name>", default)`
    anywhere in the engine (a capability read that way is invisible to a
    type checker and to the task's author)."""
    import ast
    from pathlib import Path

    task = Task()
    assert (task.uses_compile, task.jit_compile, task.train_step, task.checkpointed()) == (
        False, False, None, {})
    engine = Path(__file__).resolve().parents[2] / "engine"
    reads = []
    for path in sorted(engine.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "getattr" and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                    and ast.unparse(node.args[0]).split(".")[-1] == "task"):
                reads.append(f"{path.relative_to(engine.parent)}:{node.lineno}: "
                             f"{ast.unparse(node)}")
    assert reads == []
