"""tfloop: custom training loops on `tf.distribute`, with the all-reduce of your choice.

`import tfloop` is the whole API a training script needs::

    import tfloop

    class Regression(tfloop.Task):
        def __init__(self, x, y):
            self.data = tfloop.ArrayData(features=x, targets=y, eval_fraction=0.2)
        def build_model(self): ...               # under strategy.scope()
        def train_dataset(self, context): return self.data.train_dataset(context)
        def eval_dataset(self, context): return self.data.eval_dataset(context)
        def loss(self, model, batch, *, training): return tfloop.LossOutput(...)

    result = tfloop.run(tfloop.RunConfig(model_dir="runs/reg"), task=Regression(x, y))
    result["eval/loss"], result.model, result.history

What is here (`help(tfloop.RunConfig)` lists every field with its flag's help):

    run, RunConfig, RunResult          one run (bin/train's), its settings, its result
    fit                                a compiled Keras model, its callbacks, exact epochs
    use_devices                        the devices (logical CPUs too), set before the data
    Task, Objective, LossOutput        your model, data and loss; several losses (a GAN)
    Gradients, ReplicaStep             your own per-replica step (Task.gradients)
    ClassificationTask                 the built-in --model/--dataset task
    ArrayData, from_npz, RecordData, InputContext   data helpers for a Task
    export_checkpoint                  a kept checkpoint as a SavedModel (bin/export)
    ConfigError, InputError, ModelError, RunFailure, NonFinite, TaskFailure,
    ClusterFailure, Preempted, StopTraining          what a caller may catch
    Controller, Trainer, Evaluator     for full control: the pieces run() assembles

This is the one public face: `tfloop.engine` answers the same names from
this same table (`from tfloop.engine import run` still works).

Everything else stays where it lives, reachable and not part of this face:
`tfloop.engine` (engine/__init__.py lists its rooms), `tfloop.inputs`,
`tfloop.models`, `tfloop.collectives`, `tfloop.launch`, `tfloop.bench`, `tfloop.bin`.

Why a folder of its own: the other packages install from the repository's
top-level folders (`engine/` as `tfloop.engine`, ...: pyproject.toml), and
the name `tfloop` needs one file that is none of theirs. This folder holds
that file only. Names resolve on first use, so `import tfloop` loads no
TensorFlow, and `tfloop.RunConfig` none either (bin/ builds its flags first).
"""

import importlib as _importlib
import pkgutil as _pkgutil

# Every `tfloop` folder on sys.path serves the subpackages, as when tfloop was
# a namespace package: run from a checkout's root, this folder comes first
# and an installed (not editable) tfloop/engine/ ... is found beside it.
__path__ = _pkgutil.extend_path(__path__, __name__)

#: Each public name and the module that defines it; resolved on first use.
_EXPORTS = {
    "run": "tfloop.engine.assembly.run",
    "RunResult": "tfloop.engine.assembly.run",
    "export_checkpoint": "tfloop.engine.assembly.run",
    "RunConfig": "tfloop.engine.config",
    "Task": "tfloop.engine.task",
    "Objective": "tfloop.engine.task",
    "ClassificationTask": "tfloop.engine.task",
    "LossOutput": "tfloop.engine.task.losses",
    "Gradients": "tfloop.engine.task.losses",
    "ReplicaStep": "tfloop.engine.loop.replica_step",
    "ArrayData": "tfloop.inputs.arrays",
    "from_npz": "tfloop.inputs.arrays",
    "RecordData": "tfloop.inputs.records",
    "InputContext": "tfloop.inputs.context",
    "ConfigError": "tfloop.engine.errors",
    "RunFailure": "tfloop.engine.errors",
    "NonFinite": "tfloop.engine.errors",
    "TaskFailure": "tfloop.engine.errors",
    "ClusterFailure": "tfloop.engine.errors",
    "InputError": "tfloop.inputs.errors",
    "ModelError": "tfloop.models.errors",
    "Preempted": "tfloop.engine.loop.preemption",
    "StopTraining": "tfloop.engine.loop.actions",
    "fit": "tfloop.engine.keras_fit.fit",
    "use_devices": "tfloop.engine.runtime.devices",
    "Controller": "tfloop.engine.loop.controller",
    "Trainer": "tfloop.engine.loop.trainer",
    "Evaluator": "tfloop.engine.loop.evaluator",
}

__all__ = sorted(_EXPORTS)

#: The packages under the face, reachable as `tfloop.engine` ... without an import of their own.
_PACKAGES = ("engine", "inputs", "models", "collectives", "launch", "bench", "bin")


def __getattr__(name):
    if name in _PACKAGES:
        return _importlib.import_module(f"{__name__}.{name}")  # binds itself here
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tfloop' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__():
    return sorted(set(__all__) | set(_PACKAGES))
