"""The task plug-in: a user's model, data and step, run by every part of the engine.

A `Task` says *what* to train; the engine decides *how* (strategy,
collective, compiled loops, checkpoints, evaluation, export, multi-worker
roles). Subclass it and define three methods; the rest is optional::

    class Regression(Task):
        def build_model(self):                    # called inside strategy.scope()
            return keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])

        def train_dataset(self, context):         # global batches, endless
            ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=context.seed)
            return ds.repeat().batch(context.global_batch_size, drop_remainder=True)

        def loss(self, model, batch, *, training):  # per-example values
            features, target = batch
            error = model(features, training=training)[:, 0] - target
            return LossOutput(per_example_loss=error**2, metrics={"mae": tf.abs(error)})

    run(config, task=Regression())        # or: bin/train --task=my_module:Regression

Optional: `eval_dataset(context)` (one pass, last batch may be partial),
`build_optimizer()` (else `--optimizer`/`--learning_rate`), `objectives(model)`
(several losses with their own variables and optimizers: a GAN),
`serving_spec(element_spec)` and `serve(model, features)` (what the export's
`serving_default` signature takes and returns). What a task may declare of
itself has its default here, and the engine reads it as an attribute:
`train_step` (a whole step of its own), `uses_compile` and `jit_compile` (a
compiled Keras model's), `checkpointed()` (more for the checkpoints to hold).

The dataset builders get an `InputContext` (`inputs.context`): global and
per-replica batch size, input pipelines and this one's index, the seed, and
`start_step`, the step a restored run resumes from. Reading `start_step`
promises the stream starts there; a builder that never reads it has its first
`start_step` batches skipped by the engine (`engine.loop.task_inputs`).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
from typing import Any, Callable, Optional, Sequence, Union

import keras
import tensorflow as tf

from tfloop import inputs, models
from tfloop.engine.task import failures as task_failures
from tfloop.engine.task import user_code
from tfloop.engine.errors import ConfigError
from tfloop.engine.task.losses import Gradients, LossFn, LossOutput, classification_loss
from tfloop.inputs import InputContext

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Objective:
    """One loss of a step, minimized over its own variables by its own optimizer.

    Attributes:
      name: names its metrics (`<name>/loss`) and its optimizer in checkpoints.
      loss: `(model, batch, *, training) -> LossOutput`, per-example values.
      variables: `model -> list of variables` this objective updates.
      optimizer: a Keras optimizer (created inside `build_model`'s scope is not
        needed: the engine calls `objectives` under the strategy scope), an
        optimizer name (`sgd`, `momentum`, `adam`, `adamw`: built by the engine,
        following `--learning_rate`'s schedule and `--weight_decay`), or None
        for the run's `--optimizer`. An optimizer object keeps its own rate.
      every: update on steps where `step % every == 0` (a discriminator
        trained every step, a generator every second step: `every=2`).
    """

    name: str
    loss: LossFn
    variables: Callable[[Any], Sequence[tf.Variable]]
    optimizer: Union[None, str, keras.optimizers.Optimizer] = None
    every: int = 1

    def __post_init__(self):
        if not isinstance(self.every, int) or self.every < 1:
            raise ConfigError(f"Objective {self.name!r}: every={self.every!r} must be a "
                              "positive integer (update on steps where step % every == 0)")


class Task:
    """What to train: the model, its data and its per-example loss.

    Subclasses define `build_model`, `train_dataset` and `loss`; see the
    module docstring. One instance serves one run.
    """

    #: Shown in the start-up line (`describe`), after the class name; empty: nothing more.
    name: str = ""

    @classmethod
    def from_config(cls, config: Any) -> "Task":
        """How `bin/train --task=module:Class` makes the task from the run's
        `RunConfig`; `Class()` unless a subclass reads flags (`--dataset`...)."""
        return cls()

    def prepare(self) -> None:
        """Checks that can fail (files, names), run before anything is built
        or written so a mistake costs one line; nothing by default."""

    def build_model(self) -> Any:
        """The model (a Keras model, or a `keras.Model` holding several), built
        inside `strategy.scope()` so its variables are distributed."""
        raise NotImplementedError(f"{type(self).__name__} must define build_model()")

    def train_dataset(self, context: InputContext) -> tf.data.Dataset:
        """Endless global batches of exactly `context.global_batch_size`
        (`drop_remainder=True`), shuffled with `context.seed`."""
        raise NotImplementedError(f"{type(self).__name__} must define train_dataset(context)")

    def probe_dataset(self, context: InputContext) -> Optional[tf.data.Dataset]:
        """The train data built afresh for the engine's input-rate probe
        (`engine.observe.step_time`), never the pipeline the run trains on:
        a second iterator of a seeded `shuffle(reshuffle_each_iteration=True)`
        takes the seeds that the run's later epochs would have taken, and the
        run (and its exact resume) would train on another order. By default
        `train_dataset(context)` called again, which builds a new pipeline
        with its own seed generator; return None where a second call would
        share state with the first (a dataset object kept and handed out
        twice, a Python generator): there is no probe then."""
        return self.train_dataset(context)

    def eval_dataset(self, context: InputContext) -> Optional[tf.data.Dataset]:
        """One pass over the eval data in global batches (the last may be
        partial), or None for a task without an eval split."""
        return None

    def loss(self, model: Any, batch: Any, *, training: bool) -> LossOutput:
        """Per-example loss and metrics for one replica's batch (`engine.task.losses`)."""
        raise NotImplementedError(f"{type(self).__name__} must define loss(model, batch, training)")

    def build_optimizer(self) -> Optional[keras.optimizers.Optimizer]:
        """The optimizer, under the strategy scope; None for `--optimizer`."""
        return None

    def objectives(self, model: Any) -> Sequence[Objective]:
        """The losses a step minimizes; by default one, `loss`, over every
        trainable variable with the run's optimizer."""
        return [Objective("loss", self.loss, lambda m: m.trainable_variables)]

    def gradients(self, model: Any, batch: Any, step: Any) -> Gradients:
        """Optional: the task's own step on one replica (Orbit's and Keras's
        `train_step`, less what the engine keeps): the gradients of
        `step.variables` for objective `step.objective`, from this replica's
        `batch`, as `Gradients(gradients, per_example_loss, metrics)`.

        For gradient penalties, several backward passes, gradient surgery.
        The engine still all-reduces them once, clips (`--clip_norm`),
        accumulates (`--accumulation_steps`: `batch` is then one slice),
        guards against NaN, applies the objective's optimizer and averages
        (`--ema_decay`). Differentiate `step.total_loss(per_example_loss,
        model)` (the global-batch average, regularization, loss scale) for
        the engine's scaling; `step.default(model, batch)` is the engine's
        own step (the default, and what a hook that changes one objective
        returns for the others). Evaluation still runs `loss`/`objectives`.
        See `examples/wgan_gp.py`.
        """
        return step.default(model, batch)

    #: Optional: the task's whole step on one replica, its update included
    #: (Keras's `Model.train_step`, which `fit` runs through it:
    #: `engine.keras_fit.steps`): a function `(model, batch, step) ->
    #: LossOutput`, or None (the default) for the engine's step. `step`
    #: (`engine.loop.replica_step.WholeStep`) holds `all_reduce(gradients,
    #: variables)`, the run's one all-reduce through the chosen collective,
    #: which the function calls once per step before it applies the sums
    #: with `step.optimizer` (its own reduction off). The returned
    #: `LossOutput` (its metrics the names `loss` reports) is the engine's
    #: record of the step: metrics.json, the NaN guard. The rest of the
    #: engine's step is the function's: the flags that act inside it
    #: (--nan_policy=skip_step, --clip_norm, --accumulation_steps,
    #: --jit_compile), several objectives, `gradients` and
    #: --strategy=parameter_server are refused with it. Evaluation still runs
    #: `loss`.
    train_step: Optional[Callable[[Any, Any, Any], LossOutput]] = None

    # --- What a task may declare of itself (the engine reads these, never `getattr`). ---

    #: The run trains with what the model's `compile()` gave it: its
    #: optimizer trains (`model.optimizer` is it), and the start-up notice
    #: that a compiled model's optimizer, loss and metrics go unused is not
    #: said. True for a compiled Keras model's tasks (`fit`'s and
    #: `--task=module:function`'s); False here.
    uses_compile: bool = False

    #: The model asks for XLA (`compile(jit_compile=True)`): the engine's
    #: step compiles with it, as `--jit_compile` does; refused by
    #: `--strategy=parameter_server` and with a whole `train_step`. Read
    #: once `build_model` has run (a compiled model's task sets it there);
    #: False here.
    jit_compile: bool = False

    def serving_spec(self, element_spec: Any) -> Any:
        """What the export's `serving_default` takes: by default the features
        of a train batch (its first element), any batch size."""
        features = element_spec[0] if isinstance(element_spec, tuple) else element_spec
        return tf.nest.map_structure(
            lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype, name=None), features)

    @tf.autograph.experimental.do_not_convert  # the engine's default; a task's own is converted
    def serve(self, model: Any, features: Any) -> Any:
        """Inference for the export: the model's outputs on `features`."""
        return model(features, training=False)

    @property
    def train_examples(self) -> Optional[int]:
        """Examples in one pass over the train data, for `--epochs`; None: unknown."""
        return None

    @property
    def has_eval(self) -> bool:
        """Whether the task evaluates (it overrides `eval_dataset`)."""
        return type(self).eval_dataset is not Task.eval_dataset

    def checkpointed(self) -> dict:
        """Trackables the run's checkpoints hold beside the model, optimizer and
        step, by name (`fit`'s task: its epoch's running sums); none here."""
        return {}

    def describe(self) -> str:
        """The task's line in the start-up log (what it trains on, say)."""
        return f"task {type(self).__name__}" + (f": {self.name}" if self.name else "")

    def resolve_shard_policy(self, requested: str, num_workers: int) -> str:
        """`--auto_shard_policy` for this task's data: `auto` is `data`, the
        one that keeps the order independent of the file layout (so resume is
        exact); tasks whose data is files may do better."""
        return "data" if requested == "auto" else requested


class ClassificationTask(Task):
    """The built-in `--model`/`--dataset` image classification, as a task.

    Its keyword arguments are the flags of the same names (`--dataset`,
    `--model`, `--data_dir`, `--image_size`, `--num_classes`,
    `--eval_fraction`, `--augment`, `--seed`), each with the flag's default, so a user
    writes only what they change, as with a Keras layer or callback:
    `ClassificationTask(dataset="mnist", model="cnn")`; `from_config` takes
    them all from a `RunConfig`. `model_fn(input_shape, num_classes)` and
    `loss_fn` replace the registry model and the cross-entropy loss (the
    older `run(loss_fn=, model_fn=)`); `exact_epochs` (`from_config`: `--epochs`
    without `--steps_per_epoch`) makes each epoch one pass over the train split.

    Its batches carry uint8 pixels, and `loss` scales them to [0, 1]
    (`inputs.to_float`) inside the step, on the replica's device: a quarter
    of the bytes to copy from the host to a GPU each step. The model, a
    `loss_fn` and the export's `serving_default` still see float32 in [0, 1].
    A dataset that asks for per-channel normalization (`Splits.normalization`:
    `--dataset=imagenet`, ImageNet's mean and std) gets it in the same lookup,
    so the model sees `(pixel - mean) / std`; the export's `serving_default`
    still takes float32 in [0, 1] and normalizes them before the model
    (`inputs.normalize_unit`), so a served image and a trained one agree.
    """

    def __init__(self, *, dataset: str = "synthetic", model: str = "mlp", data_dir: str = "",
                 image_size: int = 0, num_classes: int = 0, eval_fraction: float = 0.2,
                 seed: int = 0, augment: str = "",
                 model_fn: Optional[Callable[[tuple, int], Any]] = None,
                 loss_fn: Optional[LossFn] = None, exact_epochs: bool = False):
        self.dataset, self.model_name = dataset, model
        self.exact_epochs = exact_epochs
        self._data = dict(data_dir=data_dir, seed=seed, image_size=image_size,
                          num_classes=num_classes,
                          eval_fraction=eval_fraction, augment=augment)
        self._model_fn, self._loss_fn = model_fn, loss_fn or classification_loss
        self.splits: Optional[inputs.Splits] = None

    @classmethod
    def from_config(cls, config: Any, *, model_fn=None, loss_fn=None) -> "ClassificationTask":
        """`--dataset`, `--data_dir`, `--model`, `--image_size`, `--num_classes`,
        `--eval_fraction`, `--augment`, `--seed`;
        `--epochs`: exact epochs (each one pass, every example once:
        `inputs.exact_epochs`)."""
        return cls(dataset=config.dataset, model=config.model, data_dir=config.data_dir,
                   image_size=config.image_size, num_classes=config.num_classes,
                   eval_fraction=config.eval_fraction, augment=config.augment,
                   seed=config.seed, model_fn=model_fn, loss_fn=loss_fn,
                   exact_epochs=bool(config.epochs) and not config.steps_per_epoch)

    def prepare(self) -> None:
        """Checks the model name and loads the splits (no TensorFlow runtime
        needed): the plan calls this before anything is built."""
        if self._model_fn is None:
            models.check(self.model_name)
        self.splits = inputs.load(self.dataset, **self._data)
        if self._model_fn is None:
            models.check(self.model_name, self.splits.input_shape)  # mobilenet_v2: >= 32x32

    def describe(self) -> str:
        splits = self.splits
        evaluated = (f"{_split_size(splits.eval)} to evaluate" if splits.eval is not None
                     else "no eval split")
        names = splits.class_names
        classes = ("" if not names else f", classes {', '.join(names)}" if len(names) <= 20
                   else f", {len(names)} classes ({', '.join(names[:3])}, ..., {names[-1]})")
        return (f"{self.name + ': ' if self.name else ''}dataset {self.dataset}: "
                f"{_split_size(splits.train)} to train on, {evaluated}{classes}")

    @property
    def has_eval(self) -> bool:
        return self.splits.eval is not None

    @property
    def train_examples(self) -> Optional[int]:
        """The train split's size; None where its files were not counted
        (`--dataset=imagenet` on a remote filesystem)."""
        return _examples(self.splits.train)

    def build_model(self):
        shape, classes = self.splits.input_shape, self.splits.num_classes
        if self._model_fn is not None:
            return self._model_fn(shape, classes)
        return models.build(self.model_name, input_shape=shape, num_classes=classes)

    def train_dataset(self, context: InputContext) -> tf.data.Dataset:
        return inputs.train_batches(
            self.splits.train, global_batch_size=context.global_batch_size, seed=context.seed,
            examples_to_skip=context.examples_to_skip, shard_policy=context.shard_policy,
            num_workers=context.num_input_pipelines, deterministic=context.deterministic,
            image_dtype="uint8", exact_epochs=self.exact_epochs,
            input_pipeline_id=context.input_pipeline_id)

    def eval_dataset(self, context: InputContext) -> tf.data.Dataset:
        return inputs.eval_batches(
            self.splits.eval, global_batch_size=context.global_batch_size,
            shard_policy=context.shard_policy, num_workers=context.num_input_pipelines,
            deterministic=context.deterministic, image_dtype="uint8")

    # The engine's own code runs unconverted, as its loops do; the loss function
    # it calls may be the user's, and is converted (`engine.task.user_code`).
    @tf.autograph.experimental.do_not_convert
    def loss(self, model, batch, *, training: bool) -> LossOutput:
        images, labels, *weight = batch  # exact epochs add a per-example weight
        output = user_code.converted(self._loss_fn)(model, (self.scaled(images), labels),
                                                    training=training)
        if not weight:
            return output
        return LossOutput(per_example_loss=output.per_example_loss * weight[0],
                          metrics={k: tf.cast(v, tf.float32) * weight[0]
                                   for k, v in output.metrics.items()})

    @tf.autograph.experimental.do_not_convert
    def scaled(self, images: tf.Tensor) -> tf.Tensor:
        """A batch's uint8 pixels as the model takes them, in the step: [0, 1],
        or normalized where the dataset asks (`inputs.to_float`); a subclass's
        own dataset may already be float, and passes unchanged."""
        if images.dtype != tf.uint8:
            return images
        return inputs.to_float(images, self.splits.normalization if self.splits else None)

    def serving_spec(self, element_spec: Any) -> Any:
        """Float32 images in [0, 1] (the batches' uint8 is scaled inside the
        step; `serve` applies the dataset's normalization, if any)."""
        spec = super().serving_spec(element_spec)
        return tf.TensorSpec(spec.shape, tf.float32) if spec.dtype == tf.uint8 else spec

    @tf.autograph.experimental.do_not_convert
    def serve(self, model: Any, features: Any) -> Any:
        """The model on float32 images in [0, 1], normalized first where the
        dataset normalizes (ImageNet's mean and std)."""
        normalization = self.splits.normalization if self.splits else None
        if normalization is not None:
            features = inputs.normalize_unit(features, normalization)
        return model(features, training=False)

    def resolve_shard_policy(self, requested: str, num_workers: int) -> str:
        return inputs.resolve_shard_policy(self.splits.train, requested, num_workers)


def check_defines(task: Task) -> None:
    """Refuses, in one line, a task that leaves a required method to `Task`
    (which would fail later, mid-build, with a traceback)."""
    required = ["build_model", "train_dataset"]
    if type(task).objectives is Task.objectives:  # the default objective is `loss`
        required.append("loss")
    missing = [m for m in required if getattr(type(task), m) is getattr(Task, m)]
    if missing:
        raise ConfigError(f"{type(task).__name__} does not define {', '.join(missing)}; a Task "
                          "defines build_model, train_dataset and loss (or objectives)")


def _examples(split) -> Optional[int]:
    """The split's size; None for ImageNet records not counted (remote)."""
    return split.count if isinstance(split, inputs.ImageNetRecords) else len(split)


def _split_size(split) -> str:
    files, count = getattr(split, "files", None), _examples(split)
    examples = "examples not counted" if count is None else f"{count} examples"
    return f"{len(files)} files ({examples})" if files is not None else examples


def load(reference: str, config: Any, *,
         from_function: Optional[Callable[[Callable, Any], Task]] = None) -> Task:
    """`--task=module:Class`: imports `module` (the working directory is on the
    path, as for `python -m`), then `Class.from_config(config)`. With
    `from_function`, `--task=module:function` (a function, not a class) is
    `from_function(function, config)` (the run's: a function that builds and
    compiles a Keras model, `engine.task.compiled_model`).

    Raises:
      ConfigError: not `module:Class`, the module does not import, or the
        attribute is missing or not a `Task` subclass.
    """
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr or ":" in attr:
        raise ConfigError(f"--task={reference!r} is not module:Class; write e.g. "
                          "--task=my_package.my_module:MyTask")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except SystemExit as exiting:  # `sys.exit(0)` at import: status 0, nothing trained
        raise task_failures.exit_error(f"--task={reference!r}: importing {module_name!r}",
                                       exiting) from None
    except Exception as exc:  # the user's module: any failure to import is theirs
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise ConfigError(f"--task={reference!r}: cannot import module {module_name!r} "
                          f"({reason}); run from the folder that holds it or add it to "
                          "PYTHONPATH") from None
    cls = getattr(module, attr, None)
    if from_function is not None and callable(cls) and not isinstance(cls, type):
        return from_function(cls, config)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        what = "has no attribute" if cls is None else f"has {type(cls).__name__}"
        raise ConfigError(f"--task={reference!r}: module {module_name!r} {what} {attr!r}, "
                          "not a Task; subclass tfloop.engine.task.Task and define "
                          "build_model, train_dataset and loss (or name a function that "
                          "builds and compiles a Keras model)")
    with task_failures.calling(cls, "from_config"):  # its __init__ raising, say
        try:
            return cls.from_config(config)
        except TypeError as exc:  # e.g. a constructor with required arguments
            reason = " ".join(str(exc).split())[:300]
            raise ConfigError(f"--task={reference!r}: {attr}.from_config(config) failed "
                              f"({reason}); give its constructor defaults or define "
                              "from_config") from None
