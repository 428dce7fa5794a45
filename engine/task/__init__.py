"""The user's side of the engine: what to train and how a step's loss is said.

- `plugin`: `Task` (model, data, per-example loss), `Objective` (one loss with
  its own variables and optimizer: a GAN's two), `ClassificationTask` (the
  built-in --model/--dataset task), and `load` for `--task=module:Class`;
- `losses`: `LossOutput` and `Gradients`, what a loss function returns;
- `compiled_model`: a compiled Keras model as a kind of task (its loss and
  metrics as a `LossOutput`; `--task=module:function`);
- `failures`: a task's own mistakes in one line naming its method, and
  `exit_class`, where every failure of a run becomes its exit status.

The names below are the room's public face: `from tfloop.engine.task import Task`.
"""

from tfloop.engine.task.losses import Gradients, LossFn, LossOutput, classification_loss
from tfloop.engine.task.plugin import ClassificationTask, Objective, Task, check_defines, load

__all__ = ["ClassificationTask", "Gradients", "LossFn", "LossOutput", "Objective", "Task",
           "check_defines", "classification_loss", "load"]
