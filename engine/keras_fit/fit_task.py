"""`fit`'s task: a compiled Keras model trained on Keras-style datasets.

The compiled loss, metrics and optimizer map to the engine's step as
`engine.task.compiled_model` says (a compiled model is a kind of task, in the
user's room); what is `fit`'s own lives here: the training data as fixed
global batches with exact epochs (`engine.keras_fit.epochs`), a model built
on the data's first batch and then as Keras's `fit` builds it (its compiled
metrics, loss and optimizer: `engine.keras_fit.keras_state`), and what
Keras's callbacks read across a resume: the epoch's running sums
(`engine.keras_fit.callbacks`) and the model's metric objects, both in the
run's checkpoints.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.keras_fit import callbacks, epochs, keras_state, py_dataset, steps
from tfloop.engine.recipe import keras_bridge
from tfloop.engine.task import Task
from tfloop.engine.task.compiled_model import (CompiledLoss, MetricObjects, check_loss,
                                               checked_model, model_fn_name)
from tfloop.engine.task.losses import LossOutput
from tfloop.inputs import InputContext


class CompiledModelTask(Task):
    """`fit`'s task: `model_fn()` builds and compiles the model under the
    strategy scope (or `model_fn` is the compiled model itself, built under
    the strategy `fit` adopts); `train_data`/`validation_data` are Keras-style datasets
    (`engine.keras_fit.epochs`), or functions `(InputContext) -> dataset`."""

    #: The run uses the compiled loss, metrics and optimizer (run.py's notice is not for it).
    uses_compile = True

    def __init__(self, model_fn: Callable[[], Any], train_data: Any, *, global_batch_size: int,
                 validation_data: Any = None,
                 loop_length: Optional[Callable[[keras.Model], Optional[int]]] = None):
        self.model_fn = model_fn
        self._train, self._validation = train_data, validation_data
        self.global_batch_size = global_batch_size
        self.model: Optional[keras.Model] = None
        self._compiled: Optional[CompiledLoss] = None
        #: The model's own steps, when its class overrides them (`steps`).
        self._steps: Optional[steps.ModelSteps] = None
        #: `compile(jit_compile=True)`: the engine's step compiles with XLA (--jit_compile).
        self.jit_compile = False
        #: The steps of one loop from the compiled model's `steps_per_execution`
        #: (`loop_length(model)`, fit's; None: RunConfig.steps_per_loop's loops),
        #: decided when the model is built: a refusal comes before anything is written.
        self._loop_length = loop_length
        self.steps_per_execution: Optional[int] = None
        #: The epoch's running sums, checkpointed (`engine.keras_fit.callbacks`).
        self.epoch_state = callbacks.EpochState()
        #: The user's batches' element spec, for Keras's compiled metrics
        #: (`engine.keras_fit.keras_state`); a function's once the engine called it.
        self.element_spec = getattr(train_data, "element_spec", None)  # a dataset's, a PyDataset's

    def checkpointed(self) -> dict:
        """The epoch's running sums and every metric variable of the model
        (`model.metrics_variables`: the compiled metrics, the loss tracker,
        a model's own trackers), so that an epoch resumed inside logs what
        the uninterrupted one logs (AUC's counts included). Keras does not
        checkpoint them; they are SyncOnRead, saved as their sum over the
        replicas and restored as that sum."""
        # Keyed by position and short name: a path holds the metric's
        # name when it was made, which Keras numbers (`precision_1`) when a
        # process builds the model twice.
        return {"fit_epoch": self.epoch_state.variable,
                "fit_metrics": {f"{index:03d}_{re.sub(r'[^0-9A-Za-z_]', '_', variable.name)}":
                                variable
                                for index, variable in enumerate(self.model.metrics_variables)}}

    def describe(self) -> str:
        if isinstance(self.model_fn, keras.Model):
            return f"fit: the compiled model {self.model_fn.name!r}"
        name = getattr(self.model_fn, "__name__", type(self.model_fn).__name__)
        return f"fit: the compiled model of {name}()"

    @property
    def has_eval(self) -> bool:
        return self._validation is not None

    def build_model(self):
        # A model handed in is the script's, trained in place under its own
        # strategy (adopted by `fit`); a function is called in the scope.
        model = (self.model_fn if isinstance(self.model_fn, keras.Model)
                 else checked_model(self.model_fn))
        if not model.built or not model.variables:
            # keras.Sequential() with no Input, a subclassed keras.Model (built()
            # or not): Keras's fit makes its variables on the first batch; here,
            # in the scope, on one batch of zeros shaped as the data's.
            model(self._zeros(), training=False)
        if not model.trainable_variables:
            raise ConfigError(f"fit: the model of {model_fn_name(self.model_fn)} has no trainable "
                              "variables after a call on a batch of the training data")
        strategy = tf.distribute.get_strategy()  # build_model runs in the run's scope
        if not steps.overridden(model):
            check_loss(model)  # before Keras's symbolic build runs it
        keras_state.symbolic_build(model, self._element_spec(strategy), strategy)
        self.model = model
        self.jit_compile = bool(getattr(model, "jit_compile", False))
        if self._loop_length is not None:
            self.steps_per_execution = self._loop_length(model)
        parameter_servers = isinstance(strategy,
                                       tf.distribute.experimental.ParameterServerStrategy)
        if steps.overridden(model):
            if parameter_servers:
                raise ConfigError(
                    f"fit: {type(model).__name__} overrides {', '.join(steps.overridden(model))}"
                    ", a step of its own, and --strategy=parameter_server runs the compiled "
                    "loss alone; use multi_worker")
            # The model's own train_step and test_step, run whole (`steps`).
            self._steps = steps.ModelSteps(model, self.element_spec, strategy,
                                           validates=self._validation is not None)
            self.train_step = self._steps.train_step
            return model
        # The metric objects Keras built are updated in the engine's steps; a
        # parameter server's workers would update their own copies, which no
        # one reads: there the means are the engine's and the rest refused.
        objects = None if parameter_servers else MetricObjects(
            *keras_bridge.compiled_metric_objects(model),
            loss_tracker=keras_bridge.loss_tracker(model))
        self._compiled = CompiledLoss(model, mean_fn=keras_bridge.per_example_metric_fn,
                                      keras_logs=True, objects=objects)
        return model

    def _element_spec(self, strategy) -> Any:
        """The user's batches' element spec; for a function, that of a
        dataset it builds now (never read), as Keras's `fit` builds its model
        and metrics from the first batch before training."""
        if self.element_spec is None:
            self.element_spec = self._train(InputContext(
                global_batch_size=self.global_batch_size,
                num_replicas=strategy.num_replicas_in_sync)).element_spec
        return self.element_spec

    def reset_metrics(self) -> None:
        """Keras's `model.reset_metrics()`: where Keras's `fit` calls it."""
        if self.model is not None:
            self.model.reset_metrics()

    def _zeros(self):
        spec = getattr(self._train, "element_spec", None)
        if spec is None:
            raise ConfigError("fit: the model is not built (no keras.Input) and the training "
                              "data is a function; give the model a keras.Input(shape)")
        x, _, _ = epochs.split_element(spec)
        return tf.nest.map_structure(
            lambda spec: tf.zeros([1, *spec.shape[1:]], spec.dtype), x)

    def build_optimizer(self):
        return self.model.optimizer

    def train_dataset(self, context: InputContext) -> tf.data.Dataset:
        dataset = self._dataset(self._train, context)
        if self.element_spec is None:
            self.element_spec = dataset.element_spec
        return epochs.weighted_batches(dataset, self.global_batch_size, context.num_replicas)

    def probe_dataset(self, context: InputContext) -> Optional[tf.data.Dataset]:
        """A fresh pipeline only from a function of the context: a dataset
        object handed to `fit` is the run's own (its shuffle's seeds are shared
        by every iterator of it), and a PyDataset's reads call its hooks, so
        neither gets a probe."""
        if not callable(self._train) or isinstance(self._train, py_dataset.PyDatasetInput):
            return None
        return self.train_dataset(context)

    def eval_dataset(self, context: InputContext) -> Optional[tf.data.Dataset]:
        if self._validation is None:
            return None
        return self._dataset(self._validation, context)

    # Unconverted, as Keras's own train and test functions run the compiled
    # loss and the model's steps (`do_not_convert`): the engine's code, and the
    # user's Keras objects exactly as `fit` runs them (engine.task.user_code).
    @tf.autograph.experimental.do_not_convert
    def loss(self, model, batch, *, training: bool) -> LossOutput:
        if isinstance(batch, tuple) and len(batch) == 4:  # (`epochs.weighted_batches`)
            x, y, weight, real = batch
            if self._steps is not None:  # the engine's probe: the model's train_step trains
                return LossOutput(per_example_loss=tf.zeros_like(real))
            return self._compiled(model, x, y, weight, training=training, real=real)
        if self._steps is not None:  # validation by the model's test_step
            return self._steps.test_loss(model, batch)
        x, y, weight = epochs.split_element(batch)  # validation: the user's batches
        return self._compiled(model, x, y, weight, training=training)

    def keras_logs(self, means: dict) -> dict:
        """Keras's logs of a train loop from the engine's means
        (`CompiledLoss.keras_logs`), or the model's own steps' (`steps`)."""
        if self._steps is not None:
            return self._steps.logs()
        return self._compiled.keras_logs(means) if self._compiled else dict(means)

    def val_logs(self, means: dict) -> dict:
        """Keras's logs of a validation (`val_` is added by the callbacks)."""
        if self._steps is not None:
            return self._steps.logs(validation=True)
        return self.keras_logs(means)

    @staticmethod
    def _dataset(data: Any, context: InputContext) -> tf.data.Dataset:
        return data(context) if callable(data) else data
