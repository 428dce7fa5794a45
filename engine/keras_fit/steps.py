"""A Keras model's own `train_step` and `test_step`, run by the engine.

Keras's `fit` calls `model.train_step(data)` on every replica
(`strategy.run`), and the step does everything: the forward pass, the loss,
`self.optimizer.apply(...)` (which all-reduces the gradients), the metric
updates, and returns a dict of logs. A model whose class overrides it (or
what it is made of: `test_step`, `compute_loss`, `compute_metrics`,
`get_metrics_result`, the `metrics` property) trains here through that very
method (`ModelSteps`), as the engine's whole step (`Task.train_step`,
`engine.loop.trainer`):

- each replica gets `data` as Keras's `fit` gives it: the user's `(x, y)` or
  `(x, y, sample_weight)` (class weights as the sample weight), its real
  rows only (a partial last batch is split as `tf.distribute` splits it:
  `engine.keras_fit.epochs`; Keras feeds the smaller batch, and so does this);
- the optimizer's update goes through the engine's one all-reduce, through
  the run's collective: `engine.recipe.keras_bridge.reducing_gradients` puts
  it where Keras's optimizer reduces (after Keras's own `clipnorm`, as in
  Keras's `fit`), while the step is traced;
- the logs are Keras's (`Trainer._get_metrics_result_or_logs`): at an
  epoch's end (and at each loop's end, for `on_train_batch_end`), the
  model's `get_metrics_result()` read across the replicas when its names are
  those of the dict the last step returned, else that dict, averaged over
  the replicas (the dict each replica returns is kept in SyncOnRead
  variables, `_LastLogs`); nested dicts are flattened as Keras's callbacks
  flatten them;
- validation runs `model.test_step` the same way (Keras's own when not
  overridden), after the model's metrics are reset, as Keras's `evaluate`;
- the engine's own records (metrics.json's `loss`, the NaN guard, progress
  lines) take the `loss` the step returns (this replica's value, weighed by
  its examples); a step that returns no `loss` records 0 there, and the NaN
  guard then watches the gradient norm and the weights only.

The structure of the returned dicts is learnt before training by tracing
each step once on every replica (`strategy.run` in a `tf.function` that is
never run): a step that raises there raises before anything is trained,
named in one line (`engine.task.failures`).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.keras_fit import epochs
from tfloop.engine.recipe import keras_bridge
from tfloop.engine.task import failures as task_failures
from tfloop.engine.task.compiled_model import log_value
from tfloop.engine.task.losses import LossOutput

#: What Keras's `fit` calls on the model (its `train_step` and what that
#: delegates to); a class that overrides any of them has its steps run whole.
_STEP_PARTS = ("train_step", "test_step", "compute_loss", "compute_metrics",
               "get_metrics_result", "metrics")


def overridden(model: keras.Model) -> list[str]:
    """The parts of Keras's step that `model`'s class overrides."""
    return [name for name in _STEP_PARTS
            if getattr(type(model), name, None) is not getattr(keras.Model, name, None)]


class ModelSteps:
    """`model`'s own `train_step` and `test_step` as the engine's whole step
    and evaluation, for batches of `element_spec` (the user's `(x, y)` or
    `(x, y, sample_weight)`). Made under `strategy`'s scope once the model
    is built (`keras_state.symbolic_build`: its optimizer too), it traces
    each step once to learn its logs; `validates`: whether there is
    validation data (else `test_step` is not traced)."""

    def __init__(self, model: keras.Model, element_spec: Any, strategy: Any, *,
                 validates: bool):
        self.model = model
        self._weighted = epochs.split_element(element_spec)[2] is not None
        spec = tf.nest.map_structure(
            lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype), element_spec)
        self._train = _LastLogs(strategy, self._traced(model.train_step, "train_step", spec,
                                                       strategy))
        self._test = _LastLogs(strategy, self._traced(model.test_step, "test_step", spec,
                                                      strategy)) if validates else None
        name = f"{type(model).__name__}.train_step"
        self.train_step = _named(self._train_step, name)

    @staticmethod
    def _traced(method, name: str, spec: Any, strategy: Any) -> Any:
        """The structure of what `method` returns, traced on every replica
        (its first replica's), never run; what the step raises, in one line."""
        def run(data):
            return strategy.run(method, args=(data,))

        with task_failures.calling(method.__self__, name):
            outputs = tf.function(run).get_concrete_function(spec).structured_outputs
        return tf.nest.map_structure(
            lambda value: strategy.experimental_local_results(value)[0], outputs)

    def _train_step(self, model, batch, step) -> LossOutput:
        """`Task.train_step`: the model's `train_step` on this replica's real
        rows, its optimizer's reduction the engine's (`step.all_reduce`)."""
        x, y, weight, real = batch
        rows = tf.where(real > 0)[:, 0]
        data = tf.nest.map_structure(lambda t: tf.gather(t, rows),
                                     (x, y, weight) if self._weighted else (x, y))
        with keras_bridge.reducing_gradients(model.optimizer, step.all_reduce):
            logs = model.train_step(data)
        return self._train.keep(logs, tf.shape(rows)[0])

    def test_loss(self, model, data) -> LossOutput:
        """Validation (`Evaluator`'s loss): the model's `test_step` on this
        replica's batch. In the engine's probe (the cross-replica context,
        never run) nothing is called: the step was traced already."""
        x, _, _ = epochs.split_element(data)
        size = tf.shape(tf.nest.flatten(x)[0])[0]
        if tf.distribute.in_cross_replica_context():
            return LossOutput(per_example_loss=tf.zeros([size]))
        return self._test.keep(model.test_step(data), size)

    def logs(self, *, validation: bool = False) -> dict:
        """Keras's logs now: the model's metrics read across the replicas
        where their names are those of the dict the last step returned, else
        that dict averaged over the replicas, flattened as Keras's callbacks
        flatten them."""
        last = (self._test if validation else self._train).read()
        results = self.model.get_metrics_result()
        chosen = results if isinstance(last, dict) and set(last) == set(results) else last
        return _flat(chosen)


class _LastLogs:
    """What each replica's last step returned, in SyncOnRead variables
    averaged over the replicas when read, as Keras's `fit` averages a step's
    outputs (`reduce_per_replica`, "mean"). `structure`: a traced return."""

    def __init__(self, strategy: Any, structure: Any):
        if structure is not None and not isinstance(structure, dict):
            raise ConfigError(f"the model's step returned {type(structure).__name__}; Keras's "
                              "fit takes a dict of logs ({'loss': ..., 'mae': ...})")
        self._structure = structure or {}
        # A traced tensor's spec, or a Python number's the step returned as it is.
        leaves = [leaf if isinstance(leaf, tf.Tensor) else tf.constant(leaf)
                  for leaf in tf.nest.flatten(self._structure)]
        for leaf in leaves:
            if not (leaf.dtype.is_floating or leaf.dtype.is_integer or leaf.dtype.is_bool) \
                    or not leaf.shape.is_fully_defined():
                raise ConfigError(f"the model's step returned a log of {leaf.dtype.name} "
                                  f"{leaf.shape}; Keras's logs are numbers of a known shape")
        with strategy.scope():
            self._variables = [
                tf.Variable(tf.zeros(leaf.shape, tf.float32), trainable=False,
                            synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.MEAN, name="last_log")
                for leaf in leaves]

    def keep(self, logs: Any, size) -> LossOutput:
        """Replica context: `logs` (this replica's) kept; the engine's record
        of the step: its `loss` log for each of its `size` examples."""
        for variable, value in zip(self._variables, tf.nest.flatten(logs or {})):
            variable.assign(tf.cast(value, tf.float32))
        loss = (logs or {}).get("loss")
        loss = (tf.cast(tf.reshape(loss, []), tf.float32) if loss is not None
                and tf.convert_to_tensor(loss).shape.num_elements() == 1 else tf.constant(0.0))
        return LossOutput(per_example_loss=tf.fill([size], loss))

    def read(self) -> Any:
        """Cross-replica context: the last logs, averaged over the replicas."""
        return tf.nest.pack_sequence_as(
            self._structure, [v.read_value().numpy() for v in self._variables])


def _flat(logs: Any) -> dict:
    """Keras's logs as its callbacks see them (`pythonify_logs`): nested
    dicts flattened in sorted order, numbers as floats."""
    flat = {}
    for key, value in sorted((logs or {}).items()):
        if isinstance(value, dict):
            flat.update(_flat(value))
        else:
            flat[key] = log_value(np.asarray(value))
    return flat


def _named(fn, qualname: str):
    """`fn` named as the user's method it runs, for the engine's one-line errors."""
    def step(*args, **kwargs):
        return fn(*args, **kwargs)
    step.__qualname__ = step.__name__ = qualname
    return step

