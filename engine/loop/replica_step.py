"""The per-replica math every train and eval loop shares.

`Trainer`, `ParameterServerTrainer` and `Evaluator` differ in how they loop
and reduce, not in what one replica computes: the loss over the *global*
batch, the gradients, and which metrics the user's loss function reports.
Keeping that here means a fix to the loss scaling reaches every strategy.
It is also where a step calls the user's code (`loss_fn`, a task's
`gradients` and `train_step`), so that code is converted by autograph here
(`engine.task.user_code`), whichever loop, traced without autograph, calls it::

    out   = loss_fn(model, batch, training=True)
    loss  = compute_average_loss(out.per_example_loss, global_batch_size)
            + scale_regularization_loss(model.losses)
    grads = tape.gradient(optimizer.scale_loss(loss), variables)
"""

from __future__ import annotations

import re
from typing import Any, Callable

import keras
import tensorflow as tf

from tfloop.engine.task import failures as task_failures
from tfloop.engine.task import user_code
from tfloop.engine.errors import ConfigError
from tfloop.engine.task.losses import Gradients, LossFn, LossOutput


def per_replica_spec(element_spec: Any) -> Any:
    """The dataset's element spec with the batch dimension left open."""
    return tf.nest.map_structure(
        lambda spec: tf.TensorSpec([None] + spec.shape[1:], spec.dtype), element_spec
    )


def metric_names(loss_fn: LossFn, model: Any, element_spec: Any,
                 step_fn: Callable = None) -> list[str]:
    """Traces `loss_fn` once symbolically to learn which metrics it reports,
    and checks there that it keeps the `LossOutput` contract.

    The running sums must exist before the compiled loop is traced, and the
    names are only known from the user's function. `step_fn(batch)`: a
    task's own step (`hook_gradients`, bound), traced instead.
    """
    def probe(batch):
        if step_fn is not None:
            _, per_example_loss, metrics = step_fn(batch)
            return per_example_loss, metrics
        output = user_code.converted(loss_fn)(model, batch, training=False)
        return output.per_example_loss, dict(output.metrics)

    try:  # the engine's code: no autograph; the user's is converted (engine.task.user_code)
        per_example_loss, metrics = tf.function(probe, autograph=False).get_concrete_function(
            per_replica_spec(element_spec)).structured_outputs
    except ConfigError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, tf.errors.OpError) as error:
        # The model or the loss cannot take the dataset's batches: a task whose
        # data and model disagree.
        reason = _first_reason(str(error)) or type(error).__name__
        raise ConfigError(
            f"the loss function fails on a batch of {_describe(element_spec)}: {reason}; "
            "make the dataset's elements what the model and loss expect") from None
    except Exception as error:  # any other mistake in the user's loss: name it, keep its frames
        named = step_fn or loss_fn
        where = getattr(named, "__qualname__", None) or type(named).__name__
        raise task_failures.hook_error(where, error) from error
    check_per_example("per_example_loss", per_example_loss)
    if not per_example_loss.dtype.is_floating:
        raise ConfigError(f"loss_fn's per_example_loss is {per_example_loss.dtype.name}, not a "
                          "float, and gradients flow only through floats; compute it in float32 "
                          "(cast integer labels, not the loss)")
    for name, value in metrics.items():
        check_per_example(f"metrics[{name!r}]", value)
    return sorted(metrics)


_NOT_A_REASON = ("in user code", "File ", "Exception encountered", "Arguments received", "•")


def _first_reason(message: str) -> str:
    """The line that says what went wrong, out of autograph's trace and
    Keras's call report (`ValueError: Exception encountered when calling
    Sequential.call().` / the reason / `Arguments received ...`)."""
    message = re.sub(r"\x1b\[[0-9;]*m", "", message)  # Keras's bold
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if re.match(r"^\w+(Error|Exception): ", line)]
    start = errors[-1] if errors else 0
    for line in lines[start:]:
        line = re.sub(r"^\w+(Error|Exception): ", "", line)
        if line and not line.startswith(_NOT_A_REASON) and not line.endswith(":"):
            return line[:300]
    return lines[0][:300] if lines else ""


def _describe(element_spec: Any) -> str:
    """`(float32 (64, 28, 28, 1), int64 (64,))`: a batch's structure, short."""
    def one(spec):
        shape = getattr(spec, "shape", None)
        return f"{spec.dtype.name} {tuple(shape.as_list())}" if shape is not None else str(spec)
    described = tf.nest.map_structure(one, element_spec)
    return str(described).replace("'", "")


def check_per_example(name: str, value: Any) -> None:
    """Refuses a loss-function output that is not one value per example.

    Traced with the batch dimension open, a per-example value has shape
    `(None,)`. A scalar is the tutorials' mean, which the engine would divide
    by the global batch a second time; `(None, None)` is almost always a
    broadcasting slip, `(batch, 1)` against `(batch,)`, which trains on
    garbage and reports an accuracy above 1.
    """
    shape = value.shape
    if shape.rank == 1 and shape[0] is None:
        return
    if shape.rank == 0:
        fix = ("return one value per example, not their mean: the engine divides their sum "
               "by the global batch (tf.nn.compute_average_loss)")
    elif shape.rank is not None and shape.rank > 1:
        fix = ("a (batch, 1) tensor against a (batch,) one broadcasts to (batch, batch): "
               "squeeze the trailing 1 (tf.squeeze(x, -1)) before combining them")
    else:
        fix = "return one value per example of the replica's batch"
    shown = "unknown" if shape.rank is None else "({})".format(
        ", ".join("batch" if d is None else str(d) for d in shape.as_list()))
    raise ConfigError(f"loss_fn's {name} has shape {shown}, not (batch,); {fix}")


class ReplicaStep:
    """What a task's own step (`Task.gradients(model, batch, step)`) gets
    beside the model and its replica's batch: what to differentiate, how the
    engine's own step would do it, and the numbers a correct loss needs.

    Attributes:
      objective: the objective's name ("loss" for a task without objectives).
      variables: what the returned gradients are for, in this order.
      global_batch_size: the examples of the whole step over every replica
        (and every micro-batch): per-example sums are divided by it.
      micro_batches: how many slices of the replica's batch this step sees
        (`--accumulation_steps`); `batch` is one of them.
    """

    def __init__(self, *, objective: str, loss_fn: LossFn, variables: list,
                 optimizer: keras.optimizers.Optimizer, global_batch_size: int,
                 micro_batches: int = 1):
        self.objective = objective
        self.variables = list(variables)
        self.global_batch_size = global_batch_size
        self.micro_batches = micro_batches
        self._loss_fn = loss_fn
        self._optimizer = optimizer

    def total_loss(self, per_example_loss: Any, model: Any = None) -> tf.Tensor:
        """The scalar the engine's own step differentiates: the per-example
        loss summed over the *global* batch (`tf.nn.compute_average_loss`),
        plus `model`'s regularization losses (scaled to this replica's
        share), times the loss scale under mixed_float16."""
        loss = tf.nn.compute_average_loss(tf.cast(per_example_loss, tf.float32),
                                          global_batch_size=self.global_batch_size)
        regularization = getattr(model, "losses", None) if model is not None else None
        if regularization:
            loss += tf.nn.scale_regularization_loss(
                tf.add_n([tf.cast(r, tf.float32) for r in regularization])) / self.micro_batches
        return self._optimizer.scale_loss(loss)

    def default(self, model: Any, batch: Any) -> "Gradients":
        """The engine's own step for this objective's loss: what a task
        without `gradients` gets (a hook that changes one objective only
        returns this for the others)."""
        grads, reported, metrics = replica_gradients(
            self._loss_fn, model, batch, self.variables, optimizer=self._optimizer,
            global_batch_size=self.global_batch_size, micro_batches=self.micro_batches)
        return Gradients(grads, reported, metrics)


class WholeStep:
    """What a task's whole step (`Task.train_step(model, batch, step)`: a
    Keras model's own `train_step`) gets beside the model and its replica's
    batch: the engine's all-reduce, which its update must go through.

    Attributes:
      all_reduce: `(gradients, variables) -> gradients` summed over the
        replicas through the run's collective (the one all-reduce of the
        step; its global norm is the step's `grad_norm`).
      optimizer: the objective's optimizer, its own reduction off: it
        applies gradients as given.
      global_batch_size: the examples of the whole step over every replica.
    """

    def __init__(self, *, all_reduce: Callable[[list, list], list],
                 optimizer: keras.optimizers.Optimizer, global_batch_size: int):
        self.all_reduce = all_reduce
        self.optimizer = optimizer
        self.global_batch_size = global_batch_size


def whole_step_output(step_fn: Callable, model: Any, batch: Any, step: WholeStep):
    """`step_fn(model, batch, step)` (`Task.train_step`) checked as the
    engine's records need it: (per-example loss in float32, metrics)."""
    output = user_code.converted(step_fn)(model, batch, step)
    where = getattr(step_fn, "__qualname__", "train_step")
    if not isinstance(output, LossOutput):
        raise ConfigError(f"{where} returned {type(output).__name__}, not a tfloop.LossOutput("
                          "per_example_loss, metrics)")
    reported = tf.cast(output.per_example_loss, tf.float32)
    if reported.shape.rank != 1:
        check_per_example(f"{where}'s per_example_loss", reported)
    return reported, dict(output.metrics)


def hook_gradients(hook: Callable, objective: str, loss_fn: LossFn, model: Any, batch: Any,
                   variables: list, *, optimizer: keras.optimizers.Optimizer,
                   global_batch_size: int, micro_batches: int = 1):
    """`replica_gradients` by the task's own step (`Task.gradients`): the
    same returns, checked (one gradient per variable, per-example values)."""
    step = ReplicaStep(objective=objective, loss_fn=loss_fn, variables=variables,
                       optimizer=optimizer, global_batch_size=global_batch_size,
                       micro_batches=micro_batches)
    output = user_code.converted(hook)(model, batch, step)
    where = getattr(hook, "__qualname__", "gradients")
    if not isinstance(output, Gradients):
        raise ConfigError(f"{where} returned {type(output).__name__}, not tfloop.Gradients("
                          "gradients, per_example_loss, metrics)")
    grads = list(output.gradients)
    if len(grads) != len(variables):
        raise ConfigError(f"{where} returned {len(grads)} gradients for objective {objective!r}, "
                          f"which has {len(variables)} variables (step.variables); return one "
                          "per variable, in that order (None where there is none)")
    reported = tf.cast(output.per_example_loss, tf.float32)
    # One value per example; the probe (`metric_names`, batch dimension open)
    # traces this first, so a slip is refused there, nothing run.
    for name, value in [("per_example_loss", reported), *(
            (f"metrics[{name!r}]", value) for name, value in output.metrics.items())]:
        if tf.convert_to_tensor(value).shape.rank != 1:
            check_per_example(f"{where}'s {name}", tf.convert_to_tensor(value))
    return grads, reported, dict(output.metrics)


def replica_gradients(loss_fn: LossFn, model: Any, batch: Any, variables: list, *,
                      optimizer: keras.optimizers.Optimizer, global_batch_size: int,
                      micro_batches: int = 1):
    """One replica's loss and gradients: the part every strategy's step shares.

    The per-example loss is divided by the *global* batch
    (`compute_average_loss`) and model losses are scaled by the replica count
    (`scale_regularization_loss`), so summing gradients over replicas gives the
    gradient of the global batch. Under mixed precision the objective stays
    float32 and `optimizer.scale_loss` applies the loss scale (identity
    otherwise). `micro_batches`: this batch is one of that many whose
    gradients are summed (`accumulated_gradients`), so each carries that
    share of the model losses.

    Returns:
      (gradients, per-example loss as reported, including regularization; the
      loss function's metrics).
    """
    with tf.GradientTape() as tape:
        output: LossOutput = user_code.converted(loss_fn)(model, batch, training=True)
        per_example_loss = tf.cast(output.per_example_loss, tf.float32)
        loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
        regularization = getattr(model, "losses", None)
        if regularization:
            regularization = tf.add_n([tf.cast(r, tf.float32) for r in regularization])
            loss += tf.nn.scale_regularization_loss(regularization) / micro_batches
        else:
            regularization = None
        scaled_loss = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled_loss, variables)
    reported_loss = per_example_loss
    if regularization is not None:
        reported_loss = per_example_loss + regularization
    return grads, reported_loss, dict(output.metrics)


def accumulated_gradients(loss_fn: LossFn, model: Any, batch: Any, variables: list, *,
                          optimizer: keras.optimizers.Optimizer, global_batch_size: int,
                          micro_batches: int, gradients_fn: Callable = None):
    """`replica_gradients` of this replica's batch, computed `micro_batches`
    slices at a time and summed (`--accumulation_steps`).

    Each slice's loss is divided by the *global* batch of the whole step, so
    the sum is exactly the gradient `replica_gradients` would give for the
    whole batch, while only one slice's activations exist at a time. The
    slices run in a `tf.while_loop` (the graph holds one copy of the model's
    forward and backward pass, not `micro_batches`), and what follows, the
    one all-reduce and the update, happens once per step. Batch
    normalization sees each slice as its batch.

    `gradients_fn`: `replica_gradients`, or the task's own step bound by
    `hook_gradients` (the default: `replica_gradients`).

    Returns what `replica_gradients` returns, for the whole batch.
    """
    gradients_fn = gradients_fn or replica_gradients
    size = tf.shape(tf.nest.flatten(batch)[0])[0]
    slice_size = size // micro_batches

    def micro_batch(index):
        begin = index * slice_size
        return tf.nest.map_structure(lambda x: x[begin:begin + slice_size], batch)

    def gradients_of(index):
        return gradients_fn(loss_fn, model, micro_batch(index), variables,
                                 optimizer=optimizer, global_batch_size=global_batch_size,
                                 micro_batches=micro_batches)

    # The first slice outside the loop: it shows which variables get a
    # gradient (a loop carries tensors, not None) and the metrics' names.
    grads, reported, metrics = gradients_of(0)
    present = [i for i, g in enumerate(grads) if g is not None]
    names = sorted(metrics)

    def collected(first):
        array = tf.TensorArray(tf.float32, size=micro_batches, element_shape=[None])
        return array.write(0, tf.cast(first, tf.float32))

    def step(index, sums, reported_values, metric_values):
        grads, reported, metrics = gradients_of(index)
        sums = [total + tf.convert_to_tensor(grads[i]) for total, i in zip(sums, present)]
        reported_values = reported_values.write(index, reported)
        metric_values = [values.write(index, tf.cast(metrics[name], tf.float32))
                         for values, name in zip(metric_values, names)]
        return index + 1, sums, reported_values, metric_values

    _, sums, reported_values, metric_values = tf.while_loop(
        lambda index, *_: index < micro_batches, step,
        (tf.constant(1), [tf.convert_to_tensor(grads[i]) for i in present], collected(reported),
         [collected(metrics[name]) for name in names]))
    summed = [None] * len(grads)
    for i, total in zip(present, sums):
        summed[i] = total
    return (summed, reported_values.concat(),
            {name: values.concat() for name, values in zip(names, metric_values)})
