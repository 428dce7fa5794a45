"""FLOPs of one training step, counted in the step's own graph; and `mfu`.

The count comes from the code the trainer compiles, not from a formula: the
replica's forward and backward pass (`engine.loop.replica_step.replica_gradients`,
the function the trainer's loop runs on every replica) is traced once more
with the per-replica batch's static shape, and TensorFlow's graph profiler
(`tf.compat.v1.profiler`, public) adds up the float operations of every op
in that graph that registers a cost (MatMul, Conv2D and their gradients,
BiasAdd, elementwise ops...). So what the model really runs is counted: a
first layer's input gradient that is never computed is not (an MLP's step is
then a little under the textbook 6 x parameters x batch).

A step's FLOPs are that count x the replicas in sync, summed over the
objectives (each divided by its `every`). Not counted: the optimizer's update
and the all-reduce (elementwise, tens of FLOPs per parameter against
thousands per parameter and example), and ops whose shapes are unknown when
traced (a dimension other than the batch left None by the input pipeline).
With `--accumulation_steps` the micro-batches together do the arithmetic of
one pass over the replica's batch, which is what is traced.

`mfu` (model FLOPs utilization) = FLOPs per step x steps / seconds / the
devices' peak rate (`engine.runtime.hardware.peak`: one definition, a
datasheet's dense rate for known GPUs in the compute dtype, a measured matmul
rate elsewhere): the wall time of the loop, as `steps/s` takes it. Never
above 1: a loop faster than the peak says the peak is wrong, and no mfu is
reported then (a debug line says why). The
trainer's clock (`engine.observe.clock`) counts the FLOPs once, after the
second loop's timer (the first traces and compiles, and reports no `mfu`;
a run of one loop counts nothing), and reports `mfu` from the
second loop on; the progress line, TensorBoard, metrics.json and
`bin/bench_train` all divide by that same peak.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import time
from typing import Any, Callable, Optional

import tensorflow as tf

from tfloop.engine.loop.replica_step import replica_gradients
from tfloop.engine.loop.trainer import Trainer
from tfloop.engine.runtime import hardware

logger = logging.getLogger(__name__)


def replica_spec(element_spec: Any, per_replica_batch: int) -> Optional[Any]:
    """The dataset's element spec with the batch dimension set to the
    replica's batch; None when an element is not a plain tensor."""
    def fix(spec):
        if not isinstance(spec, tf.TensorSpec) or spec.shape.rank in (None, 0):
            raise TypeError(spec)
        return tf.TensorSpec([per_replica_batch, *spec.shape[1:]], spec.dtype)

    try:
        return tf.nest.map_structure(fix, element_spec)
    except TypeError:
        return None


def count(fn: Callable[[Any], Any], spec: Any) -> Optional[float]:
    """Float operations of one call of `fn(batch)`, traced at `spec`; None
    when it cannot be traced or counted (a custom step may not trace
    outside the loop): no count is better than a wrong one. Traced without
    autograph, as the engine's loops are: `replica_gradients` converts the
    user's code it calls (`engine.task.user_code`)."""
    if spec is None:
        return None
    began = time.perf_counter()
    tf_logger = tf.get_logger()
    level = tf_logger.level
    # The v1 profiler logs a deprecation warning of its own internals once per
    # process; nothing the user can act on.
    tf_logger.setLevel(logging.ERROR)
    try:
        graph = tf.function(fn, autograph=False).get_concrete_function(spec).graph
        options = (tf.compat.v1.profiler.ProfileOptionBuilder(
            tf.compat.v1.profiler.ProfileOptionBuilder.float_operation())
            .with_empty_output().build())
        # The profiler writes "N ops no flops stats due to incomplete shapes."
        # on sys.stderr (tfprof_logger) whatever its options: a debug line here.
        with contextlib.redirect_stderr(io.StringIO()) as said:
            flops = tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops
        if said.getvalue().strip():
            logger.debug("the FLOPs profiler said: %s", " ".join(said.getvalue().split()))
    except Exception as error:  # noqa: BLE001 -- a statistic, never a reason to fail the run
        logger.debug("could not count the step's FLOPs: %s", error)
        return None
    finally:
        tf_logger.setLevel(level)
    logger.debug("counted %d FLOPs per replica step in %.2fs", flops, time.perf_counter() - began)
    return float(flops) or None


#: The metric: a loop's fraction of the devices' peak rate. A measure of this
#: process's speed, not of the model (it differs by worker).
MFU = "mfu"


def mfu(flops_per_step: Optional[float], steps: int, seconds: float,
        peak_flops_per_second: Optional[float]) -> Optional[float]:
    """The fraction of the peak rate `steps` steps in `seconds` reached; None
    when it cannot be had, or when it would be above 1: then the peak is
    wrong (a measured one read low), and no number beats a wrong one."""
    if not flops_per_step or not peak_flops_per_second or seconds <= 0:
        return None
    fraction = flops_per_step * steps / seconds / peak_flops_per_second
    if fraction > 1 + 1e-9:
        logger.debug("mfu not reported: %.3g FLOP/s is %.2fx the devices' peak of %.3g "
                     "FLOP/s, so that peak is wrong", flops_per_step * steps / seconds,
                     fraction, peak_flops_per_second)
        return None
    return fraction


def of_trainer(trainer: Trainer) -> Optional[float]:
    """FLOPs of one step of the engine's `Trainer` (this process's replicas:
    the peak is its devices'; a cluster's fraction is the same on every
    worker); None when they cannot be counted."""
    replicas = len(hardware.local_devices(trainer.strategy))
    per_replica = trainer.global_batch_size // trainer.strategy.num_replicas_in_sync
    spec = replica_spec(trainer.element_spec, per_replica)
    total = 0.0
    for objective in trainer.objectives:
        flops = count(functools.partial(
            replica_gradients, objective.loss, trainer.model, variables=list(objective.variables),
            optimizer=objective.optimizer, global_batch_size=trainer.global_batch_size), spec)
        if flops is None:
            return None
        total += flops * replicas / objective.every
    return total
