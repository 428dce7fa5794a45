"""`fit`'s task: a compiled Keras model trained on Keras-style datasets.

The compiled loss, metrics and optimizer map to the engine's step as
`engine.task.compiled_model` says (a compiled model is a kind of task, in the
user's room); what is `fit`'s own lives here: the training data as fixed
global batches with exact epochs (`engine.keras_fit.epochs`), a model built
on the data's first batch, and the epoch's running sums checkpointed for
Keras's callbacks (`engine.keras_fit.callbacks`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.keras_fit import callbacks, epochs, py_dataset
from tfloop.engine.recipe import keras_bridge
from tfloop.engine.task import Task
from tfloop.engine.task.compiled_model import CompiledLoss, checked_model, model_fn_name
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
        return {"fit_epoch": self.epoch_state.variable}

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
        self.model, self._compiled = model, CompiledLoss(
            model, mean_fn=keras_bridge.per_example_metric_fn, keras_logs=True)
        self.jit_compile = bool(getattr(model, "jit_compile", False))
        if self._loop_length is not None:
            self.steps_per_execution = self._loop_length(model)
        return model

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

    def loss(self, model, batch, *, training: bool) -> LossOutput:
        if isinstance(batch, tuple) and len(batch) == 4:  # (`epochs.weighted_batches`)
            x, y, weight, real = batch
            return self._compiled(model, x, y, weight, training=training, real=real)
        x, y, weight = epochs.split_element(batch)  # validation: the user's batches
        return self._compiled(model, x, y, weight, training=training)

    def keras_logs(self, means: dict) -> dict:
        """Keras's logs from the engine's means (`CompiledLoss.keras_logs`)."""
        return self._compiled.keras_logs(means) if self._compiled else dict(means)

    @staticmethod
    def _dataset(data: Any, context: InputContext) -> tf.data.Dataset:
        return data(context) if callable(data) else data
