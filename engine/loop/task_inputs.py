"""A task's datasets, checked and positioned for the engine.

The engine trusts nothing about a user's `tf.data` pipeline that it cannot
see in its element spec, and says in one line what to change when a
pipeline cannot work: train batches must have the fixed global batch size
(every step divides by it and the compiled step has one shape) and must not
run out. Resume is exact either way: a train builder that reads
`context.start_step` starts there itself; one that does not has the batches
already trained on skipped here, and the log says so.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Optional

import tensorflow as tf

from tfloop.engine.run_dir import run_identity
from tfloop.engine.task import Task
from tfloop.engine.task import failures as task_failures
from tfloop.engine.errors import ConfigError
from tfloop import inputs
from tfloop.inputs import InputContext
from tfloop.launch import tf_config

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class InputPlacement:
    """Where this process's input sits in the run, as the plan decided it:
    what every `InputContext` it builds shares. Plain values, so that this
    room needs nothing of the assembly's `Plan`.

    Attributes:
      global_batch_size: examples per step over every replica.
      replicas: replicas in sync.
      input_workers: processes the input is sharded over.
      pipeline_index: this process's index among them (0 for one).
      shard_policy: `data`, `file` or `off`, resolved for the task's data.
      seed: the run's seed.
      deterministic: `--deterministic`.
      run_json: `model_dir/run.json` as the plan read it (`Plan.run_json`;
        None for a new run): the batch sizes of earlier ranges of steps.
      data_service: `--data_service`, the dispatcher the train pipeline is
        handed to (`engine.loop.served_input`); empty: it runs here.
      service_job: the run's job name prefix there (`served_input.job_prefix`).
    """

    global_batch_size: int
    replicas: int
    input_workers: int
    pipeline_index: int
    shard_policy: str
    seed: Optional[int]
    deterministic: bool
    run_json: Optional[Mapping[str, Any]] = None
    data_service: str = ""
    service_job: str = ""


def context_for(placement: InputPlacement, *, start_step: int = 0,
                global_batch_size: Optional[int] = None, seeded: bool = True,
                served: bool = False) -> InputContext:
    """The `InputContext` this process's pipeline gets (`global_batch_size`:
    another than the run's, a parameter-server worker's; `seeded=False`:
    seed None, each worker draws its own order; `served`: the train pipeline
    the tf.data service runs, which starts at step 0 (a skip there would skip
    in each data worker's share) and which no strategy shards further (the
    service deals it out: `engine.loop.served_input`)).

    A resumed run's context counts the examples already trained on at the
    batch sizes `model_dir/run.json` recorded for each range of steps
    (`engine.run_dir.run_identity.examples_trained`), so a changed
    `--global_batch_size` resumes the data exactly where it stopped.
    """
    batch = global_batch_size or placement.global_batch_size
    examples_trained = None
    shard_policy = "off" if served else placement.shard_policy
    start_step = 0 if served else start_step
    if start_step:
        examples_trained = run_identity.examples_trained(placement.run_json, start_step, batch)
        if examples_trained != start_step * batch:
            logger.info("the data resumes after the %d examples steps 1..%d trained on at their "
                        "own batch sizes (not %d x %d)", examples_trained, start_step,
                        start_step, batch)
    return InputContext.create(
        start_step=start_step, examples_trained=examples_trained,
        global_batch_size=batch,
        num_replicas=placement.replicas, num_input_pipelines=placement.input_workers,
        input_pipeline_id=placement.pipeline_index if placement.input_workers > 1 else 0,
        seed=placement.seed if seeded else None, shard_policy=shard_policy,
        deterministic=placement.deterministic)


def train_dataset(task: Task, context: InputContext) -> tf.data.Dataset:
    """`task.train_dataset(context)`, checked, starting at `context.start_step`,
    sharded as `context.shard_policy` says (the skip arithmetic assumes it)."""
    dataset = _build(task, "train_dataset", context)
    where = f"{_name(task)}.train_dataset"
    _check_batch_size(dataset, where, context.global_batch_size, exact=True)
    cardinality = tf.get_static_value(dataset.cardinality())  # None while traced (ps workers)
    if cardinality is not None and cardinality >= 0:
        raise ConfigError(
            f"{where} ends after {cardinality} batches, and training runs by steps; "
            "add .repeat() before batching")
    examples = context.unread_examples_to_skip
    if examples:
        batches, rest = divmod(examples, context.global_batch_size)
        if rest and context.num_input_pipelines == 1:
            # The batch size changed on resume and the examples trained on end
            # inside a batch of the new size: skip them one by one.
            logger.info("%s does not read context.start_step: skipping the %d examples already "
                        "trained on (read it and skip before decoding to make resuming "
                        "cheaper)", where, examples)
            dataset = dataset.unbatch().skip(examples).batch(context.global_batch_size,
                                                             drop_remainder=True)
        else:
            # Whole batches only: under file/off sharding a step takes 1/W of
            # one, and a start step that W does not divide resumes at the batch
            # before.
            logger.info("%s does not read context.start_step: skipping the %d batches already "
                        "trained on (read it and skip before decoding to make resuming "
                        "cheaper)", where, batches)
            dataset = dataset.skip(batches)
    return _with_run_options(dataset, context, where)


def probe_dataset(task: Task, context: InputContext,
                  trained_on: tf.data.Dataset) -> Optional[tf.data.Dataset]:
    """`task.probe_dataset(context)`: the train data built afresh for the
    input-rate probe, or None where there is none. Never `trained_on`, the
    run's own pipeline, nor a failure of the run: a probe that cannot be
    built is no probe (the input-wait share alone decides then)."""
    try:
        with task_failures.calling(task, "probe_dataset"):
            dataset = task.probe_dataset(context)
    except Exception as error:  # the task's own code, built at a point the run did not choose
        logger.debug("no input-rate probe: %s.probe_dataset failed (%s)", _name(task), error)
        return None
    if not isinstance(dataset, tf.data.Dataset) or dataset is trained_on:
        return None
    return dataset


def eval_dataset(task: Task, context: InputContext) -> tf.data.Dataset:
    """`task.eval_dataset(context)`, checked: one pass, batches of at most the global batch."""
    dataset = _build(task, "eval_dataset", context)
    where = f"{_name(task)}.eval_dataset"
    _check_batch_size(dataset, where, context.global_batch_size, exact=False)
    if tf.get_static_value(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
        raise ConfigError(f"{where} never ends, and an evaluation is one pass over it; "
                          "drop its .repeat()")
    return _with_run_options(dataset, context, where)


def _with_run_options(dataset: tf.data.Dataset, context: InputContext,
                      where: str) -> tf.data.Dataset:
    """The run's shard policy and `--deterministic` merged into the task's own
    options, never loosening them (`inputs.with_run_options`): a task's
    pipeline comes out in the order it asks for, so a seeded shuffle after a
    parallel map resumes exactly. The built-in task's pipelines applied
    `--deterministic=false` themselves (`inputs.train_batches`)."""
    try:
        return inputs.with_run_options(dataset, context.shard_policy, context.deterministic,
                                       where=where)
    except inputs.InputError as error:
        raise ConfigError(str(error)) from None


def _build(task: Task, method: str, context: InputContext) -> tf.data.Dataset:
    with task_failures.calling(task, method):
        dataset = getattr(task, method)(context)
    if dataset is None and method == "eval_dataset":
        raise ConfigError(
            f"{_name(task)}.eval_dataset(context) returned None, so there is nothing to "
            f"evaluate; use --mode=train, or give {_name(task)} `has_eval = False` when its "
            "data has no eval split")
    if not isinstance(dataset, tf.data.Dataset):
        raise ConfigError(f"{_name(task)}.{method}(context) returned "
                          f"{type(dataset).__name__}, not a tf.data.Dataset")
    return dataset


def _check_batch_size(dataset: tf.data.Dataset, where: str, global_batch_size: int, *,
                      exact: bool) -> None:
    """Every component's leading dimension is the global batch (exact) or at most it."""
    for spec in tf.nest.flatten(dataset.element_spec):
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank == 0:
            raise ConfigError(
                f"{where} yields unbatched elements ({spec}); batch them: "
                f".batch(context.global_batch_size{', drop_remainder=True' if exact else ''})")
        size = shape[0]
        if exact and size is None:
            raise ConfigError(
                f"{where}'s batches have no fixed size; batch with "
                f".batch(context.global_batch_size, drop_remainder=True)")
        if size is not None and (size != global_batch_size if exact else size > global_batch_size):
            raise ConfigError(
                f"{where} yields batches of {size}, and the run's global batch is "
                f"{global_batch_size}; batch with context.global_batch_size")


def pipeline_index(role: tf_config.Role) -> int:
    """This worker's index among the input pipelines (a `chief` job comes first)."""
    if role.task_type == "chief":
        return 0
    return role.task_index + (1 if "chief" in role.cluster else 0)


def _name(task: Task) -> str:
    return type(task).__name__
