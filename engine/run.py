"""One run, end to end: the library function behind `bin/train`.

The order is the point. Everything that can be wrong with the request is
checked before anything is built or written (names, devices, batch
divisibility, data files, `model_dir`), so a mistake costs one line and
leaves no directory behind::

    check names, devices, data, model_dir        # fails fast, writes nothing
    strategy = build(...)                        # logical CPUs made first
    with strategy.scope(): model, optimizer, global_step
    restore the latest checkpoint in model_dir   # "resuming from ckpt-N"
    distribute datasets (skipping the batches already trained on)
    Controller(...).train / .evaluate
    write metrics.json
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

import collectives
import inputs
import models
from collectives import device_names
from engine import checkpointing, cluster, devices, optimizers, precision, preemption, strategies
from engine import ps_trainer, tpu
from engine.config import RunConfig
from engine.controller import Controller
from engine.errors import ClusterFailure, ConfigError
from engine.evaluator import Evaluator
from engine.summaries import SummaryWriter
from engine.task import LossFn
from engine.trainer import Trainer

logger = logging.getLogger("engine")

#: Builds the model(s) inside `strategy.scope()`: (input_shape, num_classes) → model.
ModelFn = Callable[[tuple, int], Any]


def _check_model_dir(path: str) -> None:
    """Refuses a `model_dir` that cannot be written, before anything is created."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--model_dir={path} is a file; name a directory")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--model_dir={path} cannot be written ({existing} is not a writable directory); "
            "choose a directory you can write to"
        )


def _resolve_mode(config: RunConfig, has_eval: bool, role: cluster.Role) -> str:
    if role.is_evaluator:
        if not has_eval:
            raise ConfigError(f"the evaluator task needs an eval split, and "
                              f"--dataset={config.dataset} has none")
        return "continuous_evaluate"
    # In a cluster the sidecar evaluator evaluates; the workers train.
    default = "train_and_evaluate" if has_eval and not role.in_cluster else "train"
    mode = config.mode or default
    if mode != "train" and not has_eval:
        raise ConfigError(
            f"--mode={mode} needs an eval split, and --dataset={config.dataset} has none; "
            "use --mode=train"
        )
    return mode


def _input_workers(config: RunConfig, role: cluster.Role) -> int:
    """Workers the input is sharded over by `experimental_distribute_dataset`."""
    if config.strategy != "multi_worker" or not role.in_cluster or role.is_evaluator:
        return 1
    return role.num_workers


def _describe_split(split) -> str:
    files = getattr(split, "files", None)
    return f"{len(files)} files" if files is not None else f"{len(split)} examples"


# How a collective reports a peer that died or stopped answering mid-step.
_PEER_LOST = (tf.errors.UnavailableError, tf.errors.CancelledError,
              tf.errors.DeadlineExceededError, tf.errors.AbortedError, tf.errors.InternalError)


def _write_metrics(path: str, payload: dict) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(temporary, path)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the checks found; nothing in it has touched TensorFlow's runtime."""

    role: cluster.Role
    devices: list
    collective: collectives.Collective
    splits: inputs.Splits
    mode: str
    latest_checkpoint: Optional[str]
    tpu_resolver: Any = None  # --strategy=tpu: the initialized TPU's resolver
    intra_op_threads: Optional[int] = None  # None: TensorFlow's default pool


def _check(config: RunConfig, model_fn: Optional[ModelFn]) -> _Plan:
    """Every check that can fail, before anything is built or written."""
    role = cluster.current_role()
    if role.task_type == "ps" and config.strategy != "parameter_server":
        raise ConfigError(
            "TF_CONFIG makes this process a ps task, which only --strategy=parameter_server "
            f"uses, but --strategy={config.strategy}; use --strategy=parameter_server"
        )
    if role.in_cluster and not role.is_evaluator and config.strategy not in (
            "multi_worker", "parameter_server"):
        raise ConfigError(
            f"TF_CONFIG describes a cluster but --strategy={config.strategy}; "
            "use --strategy=multi_worker (or parameter_server), or unset TF_CONFIG"
        )
    if config.strategy == "multi_worker" and "ps" in role.cluster:
        raise ConfigError(
            "TF_CONFIG has ps tasks, which --strategy=multi_worker does not use; "
            "use --strategy=parameter_server, or drop the ps job (bin/launch --num_ps=0)"
        )
    if config.strategy == "parameter_server" and not role.is_evaluator:
        ps_trainer.check(role, mode=config.mode, jit_compile=getattr(config, "jit_compile", False))
    tpu_resolver, tpu_cores = None, 0
    if config.strategy == "tpu" and not role.is_evaluator:
        tpu_resolver, tpu_cores = tpu.connect(config.tpu)  # bounded; refuses without a TPU
    device_names = devices.parse_devices(config.devices)
    if role.is_evaluator:
        device_names = device_names[:1]  # the sidecar evaluates on one device
        replicas = 1
    else:
        replicas = strategies.num_replicas(config.strategy, device_names,
                                           num_workers=role.num_workers, tpu_cores=tpu_cores)
    if config.global_batch_size % replicas:
        raise ConfigError(
            f"--global_batch_size={config.global_batch_size} does not divide by the "
            f"{replicas} replicas; use a multiple of {replicas}, e.g. "
            f"{max(replicas, config.global_batch_size // replicas * replicas)}"
        )
    # Logical CPU devices (and the thread pools) must be set up before anything
    # else touches TensorFlow.
    devices.prepare_devices(device_names)
    intra_op_threads = devices.configure_threads(device_names, config.intra_op_threads)
    collective = collectives.create(
        strategies.collective_name(config.strategy, config.collective, device_names,
                                   num_packs=config.num_packs, pack_bytes=config.pack_bytes,
                                   gradient_dtype=config.gradient_dtype),
        devices=device_names,
        num_packs=config.num_packs,
        pack_bytes=config.pack_bytes,
        gradient_dtype=config.gradient_dtype,
        reduce_device=config.reduce_device or None,
    )
    if model_fn is None:
        models.check(config.model)
    optimizers.check(config.optimizer)
    splits = inputs.load(config.dataset, data_dir=config.data_dir, seed=config.seed,
                         image_size=config.image_size, eval_fraction=config.eval_fraction)
    if model_fn is None:
        models.check(config.model, splits.input_shape)  # e.g. mobilenet_v2 needs >= 32x32
    input_workers = _input_workers(config, role)
    shard_policy = inputs.resolve_shard_policy(splits.train, config.auto_shard_policy,
                                               input_workers)
    if input_workers > 1:
        logger.info("%s: input sharded by %s over %d workers (%s)", role.name, shard_policy,
                    input_workers, _describe_split(splits.train))
    mode = _resolve_mode(config, splits.eval is not None, role)
    _check_model_dir(config.model_dir)
    if role.in_cluster and not role.is_evaluator:
        cluster.check_port_free(role)
    latest = tf.train.latest_checkpoint(config.model_dir) if os.path.isdir(config.model_dir) else None
    if mode == "evaluate" and not latest:
        raise ConfigError(
            f"--mode=evaluate found no checkpoint in --model_dir={config.model_dir}; "
            "train first or point --model_dir at a trained run"
        )
    return _Plan(role, device_names, collective, splits, mode, latest, tpu_resolver,
                 intra_op_threads)


def run(
    config: RunConfig,
    *,
    loss_fn: Optional[LossFn] = None,
    model_fn: Optional[ModelFn] = None,
    on_loop_end: Optional[Callable[[int, dict], None]] = None,
) -> dict:
    """Trains and/or evaluates as `config` says; returns what metrics.json holds.

    `loss_fn` and `model_fn` replace the default classification loss and the
    `--model` registry lookup, for custom steps (see `examples/`).
    `on_loop_end(step, metrics)` is called after every train loop (e.g. by
    `engine.benchmarking` to time loops from outside).

    In a `TF_CONFIG` cluster only the chief writes to `model_dir`; the other
    workers save into temporary directories (saving is collective) that are
    removed at the end, and an `evaluator` task evaluates each new checkpoint.

    Raises:
      ConfigError: the request cannot be carried out (nothing was written).
      Preempted: on SIGTERM or Ctrl-C, after saving a checkpoint at the step reached.
      KeyboardInterrupt: on a second Ctrl-C, without saving.
    """
    plan = _check(config, model_fn)
    role, splits = plan.role, plan.splits
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()

    if config.strategy == "parameter_server" and role.task_type in ("worker", "ps"):
        return ps_trainer.serve(role)  # until stopped: the chief trains

    # --- Build. ---
    if role.is_evaluator:
        strategy = strategies.build("one_device", plan.devices)
    else:
        strategy = strategies.build(
            config.strategy, plan.devices,
            communication=strategies.communication_options(
                config.collective, pack_bytes=config.pack_bytes,
                timeout_seconds=config.collective_timeout),
            role=role, startup_timeout=config.startup_timeout, tpu_resolver=plan.tpu_resolver,
        )
    logger.info(
        "%s%s over %d replica(s) [%s], collective %s, global batch %d (%d per replica)%s",
        "" if not role.in_cluster else f"{role.name}: ",
        config.strategy if not role.is_evaluator else "evaluator",
        strategy.num_replicas_in_sync, device_names.short_list(plan.devices),
        "none" if role.is_evaluator else plan.collective.describe(), config.global_batch_size,
        config.global_batch_size // strategy.num_replicas_in_sync,
        f", {plan.intra_op_threads} intra-op thread(s) per op" if plan.intra_op_threads else "",
    )
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        with precision.model_policy(config.mixed_precision):
            if model_fn is not None:
                model = model_fn(splits.input_shape, splits.num_classes)
            else:
                model = models.build(
                    config.model, input_shape=splits.input_shape, num_classes=splits.num_classes
                )
        build_optimizer = optimizers.build_fused if config.fused_optimizer else optimizers.build
        optimizer = precision.wrap_optimizer(
            build_optimizer(config.optimizer, config.learning_rate), config.mixed_precision)
        global_step = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="global_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        # Slots exist before the restore, so it restores them at once.
        optimizer.build(model.trainable_variables)

    eval_dataset = None
    if plan.mode != "train":
        eval_dataset = inputs.eval_batches(
            splits.eval, global_batch_size=config.global_batch_size,
            shard_policy=config.auto_shard_policy, num_workers=_input_workers(config, role),
            deterministic=config.deterministic)
    if role.is_evaluator:
        return evaluate_each_checkpoint(
            config, strategy=strategy, model=model, global_step=global_step,
            evaluator=Evaluator(strategy=strategy, model=model, loss_fn=loss_fn,
                                eval_dataset=eval_dataset))

    # Workers other than the chief take part in saving, into a directory of their own.
    write_dir = (config.model_dir if role.is_chief
                 else checkpointing.worker_save_dir(config.model_dir, role.name))
    checkpoint, manager = checkpointing.create(
        model=model, optimizer=optimizer, global_step=global_step,
        directory=write_dir, max_to_keep=config.max_checkpoints if role.is_chief else 1,
    )
    restored = checkpointing.restore(checkpoint, plan.latest_checkpoint, config.model_dir)
    start_step = int(global_step.numpy())
    if restored:
        logger.info("resuming from %s at step %d", restored, start_step)

    trainer = None
    if plan.mode != "evaluate" and config.strategy == "parameter_server":
        trainer = ps_trainer.ParameterServerTrainer(
            strategy=strategy, model=model, optimizer=optimizer, train_split=splits.train,
            global_batch_size=config.global_batch_size, global_step=global_step,
            num_workers=len(role.cluster["worker"]), loss_fn=loss_fn, seed=config.seed)
    elif plan.mode != "evaluate":
        trainer = Trainer(
            strategy=strategy, model=model, optimizer=optimizer, collective=plan.collective,
            train_dataset=inputs.train_batches(
                splits.train, global_batch_size=config.global_batch_size,
                seed=config.seed, start_step=start_step, shard_policy=config.auto_shard_policy,
                num_workers=_input_workers(config, role), deterministic=config.deterministic,
            ),
            global_batch_size=config.global_batch_size, global_step=global_step, loss_fn=loss_fn,
            jit_compile=config.jit_compile,
        )
    evaluator = None
    if eval_dataset is not None:
        evaluator = Evaluator(strategy=strategy, model=model, loss_fn=loss_fn,
                              eval_dataset=eval_dataset)

    # --- Run: only now does model_dir come into being. ---
    if role.is_chief:
        os.makedirs(config.model_dir, exist_ok=True)
    train_summaries = SummaryWriter(config.train_summary_dir) if role.is_chief else None
    eval_summaries = SummaryWriter(config.eval_summary_dir) if role.is_chief else None
    stop_request = preemption.StopRequest(
        strategy if config.strategy == "multi_worker" else None).install()
    controller = Controller(
        global_step=global_step, trainer=trainer, evaluator=evaluator,
        steps_per_loop=config.steps_per_loop, checkpoint_manager=manager,
        checkpoint_interval=config.checkpoint_interval,
        summary_interval=config.summary_interval,
        train_summaries=train_summaries, eval_summaries=eval_summaries,
        global_batch_size=config.global_batch_size, stop_request=stop_request,
        profile_steps=config.profile_range if role.is_chief else None,
        profile_dir=config.train_summary_dir, on_loop_end=on_loop_end,
    )
    began = time.time()
    interrupted = False
    try:
        if plan.mode == "evaluate":
            controller.evaluate(config.eval_steps)
        else:
            if start_step >= config.train_steps:
                logger.info("already at step %d (--train_steps=%d): nothing to train",
                            start_step, config.train_steps)
            controller.train(
                config.train_steps,
                eval_interval=(config.eval_interval or config.train_steps)
                if plan.mode == "train_and_evaluate" else 0,
                eval_steps=config.eval_steps,
            )
    except preemption.Preempted:
        interrupted = True
        raise
    except _PEER_LOST as error:
        if config.strategy != "multi_worker":
            raise
        interrupted = True
        reason = str(error).strip().splitlines()[0][:160]
        raise ClusterFailure(
            f"{role.name} lost the cluster after step {controller.step} ({reason}); the last "
            f"checkpoint is {tf.train.latest_checkpoint(config.model_dir) or 'none'}: restart every "
            "task to resume from it (bin/launch --max_restarts does)"
        ) from None
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once, as asked
        interrupted = True
        logger.info("stopped without saving; the last checkpoint is %s",
                    tf.train.latest_checkpoint(config.model_dir) or "none")
        raise
    finally:
        stop_request.uninstall()
        for writer in (train_summaries, eval_summaries):
            if writer is not None:
                writer.close()
        if not role.is_chief:
            shutil.rmtree(write_dir, ignore_errors=True)
        summary = {
            "step": controller.step,
            "start_step": start_step,
            "resumed_from": restored,
            "mode": plan.mode,
            "interrupted": interrupted,
            "examples_per_second": round(controller.examples_per_second, 1),
            "num_replicas": strategy.num_replicas_in_sync,
            "collective": plan.collective.describe(),
            "wall_seconds": round(time.time() - began, 2),
            "config": config.as_dict(),
        }
        summary.update({f"train/{k}": v for k, v in controller.last_train_metrics.items()})
        summary.update({f"eval/{k}": v for k, v in controller.last_eval_metrics.items()})
        if role.is_chief:
            _write_metrics(config.metrics_path, summary)
    return summary


def evaluate_each_checkpoint(
    config: RunConfig, *, strategy, model, global_step: tf.Variable, evaluator: Evaluator
) -> dict:
    """The sidecar evaluator: evaluates every new checkpoint in `model_dir` as it
    appears, writes `summaries/eval` beside the chief's, and returns after the
    checkpoint of step `train_steps` (or after `eval_timeout` seconds with no
    new checkpoint)."""
    checkpoint = tf.train.Checkpoint(model=model, global_step=global_step)
    writer = SummaryWriter(config.eval_summary_dir)
    controller = Controller(global_step=global_step, evaluator=evaluator, eval_summaries=writer)
    last = {}
    try:
        for path in tf.train.checkpoints_iterator(
            config.model_dir, min_interval_secs=0.5, timeout=config.eval_timeout
        ):
            checkpoint.restore(path).expect_partial()
            logger.info("evaluating %s", path)
            last = controller.evaluate(config.eval_steps)
            if controller.step >= config.train_steps:
                break
        else:
            logger.info("no new checkpoint in %s for %ds; stopping", config.model_dir,
                        config.eval_timeout)
    finally:
        writer.close()
    return {"step": controller.step, **{f"eval/{k}": v for k, v in last.items()}}
