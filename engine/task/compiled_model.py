"""A compiled Keras model as a kind of task: its loss, metrics and optimizer in the engine's step.

Beside `plugin.Task`, in the user's room: `CompiledLoss` (the compiled
loss and metrics as a `LossOutput`) and `CompiledClassificationTask`
(`bin/train --task=module:function`, on the built-in `--dataset`), which the
assembly builds; `engine.keras_fit.fit_task.CompiledModelTask` (`fit`'s task)
is made of the same pieces. The one Keras internal the metrics need (a mean
metric's per-example function) is handed in by the caller
(`engine.recipe.keras_bridge.per_example_metric_fn`), and so are the metric
objects Keras built (`MetricObjects`), so this room keeps to its floor.

`model.compile(loss=..., optimizer=..., metrics=[...])` states the maths;
the engine runs it as it runs any task (one all-reduce, exact resume, every
strategy). What maps to what:

- the compiled loss (a `keras.losses.Loss`, a name, or a function) gives the
  per-example loss (`Loss.call`, before its reduction), times `sample_weight`,
  on each replica's real rows, weighed by the loss's own `reduction` as
  Keras's `fit` under MirroredStrategy weighs it (`keras_reduction`; the
  padding of a partial batch never reaches the model: `engine.keras_fit.epochs`);
- each compiled metric that is a mean of per-example values (`"accuracy"`,
  `"mae"`, `SparseCategoricalAccuracy()`, `SparseTopKCategoricalAccuracy(k=2)`
  with its `k`, any function) is reported under its Keras name: `metrics=`
  over the examples, `weighted_metrics=` over the summed sample weights, as
  Keras logs them (`CompiledLoss.keras_logs`);
- with `MetricObjects` (`fit`), every compiled metric object and Keras's loss
  tracker is also updated by its own `update_state` on each replica's real
  rows, as Keras's `train_step` and `test_step` update them, so
  `model.metrics` holds Keras's running values; a metric that is not a mean
  (AUC, Precision, Recall, F1Score ...) is logged as its object's `result()`,
  its SyncOnRead variables summed over the replicas when read, as Keras reads
  them. Without (`bin/train --task`), such a metric is refused in one line;
- the compiled optimizer is the run's optimizer (its learning rate is its
  own: `--learning_rate` and the schedule flags do not apply);
- model losses (`kernel_regularizer`) are added by the engine's step, as by `fit`.

A model with several outputs and a dict of losses is refused: write a `Task`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tfloop import inputs
from tfloop.engine.errors import ConfigError
from tfloop.engine.task.losses import LossOutput
from tfloop.engine.task.plugin import ClassificationTask

_ACCURACY = ("accuracy", "acc")


def checked_model(model_fn: Callable[[], Any]) -> keras.Model:
    """`model_fn()`, which must return a compiled keras.Model."""
    model = model_fn()
    if not isinstance(model, keras.Model):
        raise ConfigError(f"{model_fn_name(model_fn)} returned {type(model).__name__}, not a "
                          "keras.Model; build and compile the model in it and return it")
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ConfigError(f"{model_fn_name(model_fn)} returned a model that is not compiled; call "
                          "model.compile(optimizer=..., loss=..., metrics=[...]) before "
                          "returning it")
    return model


#: `metric -> its per-example function, or None` for a stateful Keras metric
#: (`engine.recipe.keras_bridge.per_example_metric_fn`).
MeanFn = Callable[[Any], Optional[Callable]]


@dataclasses.dataclass(frozen=True)
class MetricObjects:
    """The metric objects Keras built for a compiled model
    (`engine.recipe.keras_bridge.compiled_metric_objects`, `loss_tracker`):
    `metrics` and `weighted` in the order `compile` got them, and the loss
    tracker (None: none). What Keras's `fit` updates, made under the
    strategy's scope before any step is traced."""

    metrics: Sequence[Any]
    weighted: Sequence[Any]
    loss_tracker: Any = None


@dataclasses.dataclass(frozen=True)
class _Metric:
    """One compiled metric: its Keras log name, its per-example function
    (None: not a mean, computed by `obj`), whether `weighted_metrics=` gave
    it, and the metric object Keras built for it (None: not known)."""

    name: str
    fn: Optional[Callable]
    weighted: bool
    obj: Any = None


def _named_metrics(model: keras.Model, mean_fn: MeanFn,
                   objects: Optional[MetricObjects] = None) -> list[_Metric]:
    """The compiled `metrics` (not weighted) then `weighted_metrics`, named
    as Keras names them: a repeated name gets `_1`, `_2`; a weighted one whose
    name is taken becomes `weighted_<name>`. With `objects`, each is the
    object Keras built for it (the lists are in the same order): its name,
    its function with its arguments, and for a metric that is not a mean,
    the object itself, which computes it."""
    named, taken = [], {}
    for argument, weighted in (("metrics", False), ("weighted_metrics", True)):
        metrics = _compiled_metrics(model, argument)
        if isinstance(metrics, dict):
            raise ConfigError(f"fit: {argument} per output (a dict) are not supported; give a "
                              "list")
        built = list((objects.weighted if weighted else objects.metrics) if objects else ())
        if objects is not None and len(built) != len(metrics):
            raise ConfigError(f"fit: compile({argument}=...) lists {len(metrics)} metrics and "
                              f"Keras built {len(built)} for them; give a flat list")
        for index, metric in enumerate(metrics):
            if objects is not None:  # Keras's own object: its name, its function and arguments
                name, fn = built[index].name, mean_fn(built[index])
            else:
                name, fn = _per_example_metric(metric, model.loss, mean_fn)
            if name in taken:
                if weighted:
                    name = f"weighted_{name}"
                if name in taken:
                    taken[name] += 1
                    name = f"{name}_{taken[name] - 1}"
            taken.setdefault(name, 1)
            named.append(_Metric(name, fn, weighted, built[index] if built else None))
    return named


def _compiled_metrics(model: keras.Model, argument: str) -> Any:
    """The `metrics=` (or `weighted_metrics=`) given to `compile`, as given:
    Keras keeps them on `_compile_config` (functions included, which
    `get_compile_config()` serializes to configs that `keras.metrics.deserialize`
    cannot read back); without it, the public config, deserialized one by one."""
    kept = getattr(getattr(model, "_compile_config", None), "config", None)
    if isinstance(kept, dict) and argument in kept:
        return kept[argument] or []
    metrics = model.get_compile_config().get(argument) or []
    if isinstance(metrics, dict):
        return metrics
    return [keras.saving.deserialize_keras_object(m) if isinstance(m, dict) else m
            for m in metrics]


def model_fn_name(fn: Any) -> str:
    """`build()`, as a one-line error names the user's model function."""
    return f"{getattr(fn, '__name__', type(fn).__name__)}()"


#: Per-example sums the compiled task reports besides its metrics, from which
#: `keras_logs` makes Keras's logs: the loss summed as Keras's loss tracker
#: sums it, the examples it holds, and the summed sample weights.
KERAS_LOSS, KERAS_EXAMPLES, KERAS_WEIGHTS = "keras_loss_sum", "keras_examples", "keras_weights"
_SUMS = (KERAS_LOSS, KERAS_EXAMPLES, KERAS_WEIGHTS)


class CompiledLoss:
    """A compiled model's loss and metrics as the engine's per-example `LossOutput`.

    Called with `real` (fit's training batches, padded to the global batch:
    `engine.keras_fit.epochs`), the model sees this replica's real rows only,
    so BatchNormalization's batch statistics are those of the examples Keras
    would feed it, and the per-example loss is weighed as Keras's `fit` under
    MirroredStrategy weighs it, by the loss's `reduction` (`keras_reduction`):
    by default each replica's `sum(w * loss) / n` over its n examples
    (`divide_no_nan`: a replica left empty adds nothing), divided by the
    replicas (the engine's division by the global batch does that).

    With `keras_logs`, the output also holds the per-example sums Keras's
    metrics keep (`KERAS_LOSS`, `KERAS_EXAMPLES`, `KERAS_WEIGHTS`, and each
    `weighted_metrics` entry times its sample weight), so that `keras_logs`
    gives the logs Keras gives. The engine's own records (metrics.json,
    summaries) show these sums' means under their names. `mean_fn` gives a
    stateful mean metric's per-example function (`MeanFn`). With `objects`
    (`MetricObjects`), the metric objects and the loss tracker are updated
    on each replica's real rows as Keras updates them, and a metric that is
    not a mean is logged from its object (`keras_logs`).
    """

    def __init__(self, model: keras.Model, *, mean_fn: MeanFn, keras_logs: bool = False,
                 objects: Optional[MetricObjects] = None):
        self._loss_fn, self._reduction = check_loss(model)
        # (name, per-example function, weighted, object): `metrics=` are not
        # weighted by sample_weight (nor class_weight), `weighted_metrics=` are,
        # as in Keras.
        self._metrics = _named_metrics(model, mean_fn, objects)
        self._objects = objects
        self._keras_logs = keras_logs

    # Keras's train and test functions run the compiled loss and metrics
    # unconverted (`do_not_convert`); so does the engine (engine.task.user_code).
    @tf.autograph.experimental.do_not_convert
    def __call__(self, model, x, y, weight, *, training: bool, real=None) -> LossOutput:
        rows = None
        if real is not None:  # only the rows the data holds (the padding comes out)
            rows = tf.where(real > 0)[:, 0]
            x, y, weight = (tf.nest.map_structure(lambda t: tf.gather(t, rows), part)
                            for part in (x, y, weight))
        outputs = model(x, training=training)
        y_pred = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), outputs)
        aligned = _aligned(y, y_pred)
        loss = _per_row(self._loss_fn(aligned, y_pred))
        given = weight
        weight = tf.ones_like(loss) if weight is None else tf.cast(weight, tf.float32)
        # Without Keras's logs (bin/train --task), `weight` is the exact epochs'
        # (`inputs.exact_epochs`) and weighs every per-example value.
        values = {metric.name: _per_row(metric.fn(aligned, y_pred)) * (
            weight if metric.weighted or not self._keras_logs else 1.0)
            for metric in self._metrics if metric.fn is not None}
        loss = loss * weight
        regularization = getattr(model, "losses", None)
        _check_unreduced(self._reduction, regularization)  # add_loss in call(): known here only
        # The engine divides the per-replica sum by the global batch: the
        # padded rows of this replica (all its rows without `real`) times the replicas.
        padded = tf.shape(real)[0] if real is not None else tf.shape(loss)[0]
        held = tf.shape(rows)[0] if rows is not None else padded
        trained, logged = keras_reduction(self._reduction, padded=padded, held=held,
                                          weights=tf.reduce_sum(weight))
        per_example = loss * trained
        if self._keras_logs:
            tracked = loss * logged + (tf.add_n([tf.cast(r, tf.float32) for r in regularization])
                                       if regularization else 0.0)
            values.update({KERAS_LOSS: tracked, KERAS_EXAMPLES: tf.ones_like(loss),
                           KERAS_WEIGHTS: weight})
            self._update_objects(y, outputs, given, tracked)
        if rows is not None:  # back to the padded rows: the engine counts them all
            size = tf.shape(real, out_type=tf.int64)
            put_back = lambda t: tf.scatter_nd(rows[:, None], t, size)  # noqa: E731
            per_example = put_back(per_example)
            values = {name: put_back(value) for name, value in values.items()}
        return LossOutput(per_example_loss=per_example, metrics=values)

    def _update_objects(self, y, y_pred, weight, tracked) -> None:
        """Keras's `compute_metrics` and loss tracker on this replica's rows
        (`y`, the model's own outputs `y_pred`, the user's `weight` or None;
        `tracked`, the per-example loss Keras's tracker averages). Only in a
        replica's step: the engine's probes trace the loss in the
        cross-replica context, where a SyncOnRead variable takes no update
        (and a probe is never run)."""
        if self._objects is None or tf.distribute.in_cross_replica_context():
            return
        for metric in self._metrics:
            if metric.obj is not None:
                metric.obj.update_state(y, y_pred,
                                        sample_weight=weight if metric.weighted else None)
        tracker = self._objects.loss_tracker
        if tracker is not None:
            count = tf.cast(tf.shape(tracked)[0], tf.float32)
            tracker.update_state(tf.math.divide_no_nan(tf.reduce_sum(tracked), count),
                                 sample_weight=count)

    def keras_logs(self, means: dict) -> dict:
        """Keras's logs from the engine's means of the sums above (all means
        over the same rows, so their ratios are ratios of sums): `loss` and
        each `metrics` entry over the examples held, each `weighted_metrics`
        entry over the summed sample weights, as Keras's loss tracker and
        `MeanMetricWrapper`s compute them; a metric that is not a mean is its
        object's `result()`, read now across replicas (its updates so far:
        the epoch's, or the validation's). Other names (the engine's own)
        pass as they are."""
        if KERAS_EXAMPLES not in means:
            return dict(means)
        logs = {name: value for name, value in means.items() if name not in _SUMS}
        examples, weights = means[KERAS_EXAMPLES], means[KERAS_WEIGHTS]
        logs["loss"] = means[KERAS_LOSS] / examples if examples else 0.0
        for metric in self._metrics:
            if metric.fn is None:
                logs[metric.name] = log_value(metric.obj.result())
                continue
            over = weights if metric.weighted else examples
            logs[metric.name] = means[metric.name] / over if over else 0.0
        return logs


def log_value(value: Any) -> Any:
    """A metric's result as Keras's callbacks get it (`pythonify_logs`): a
    float, or an array where it is not one number (F1Score per class)."""
    array = np.asarray(value)
    return float(array) if array.size == 1 else array


class CompiledClassificationTask(ClassificationTask):
    """`bin/train --task=module:function`, where the function builds and
    compiles a Keras model: that model, its loss, metrics and optimizer, on
    the built-in `--dataset` (images in [0, 1], integer labels; with
    `--epochs`, exact epochs). `mean_fn`: see `CompiledLoss`."""

    uses_compile = True

    def __init__(self, model_fn: Callable[[], Any], *, mean_fn: MeanFn, **kwargs):
        super().__init__(**kwargs)
        self.compiled_model_fn = model_fn
        self._mean_fn = mean_fn
        self.name = f"the compiled model of {model_fn_name(model_fn)}"
        self._compiled: Optional[CompiledLoss] = None
        self._optimizer = None

    @classmethod
    def for_function(cls, model_fn: Callable[[], Any], config: Any, *,
                     mean_fn: MeanFn) -> "CompiledClassificationTask":
        plain = ClassificationTask.from_config(config)
        return cls(model_fn, mean_fn=mean_fn, dataset=plain.dataset, model=plain.model_name,
                   exact_epochs=plain.exact_epochs, **plain._data)

    def prepare(self) -> None:
        self.splits = inputs.load(self.dataset, **self._data)

    def build_model(self):
        model = checked_model(self.compiled_model_fn)
        if not model.built:
            model.build((None, *self.splits.input_shape))
        self._compiled = CompiledLoss(model, mean_fn=self._mean_fn)
        self._optimizer = model.optimizer
        self.jit_compile = bool(getattr(model, "jit_compile", False))
        return model

    def build_optimizer(self):
        return self._optimizer

    @tf.autograph.experimental.do_not_convert  # as Keras runs a compiled loss (CompiledLoss)
    def loss(self, model, batch, *, training: bool) -> LossOutput:
        images, labels, *weight = batch
        return self._compiled(model, self.scaled(images), labels, weight[0] if weight else None,
                              training=training)


def _aligned(y, y_pred):
    """Targets of shape (batch,) for predictions of (batch, 1), as Keras's
    compiled loss aligns them (a plain loss function would broadcast)."""
    if isinstance(y, tf.Tensor) and isinstance(y_pred, tf.Tensor) and y.shape.rank is not None \
            and y.shape.rank + 1 == y_pred.shape.rank and y_pred.shape[-1] == 1:
        return tf.expand_dims(y, -1)
    return y


def _per_row(values: tf.Tensor) -> tf.Tensor:
    """One value per example: a loss or metric of shape (batch, ...) averaged over the rest."""
    values = tf.cast(values, tf.float32)
    if values.shape.rank is not None and values.shape.rank > 1:
        values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
    return values


def check_loss(model: keras.Model) -> tuple[Callable, Optional[str]]:
    """The compiled loss's per-example function and reduction
    (`_per_example_loss`), refused in one line where the engine cannot train
    it; called before anything runs the loss (Keras's own symbolic build
    fails on some of these with a shape error that names neither)."""
    loss_fn, reduction = _per_example_loss(model.loss)
    _check_unreduced(reduction, model.losses)
    return loss_fn, reduction


def _check_unreduced(reduction: Any, model_losses) -> None:
    """Keras adds the model losses to every value of an unreduced loss:
    a gradient of `held` times the regularizer's, per replica."""
    if model_losses and reduction in (None, "none"):
        raise ConfigError(
            "fit: the compiled loss has reduction=None and the model has model losses "
            "(kernel_regularizer, add_loss), which Keras adds to every example's loss; "
            "give the loss reduction=\"sum\" (the same gradient) or drop the model losses")


def _per_example_loss(loss: Any) -> tuple[Callable, Optional[str]]:
    """The compiled loss's per-example function (`Loss.call`, before its
    reduction) and that reduction (a name or function: Keras's default,
    "sum_over_batch_size")."""
    if loss is None:
        raise ConfigError("fit: the model was compiled without a loss; compile(loss=...)")
    if isinstance(loss, (dict, list, tuple)):
        raise ConfigError("fit: a loss per output (a dict or list of losses) is not supported; "
                          "write a tfloop Task whose loss() combines them")
    fn = keras.losses.get(loss) if isinstance(loss, str) else loss
    if isinstance(fn, keras.losses.Loss):
        return fn.call, fn.reduction  # before the reduction: per-example values
    if not callable(fn):
        raise ConfigError(f"fit: the compiled loss {loss!r} is not a loss")
    return fn, SUM_OVER_BATCH_SIZE


#: Keras's default reduction (`keras.losses.Loss(reduction=...)`).
SUM_OVER_BATCH_SIZE = "sum_over_batch_size"


def keras_reduction(reduction: Optional[str], *, padded, held, weights) -> tuple:
    """(trained, logged): what one replica's per-example `sample_weight *
    loss` is multiplied by so that the engine's step (the per-replica sum
    over the global batch, `padded` rows times the replicas) trains on what
    Keras's `fit` under a strategy differentiates, and so that their sum
    over the examples (`KERAS_LOSS`, over the `held` real rows) is what
    Keras's loss tracker sums.

    Keras's replica loss (`keras.losses.loss.reduce_values`) is, over its
    `held` rows with summed weight `weights`, `sum(w * loss)` divided by
    `held` ("sum_over_batch_size", "mean") or by `weights`
    ("mean_with_sample_weight", which without sample weights is `held`
    too) and by the replicas (`scale_loss_for_distribution`); "sum" is not
    divided, and "none"/None leaves the values, whose gradient is that of
    their sum. Its tracker adds `replicas * replica loss` weighted by
    `held`: for a mean, `sum(w * loss)`; for "sum", `replicas * held` times
    it; for "none", the mean of the values (weighted by `held`, so their
    sum) times the replicas (Keras's own log of "none" grows with the
    replicas).
    """
    replicas = tf.cast(tf.distribute.get_strategy().num_replicas_in_sync, tf.float32)
    padded, held = tf.cast(padded, tf.float32), tf.cast(held, tf.float32)
    if reduction in ("sum", "none", None):
        return padded * replicas, (replicas * held if reduction == "sum" else replicas)
    if reduction == "mean_with_sample_weight":
        return tf.math.divide_no_nan(padded, weights), tf.math.divide_no_nan(held, weights)
    return tf.math.divide_no_nan(padded, held), 1.0


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _per_example_metric(metric: Any, loss: Any, mean_fn: MeanFn) -> tuple[str, Callable]:
    """(its Keras log name, its per-example function) for one compiled metric.
    Keras logs a metric given as a string under that string (`"mae"` is
    logged `mae`, though `keras.metrics.get("mae")` is named
    `mean_absolute_error`), a metric object under its `name`, a function
    under its `__name__` (`keras.trainers.compile_utils.get_metric`)."""
    if isinstance(metric, str) and metric.lower() in _ACCURACY:
        return metric, _accuracy_for(loss)
    if isinstance(metric, dict):  # get_compile_config() serializes metric objects
        metric = keras.metrics.deserialize(metric)
    if isinstance(metric, keras.metrics.Metric):
        fn = mean_fn(metric)
        if fn is None:
            raise ConfigError(
                f"fit: metric {metric.name!r} ({type(metric).__name__}) is not a mean of "
                "per-example values, which is what the engine averages across replicas and "
                "steps; compute it after training (model.evaluate) or drop it")
        return metric.name, fn
    fn = keras.metrics.get(metric) if isinstance(metric, str) else metric
    if isinstance(fn, keras.metrics.Metric):
        name, fn = _per_example_metric(fn, loss, mean_fn)
        return (metric if isinstance(metric, str) else name), fn
    if not callable(fn):
        raise ConfigError(f"fit: the compiled metric {metric!r} is not a metric")
    return (metric if isinstance(metric, str) else getattr(fn, "__name__", "metric")), fn


def _accuracy_for(loss: Any) -> Callable:
    """`"accuracy"` as Keras resolves it, by the loss: sparse, categorical or binary."""
    name = _snake(type(loss).__name__) if isinstance(loss, keras.losses.Loss) else (
        loss if isinstance(loss, str) else getattr(loss, "__name__", ""))
    if "binary" in name:
        return keras.metrics.binary_accuracy
    if "sparse" in name:
        return keras.metrics.sparse_categorical_accuracy
    if "categorical" in name:
        return keras.metrics.categorical_accuracy

    def accuracy(y_true, y_pred):  # by shape, as Keras's "accuracy" does
        if y_pred.shape[-1] == 1:
            return keras.metrics.binary_accuracy(y_true, y_pred)
        if y_true.shape.rank == y_pred.shape.rank and y_true.shape[-1] == y_pred.shape[-1]:
            return keras.metrics.categorical_accuracy(y_true, y_pred)
        return keras.metrics.sparse_categorical_accuracy(y_true, y_pred)
    return accuracy
